"""Domain errors. app.py maps them to HTTP answers in one place.

A message never contains a secret or an echo of what the caller sent.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error the caller caused and can act on: a 4xx answer with a stable code."""

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        #: HTTP headers the answer carries (e.g. Retry-After)
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


def invalid_request(message: str, **details: Any) -> ApiError:
    return ApiError(400, "invalid_request", message, **details)


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what}_not_found", f"no such {what.replace('_', ' ')}")


def conflict(code: str, message: str) -> ApiError:
    return ApiError(409, code, message)


def rate_limited(code: str, message: str, retry_after_seconds: int) -> ApiError:
    """429 with the wait in the body and in ``Retry-After`` (whole seconds, at least 1)."""
    wait = max(1, int(retry_after_seconds))
    error = ApiError(429, code, message, retry_after_seconds=wait)
    error.headers["Retry-After"] = str(wait)
    return error


class GuardFailed(Exception):
    """A conditional write's guard did not hold: someone else moved first, or the state is
    not what the caller assumed. Raised by stores; services decide what it means."""
