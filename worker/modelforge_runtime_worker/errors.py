"""The failures the worker answers with, and the ones it stops on.

Every HTTP error has the same shape, ``{"error": {"code", "message", "retryable"}}``: ``code`` is
stable (callers branch on it), ``message`` says what to change, ``retryable`` says whether the
same request may succeed later unchanged.
"""

from __future__ import annotations

from typing import Any


class WorkerError(Exception):
    """An answer other than 200, with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "retryable": self.retryable}}


def invalid_input(message: str) -> WorkerError:
    """The input of a run cannot be used as given: sending it again will not help."""
    return WorkerError(422, "invalid_input", message, retryable=False)


class ConfigurationInvalid(Exception):
    """Every problem with the configuration, each naming its variable; the worker exits 2."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        self.message = "invalid worker configuration: " + "; ".join(problems)
        super().__init__(self.message)


class ListenFailed(Exception):
    """The listening address cannot be taken (another worker answers there, or it is not a
    socket); the worker exits 3."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
