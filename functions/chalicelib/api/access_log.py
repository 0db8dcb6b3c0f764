"""The API function's HTTP middleware: one access log line per request, our error shape on Chalice's
own refusals, and the console's security headers on every console answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from chalice import Response
from modelforge_logging import jsonlog

from chalicelib.api import console

log = logging.getLogger("modelforge.api")


def access_log(event: Any, get_response: Callable[[Any], Response]) -> Response:
    started = time.monotonic()
    response = get_response(event)
    if response.status_code >= 400 and isinstance(response.body, dict) and "Code" in response.body:
        # Chalice's own refusals (a method the path lacks, an unsupported media type) get our error shape too.
        code, message = _snake(response.body["Code"]), response.body.get("Message", "")
        if code == "method_not_allowed":
            message = f"{event.method} is not a method of this path; it has {response.headers.get('Allow', '')}"
        response.body = {"error": {"code": code, "message": message}}
    if console.is_console_path(event.path):
        # every console answer, Chalice's own refusals of a console route included (405, 415)
        for name, value in console.SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    log.info(
        "request",
        extra={
            "event": "http_request",
            "method": event.method,
            "path": event.context.get("resourcePath", event.path),
            "status": response.status_code,
            "duration_ms": jsonlog.monotonic_ms(started),
        },
    )
    return response


def _snake(name: str) -> str:
    """Chalice's error name as one of our codes: ``MethodNotAllowedError`` -> ``method_not_allowed``."""
    name = name.removesuffix("Error")
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
