"""The push channel's Lambda side, as API Gateway's WebSocket API drives it: the app's three
handlers (found by route key), connection ids, and the events each route gets.

API Gateway calls the function of a route with a proxy event: ``requestContext`` (``routeKey``,
``eventType``, ``connectionId``, ``apiId``, ``stage``, ``domainName``, ...), the request's
``headers`` (``$connect``), the frame's ``body`` (``$default``), and the close code and reason
(``$disconnect``). Chalice's ``WebsocketEventSourceHandler`` reads exactly these
(``configure_from_api_id(apiId, stage)``, then a ``WebsocketEvent``), and its answer's ``statusCode``
decides a ``$connect``: 200 accepts, anything else refuses the handshake with that status.
"""

from __future__ import annotations

import base64
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

CONNECT, MESSAGE, DISCONNECT = "$connect", "$default", "$disconnect"
_EVENT_TYPES = {CONNECT: "CONNECT", MESSAGE: "MESSAGE", DISCONNECT: "DISCONNECT"}
#: What the local stack calls its WebSocket API (Chalice builds a management endpoint from it,
#: which the control plane does not use: it posts to MODELFORGE_CHANNEL_MANAGEMENT_URL).
LOCAL_API_ID = "local"

Handler = Callable[[dict[str, Any], Any], Any]


class NoChannelHandlers(Exception):
    """The app registers no WebSocket handler for one of the three routes."""


def handlers_of(module: ModuleType) -> dict[str, Handler]:
    """The app's handler for each route key, as Lambda invokes it: the module attribute Chalice's
    decorator returned (``app.channel_connect``), which wraps the user function."""
    app = module.app
    found: dict[str, Handler] = {}
    for route_key, config in app.websocket_handlers.items():
        handler = getattr(module, config.name, None)
        if callable(handler):
            found[route_key] = handler
    missing = sorted({CONNECT, MESSAGE, DISCONNECT} - set(found))
    if missing:
        raise NoChannelHandlers(f"the app has no WebSocket handler for {', '.join(missing)}")
    return found


def new_connection_id() -> str:
    """An id shaped like API Gateway's: 16 characters of URL-safe base64 (10 random bytes)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(10)).decode()


def status_of(answer: Any) -> int:
    """The status a handler's answer gives (Chalice's handler answers a dict; anything unreadable
    is a failed integration, 500)."""
    if isinstance(answer, Mapping):
        status = answer.get("statusCode", 200)
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
            return status
    return 500


@dataclass(frozen=True)
class ConnectionContext:
    """What every event of one connection carries."""

    connection_id: str
    domain_name: str
    stage: str
    source_ip: str
    user_agent: str
    #: when the connection was accepted, ms since the epoch (``connectedAt``)
    connected_at_ms: int

    def event(self, route_key: str, **extra: Any) -> dict[str, Any]:
        """The proxy event for ``route_key``; ``extra`` adds top-level fields (``headers``, ``body``)
        or, for ``request_context``, fields of ``requestContext``."""
        now = time.time()
        context: dict[str, Any] = {
            "routeKey": route_key,
            "eventType": _EVENT_TYPES[route_key],
            "extendedRequestId": uuid.uuid4().hex[:16],
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "messageDirection": "IN",
            "stage": self.stage,
            "connectedAt": self.connected_at_ms,
            "requestTimeEpoch": int(now * 1000),
            "identity": {"sourceIp": self.source_ip, "userAgent": self.user_agent},
            "requestId": str(uuid.uuid4()),
            "domainName": self.domain_name,
            "connectionId": self.connection_id,
            "apiId": LOCAL_API_ID,
            **extra.pop("request_context", {}),
        }
        return {"requestContext": context, "isBase64Encoded": False, **extra}


def connect_event(context: ConnectionContext, headers: list[tuple[str, str]]) -> dict[str, Any]:
    """``$connect``: the handshake's headers, as sent (``headers`` keeps the last value of a name
    given twice, ``multiValueHeaders`` every value, as API Gateway does)."""
    single: dict[str, str] = {}
    multi: dict[str, list[str]] = {}
    for name, value in headers:
        single[name] = value
        multi.setdefault(name, []).append(value)
    return context.event(CONNECT, headers=single, multiValueHeaders=multi)


def message_event(context: ConnectionContext, body: str) -> dict[str, Any]:
    """``$default``: one message. A binary one arrives base64-encoded as text, as the deployed
    integration's ``CONVERT_TO_TEXT`` content handling gives it."""
    return context.event(MESSAGE, body=body, request_context={"messageId": uuid.uuid4().hex[:16]})


def disconnect_event(context: ConnectionContext, code: int | None, reason: str) -> dict[str, Any]:
    """``$disconnect``: after the connection has closed (best effort, as on AWS)."""
    closed = {"disconnectStatusCode": code if code is not None else 1006, "disconnectReason": reason}
    return context.event(DISCONNECT, headers={}, multiValueHeaders={}, request_context=closed)


def binary_as_text(data: bytes) -> str:
    return base64.b64encode(data).decode()
