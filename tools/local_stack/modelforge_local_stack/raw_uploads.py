"""The emulator stores an S3 PUT's body as sent, whatever its ``Content-Type``.

S3 stores the bytes of a PUT as they arrive and keeps its ``Content-Type`` only as the object's
metadata. moto does not: its dispatcher reads an unsigned request's form-urlencoded body as UTF-8
text to guess the service (a presigned PUT carries no Authorization header), and loses it when the
bytes are not UTF-8 (the request then waits for bytes already read); werkzeug parses a body sent as
``application/x-www-form-urlencoded`` or ``multipart/form-data`` as a form, and moto stores what
the form parser left (nothing, or a field's name) instead of the bytes. ``curl --data-binary @file
URL`` sends that content type, so a result uploaded with it failed the work's SHA-256 check locally
and would pass on S3.

The emulator's middleware marks every S3 PUT (``mark``). For a marked request the dispatcher does
not read the body (it guesses S3 without it, as for any other content type) and werkzeug parses no
form, so moto reads the raw body and stores it, with the content type as sent.
"""

from __future__ import annotations

from typing import Any

#: The moto and werkzeug internals this module relies on (the emulator's canary test checks them).
MOTO_INTERNALS = (
    "moto.core.request.Request",
    "moto.moto_server.werkzeug_app.BackendRequest",
    "moto.moto_server.werkzeug_app.DomainDispatcherApplication._get_body",
    "werkzeug.wrappers.request.Request.want_form_data_parsed",
)

#: The environ key the middleware sets on an S3 PUT.
RAW_BODY = "modelforge.raw_body"
_PATCHED = "_modelforge_raw_put_bodies"


def mark(environ: dict[str, Any]) -> None:
    """Have this request's body read as sent, never parsed as a form."""
    environ[RAW_BODY] = True


def make_put_bodies_raw() -> None:
    """Patch moto's request class (once per process): see the module's docstring."""
    from moto.core.request import Request
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    if getattr(Request, _PATCHED, False):
        return
    inherited: Any = Request.want_form_data_parsed  # werkzeug's property: a form when there is a Content-Type
    read_body = DomainDispatcherApplication._get_body

    def want_form_data_parsed(self: Any) -> bool:
        return False if self.environ.get(RAW_BODY) else bool(inherited.fget(self))

    def _get_body(self: Any, environ: dict[str, Any]) -> str | None:
        return None if environ.get(RAW_BODY) else read_body(self, environ)

    Request.want_form_data_parsed = property(want_form_data_parsed)  # type: ignore[method-assign,assignment]
    DomainDispatcherApplication._get_body = _get_body  # type: ignore[method-assign]
    setattr(Request, _PATCHED, True)
