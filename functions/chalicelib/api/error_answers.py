"""Domain errors as JSON answers: the one mapping of each kind of error to its HTTP status.

Services raise domain errors (``chalicelib/domain/errors.py``) and never know a status; every route
of ``app.py`` is wrapped by ``answer_errors``, so nothing but a JSON error answer reaches a caller.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from chalice import Response

from chalicelib.config.settings import SettingsError
from chalicelib.domain.errors import (
    Conflict,
    DomainError,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    RateLimited,
    TooLarge,
    Unauthenticated,
)

log = logging.getLogger("modelforge.api")

#: The one mapping of domain errors to HTTP statuses (most specific kind first).
STATUS_OF: tuple[tuple[type[DomainError], int], ...] = (
    (TooLarge, 413),
    (Invalid, 400),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (Gone, 410),
    (RateLimited, 429),
)


def http_status(error: DomainError) -> int:
    """The status of ``error``'s kind; a kind this table does not know is the caller's fault (400)."""
    return next((status for kind, status in STATUS_OF if isinstance(error, kind)), 400)


def error_response(error: DomainError) -> Response:
    headers: dict[str, str | list[str]] = {}
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(error.retry_after_seconds)
    return Response(body=error.body(), status_code=http_status(error), headers=headers or None)


def answer_errors(view: Callable[..., Any]) -> Callable[..., Any]:
    """Map every failure of a view to a JSON error answer, never a traceback."""

    @functools.wraps(view)
    def wrapped(**kwargs: Any) -> Any:
        try:
            return view(**kwargs)
        except DomainError as error:
            return error_response(error)
        except SettingsError as error:
            log.error("configuration invalid", extra={"event": "configuration_invalid", "problems": error.problems})
            return Response(body={"error": {"code": "configuration_invalid", "message": str(error)}}, status_code=500)
        except Exception:
            log.exception("unhandled error", extra={"event": "internal_error"})
            return Response(
                body={"error": {"code": "internal_error", "message": "internal error; see the control-plane log"}},
                status_code=500,
            )

    return wrapped
