"""Domain errors: what went wrong, in the domain's words, with a stable code and no HTTP status.

``chalicelib/api/error_answers.py`` alone maps each kind to its HTTP status (``STATUS_OF``). A message never contains a
secret or an echo of what the caller sent.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """An error the caller caused and can act on, with a stable ``code``."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class Invalid(DomainError):
    """The request is malformed or breaks a rule of the API."""


class TooLarge(Invalid):
    """The request is larger than the API accepts."""


class Unauthenticated(DomainError):
    """No secret, or one that proves nothing."""


class Forbidden(DomainError):
    """A secret of the wrong kind or value for this operation."""


class NotFound(DomainError):
    pass


class Conflict(DomainError):
    """The current state does not allow this change (someone else moved first, or it is done)."""


class Gone(DomainError):
    """What the caller presents existed once and can never be used again (an expired token)."""


class RateLimited(DomainError):
    """Too many changes too quickly; ``retry_after_seconds`` says when to try again."""

    def __init__(self, code: str, message: str, retry_after_seconds: int) -> None:
        self.retry_after_seconds = max(1, int(retry_after_seconds))
        super().__init__(code, message, retry_after_seconds=self.retry_after_seconds)


def invalid_request(message: str, **details: Any) -> Invalid:
    return Invalid("invalid_request", message, **details)


def not_found(what: str) -> NotFound:
    return NotFound(f"{what}_not_found", f"no such {what.replace('_', ' ')}")


def conflict(code: str, message: str) -> Conflict:
    return Conflict(code, message)


class GuardFailed(Exception):
    """A conditional write's guard did not hold: someone else moved first, or the state is
    not what the caller assumed. Raised by stores; services decide what it means.

    ``failed`` says which parts of a multi-item write failed, when the store can tell (a
    transaction's items by position, or by the names a store gives them)."""

    def __init__(self, message: str = "", failed: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.failed = failed
