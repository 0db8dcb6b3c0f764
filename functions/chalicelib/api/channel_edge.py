"""The push channel's edge: API Gateway WebSocket events in, ``{"statusCode": ...}`` answers out.

``app.py`` registers the three handlers (``channel_connect``, ``channel_message``,
``channel_disconnect``); this module reads their events and shapes their answers. A ``$connect``
answer other than 200 refuses the handshake with that status. Nothing here logs a ticket or a
header's value: a refusal's log line carries its code and status only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chalicelib.config.settings import Settings, SettingsError
from chalicelib.domain.errors import DomainError
from chalicelib.domain.timestamps import iso

if TYPE_CHECKING:
    from chalicelib.services.channel import Ticket

log = logging.getLogger("modelforge.api")


def channel_answer(settings: Settings, ticket: Ticket | None) -> dict[str, Any]:
    """An agent answer's ``features`` and ``channel`` block (with a channel configured and a
    ticket minted for this answer): the only place a ticket is ever shown."""
    answer: dict[str, Any] = {"features": settings.features}
    if settings.channel_url and ticket is not None:
        answer["channel"] = {"url": settings.channel_url, "ticket": ticket.secret, "expires_at": iso(ticket.expires_at)}
    return answer


def headers(event: Any) -> dict[str, str]:
    """The event's request headers (only ``$connect`` carries the agent's)."""
    found = event.to_dict().get("headers") or {}
    return {str(name): str(value) for name, value in found.items()} if isinstance(found, dict) else {}


def ws_answer(status: int, body: dict[str, Any] | None = None) -> dict[str, Any]:
    shaped: dict[str, Any] = {"statusCode": status}
    if body is not None:
        shaped["body"] = json.dumps(body, separators=(",", ":"))
    return shaped


def run(event_name: str, handle: Callable[[], object], status_of: Callable[[DomainError], int]) -> dict[str, Any]:
    """Run a handler's service call: 200 with one ``event_name`` log line (with the node id when the
    call returns one) when it succeeds; its failure as the answer and one log line otherwise (a
    domain error's code and status, never a secret)."""
    try:
        result = handle()
    except DomainError as error:
        status = status_of(error)
        log.info("channel refused", extra={"event": f"{event_name}_refused", "code": error.code, "status": status})
        return ws_answer(status, error.body())
    except SettingsError as error:
        log.error("configuration invalid", extra={"event": "configuration_invalid", "problems": error.problems})
        return ws_answer(500, {"error": {"code": "configuration_invalid", "message": str(error)}})
    except Exception:
        log.exception("unhandled error", extra={"event": "internal_error"})
        return ws_answer(
            500, {"error": {"code": "internal_error", "message": "internal error; see the control-plane log"}}
        )
    if event_name != "channel_message":  # a ping every 5 minutes per node: not worth a line each
        log.info(event_name, extra={"event": event_name, "node_id": result if isinstance(result, str) else None})
    return ws_answer(200)
