"""The push channel: tickets, connections, and what an agent may send on it.

An agent opens the channel with a short-lived, single-use ticket, never its node credential (on
AWS the channel's host differs from the API's). A ticket is minted inside a write the control
plane makes anyway (the enroll's node write, the heartbeat's update), stored only as its SHA-256,
and used up by the connection it opens. The channel carries hints only (``wake``, ``cancel``);
see docs/DISPATCH.md. Its state (tickets, connections) is ephemeral: never in the state log.
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol import schemas, strict_json
from modelforge_protocol.credentials import NODE_ID_HEADER, NODE_ID_RE, sha256_hex

from chalicelib.config.settings import Settings
from chalicelib.domain.errors import Forbidden, GuardFailed, Invalid, NotFound, TooLarge, Unauthenticated
from chalicelib.stores.contract import Stores

#: How long a ticket opens the channel (the issue's bound is 10 minutes).
TICKET_SECONDS = schemas.CHANNEL_TICKET_SECONDS
assert 0 < TICKET_SECONDS <= 600
_TICKET_RE = re.compile(schemas.CHANNEL_TICKET_PATTERN)
#: The codes the channel's WebSocket handlers answer with (not HTTP operations, so not in the
#: OpenAPI document: docs/API.md's channel section lists them).
CHANNEL_ERROR_CODES = (
    "channel_not_configured",
    "channel_ticket_missing",
    "channel_ticket_invalid",
    "channel_ticket_expired",
    "credential_revoked",
    "connection_id_invalid",
    "message_too_large",
    "message_invalid",
    "message_version_unsupported",
    "message_type_unsupported",
)
#: API Gateway's connection ids are short base64 text; anything else is not one of its events.
CONNECTION_ID_RE = re.compile(r"^[A-Za-z0-9_=+/-]{1,128}\Z")


@dataclass(frozen=True)
class Ticket:
    """A minted ticket: the secret for the answer, its hash and expiry for the node's item."""

    secret: str = field(repr=False)
    sha256: str = field(repr=False)
    expires_at: float


def mint(now: float) -> Ticket:
    secret = schemas.CHANNEL_TICKET_PREFIX + secrets.token_urlsafe(32)
    return Ticket(secret=secret, sha256=sha256_hex(secret), expires_at=round(now + TICKET_SECONDS, 3))


def _header(headers: Mapping[str, str], name: str) -> str:
    lowered = name.lower()
    return next((value for key, value in headers.items() if key.lower() == lowered), "") or ""


def ticket_invalid() -> Unauthenticated:
    return Unauthenticated("channel_ticket_invalid", "the channel ticket is not valid; get a new one")


def require_connection_id(connection_id: str) -> str:
    if not CONNECTION_ID_RE.fullmatch(connection_id or ""):
        raise Invalid("connection_id_invalid", "the event carries no valid connection id")
    return connection_id


def connect(stores: Stores, settings: Settings, headers: Mapping[str, str], connection_id: str, now: float) -> str:
    """Accept the channel connection of the node whose ticket the headers carry; the node id.

    The ticket is checked against a read first (an unauthenticated caller costs one read, never a
    write), then used up by one conditional write that records the connection: a ticket opens one
    connection at most, even when two connects race. Refusals: 401 (no ticket, a ticket that is not
    the node's, used or expired), 403 (the node's credential was revoked).
    """
    if not settings.channel_url:
        raise NotFound("channel_not_configured", "this control plane has no push channel")
    require_connection_id(connection_id)
    node_id = _header(headers, NODE_ID_HEADER).strip()
    scheme, _, ticket = _header(headers, "Authorization").partition(" ")
    ticket = ticket.strip()
    if not node_id or not ticket:
        raise Unauthenticated(
            "channel_ticket_missing", f"send 'Authorization: Bearer <channel ticket>' and {NODE_ID_HEADER}"
        )
    if scheme.lower() != "bearer" or not _TICKET_RE.fullmatch(ticket) or not NODE_ID_RE.fullmatch(node_id):
        raise ticket_invalid()
    digest = sha256_hex(ticket)
    node = stores.nodes.get(node_id)
    if node is None or not hmac.compare_digest(node.channel_ticket_sha256 or "", digest):
        raise ticket_invalid()
    if (node.channel_ticket_expires_at or 0) <= now:
        raise Unauthenticated("channel_ticket_expired", "the channel ticket expired; get a new one")
    if node.credential_state != "active":
        raise Forbidden("credential_revoked", "this node's credential was revoked; enroll the node again")
    try:
        stores.nodes.connect_channel(node_id, digest, connection_id, now)
    except GuardFailed:
        raise ticket_invalid() from None  # used by a racing connect, or revoked, meanwhile
    return node_id


def disconnect(stores: Stores, connection_id: str) -> str | None:
    """Forget the connection on its node if it is still the node's; the node id, or None."""
    node_id = stores.nodes.node_of_connection(require_connection_id(connection_id))
    if node_id is None:
        return None
    try:
        stores.nodes.disconnect_channel(node_id, connection_id)
    except GuardFailed:
        return None  # the node has a newer connection: keep it
    return node_id


def read_message(body: str | bytes | None) -> dict[str, Any]:
    """An agent's message: strict JSON, at most MAX_CHANNEL_MESSAGE_BYTES, version 1, a ``ping``
    (the only message an agent sends; it keeps the connection from idling out)."""
    raw = body.encode("utf-8") if isinstance(body, str) else (body or b"")
    if len(raw) > schemas.MAX_CHANNEL_MESSAGE_BYTES:
        raise TooLarge("message_too_large", f"a channel message is at most {schemas.MAX_CHANNEL_MESSAGE_BYTES} bytes")
    try:
        message = strict_json.loads(raw, max_depth=2, max_bytes=schemas.MAX_CHANNEL_MESSAGE_BYTES)
    except strict_json.StrictJsonError:
        raise Invalid("message_invalid", "a channel message is one JSON object") from None
    if not isinstance(message, dict):
        raise Invalid("message_invalid", "a channel message is one JSON object")
    if message.get("v") != schemas.CHANNEL_MESSAGE_VERSION or isinstance(message.get("v"), bool):
        raise Invalid(
            "message_version_unsupported", f"this control plane reads message version {schemas.CHANNEL_MESSAGE_VERSION}"
        )
    if message.get("type") != schemas.CHANNEL_PING:
        raise Invalid("message_type_unsupported", "an agent sends only 'ping' on the channel")
    return message
