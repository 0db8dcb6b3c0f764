"""The web console's files and the headers every console answer carries.

The console is static: an HTML page, ES modules and a style sheet in ``console_assets/`` beside
this module (Chalice packages ``chalicelib/`` whole, so they deploy with the API). What can be
served is the fixed list below, looked up by name: a request never names a path on disk. The
page talks to the admin API of the same origin; its security model is in docs/SECURITY.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from chalice import Response

from chalicelib.domain.errors import NotFound

ASSET_DIR = Path(__file__).with_name("console_assets")
#: The page, served at ``/console/`` only (``/console/index.html`` is an unknown name, as in the
#: OpenAPI document).
INDEX = "index.html"
#: Every file served at ``/console/<name>``, with its media type. Nothing else is ever read.
ASSETS: dict[str, str] = {
    "api.js": "text/javascript; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "dialogs.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "enroll.js": "text/javascript; charset=utf-8",
    "format.js": "text/javascript; charset=utf-8",
    "hardware.js": "text/javascript; charset=utf-8",
    "node_detail.js": "text/javascript; charset=utf-8",
    "gpu_health.js": "text/javascript; charset=utf-8",
    "readiness.js": "text/javascript; charset=utf-8",
    "refresh.js": "text/javascript; charset=utf-8",
    "signin.js": "text/javascript; charset=utf-8",
    "styles.css": "text/css; charset=utf-8",
    "work.js": "text/javascript; charset=utf-8",
    "work_detail.js": "text/javascript; charset=utf-8",
}
HTML = "text/html; charset=utf-8"

#: Scripts and styles only from this origin's files (no inline script or style, no eval), API
#: calls only to this origin, no frames, no forms posting anywhere, no <base>, and DOM sinks
#: that would parse HTML from a string refused outright (Trusted Types with no policy).
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)
#: On every console answer: the page, its files, the redirect to the page and every refusal of a
#: ``/console`` path (the app's middleware, the local server's own refusals, and in the deployed
#: stack API Gateway's gateway responses).
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # a new release's files are fetched again (revalidated), never used stale
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class ConsoleFile:
    """One file of the console as served: its text and media type."""

    body: str
    content_type: str


def is_console_path(path: str) -> bool:
    """Whether a request's path (or a route's) is the console's: ``/console`` and all below it."""
    return path == "/console" or path.startswith("/console/")


def page() -> ConsoleFile:
    """The page, served at ``/console/``."""
    return _read(INDEX, HTML)


def find(name: str) -> ConsoleFile | None:
    """The file ``/console/<name>`` serves: one of ``ASSETS``; None for any other name (the page
    included: its one address is ``/console/``)."""
    content_type = ASSETS.get(name)
    return None if content_type is None else _read(name, content_type)


@cache
def _read(name: str, content_type: str) -> ConsoleFile:
    """Read once per function instance, on the first request for it (not at cold start)."""
    return ConsoleFile((ASSET_DIR / name).read_text(encoding="utf-8"), content_type)


def answer(status: int, body: str | dict[str, Any], content_type: str, **extra: str) -> Response:
    headers: dict[str, str | list[str]] = {**SECURITY_HEADERS, "Content-Type": content_type, **extra}
    return Response(body=body, status_code=status, headers=headers)


def root_answer() -> Response:
    """``/`` is sent to the console (302 to the relative ``console/``, so that a stage prefix or a
    custom domain's base path is kept), rather than answered 404."""
    return answer(302, "", "text/plain; charset=utf-8", Location="console/")


def page_answer(path: str) -> Response:
    """The page at ``/console/``; ``/console`` is sent there, so that its files' relative URLs
    (and the API's, ``../api/v1/``) resolve under any stage prefix."""
    if not path.endswith("/"):
        return answer(308, "", "text/plain; charset=utf-8", Location="console/")
    return file_answer(page())


def file_answer(found: ConsoleFile | None) -> Response:
    if found is None:
        error = NotFound("console_file_not_found", "the console has no such file; open /console/")
        return answer(404, error.body(), "application/json")
    return answer(200, found.body, found.content_type)
