"""The local push channel: API Gateway's WebSocket API on one port of 127.0.0.1.

``modelforge local up`` serves, on its channel port:

- WebSockets at ``/api/v1/agent/channel`` (``websockets``' sync server, a thread per connection).
  Each connection drives the app's Chalice handlers with API Gateway's events
  (``channel_events``): ``$connect`` once the handshake request is valid (an answer other than 200
  refuses it with that status, and nothing is recorded), ``$default`` per message, ``$disconnect``
  once it has closed, however it closed;
- the management API the control plane sends with (``channel_management``): ``POST`` and ``DELETE
  /@connections/{id}``.

The limits are API Gateway's (``ChannelLimits``): a connection lasts at most 2 h and is closed
after 10 min without a message from the client (code 1001, the reason says which); a frame over
32 KB or a message over 128 KB closes it with 1009; no compression, no server pings (API Gateway
sends none). The server's own bounds come first: at most ``max_connections`` connections of any
kind (the next is answered 503 ``server_busy`` without a thread), a request line and handshake
within ``handshake_seconds``, handshake headers of at most ``handshake_header_bytes`` (431).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import HTTPServer
from typing import Any
from urllib.parse import urlsplit

from modelforge_protocol.http_server import HardenedServer
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection, serve

from . import channel_events as events
from .channel_management import ManagementHandler

CHANNEL_PATH = "/api/v1/agent/channel"
log = logging.getLogger("modelforge.local.channel")
#: websockets' own logger: its warnings and errors only (not "server closing" and the like)
_ws_log = logging.getLogger("modelforge.local.channel.websockets")
_ws_log.setLevel(logging.WARNING)

_BUSY_BODY = json.dumps({"message": "too many connections; retry later"}).encode()
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n".encode()
    + _BUSY_BODY
)
#: How long a management POST waits for a connection whose ``$connect`` was accepted to finish its
#: handshake (a wake sent in that instant is delivered, not answered 410).
OPENING_WAIT_SECONDS = 5.0
#: How long a close waits for the client's closing frame.
CLOSE_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class ChannelLimits:
    """API Gateway's WebSocket limits, and this server's own bounds."""

    max_seconds: float = 2 * 3600.0
    idle_seconds: float = 600.0
    frame_bytes: int = 32 * 1024
    message_bytes: int = 128 * 1024
    max_connections: int = 1000
    handshake_seconds: float = 10.0
    handshake_header_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if min(self.max_seconds, self.idle_seconds, self.handshake_seconds) <= 0:
            raise ValueError("channel durations must be greater than 0")
        if min(self.frame_bytes, self.message_bytes, self.max_connections, self.handshake_header_bytes) < 1:
            raise ValueError("channel sizes and counts must be at least 1")


@dataclass
class _Channel:
    """One accepted connection (its ``$connect`` answered 200)."""

    context: events.ConnectionContext
    opened: threading.Event = field(default_factory=threading.Event)
    #: set once its ``$disconnect`` has been answered
    done: threading.Event = field(default_factory=threading.Event)
    connection: ServerConnection | None = None
    last_active_at: float = field(default_factory=time.time)


class ChannelServer(HardenedServer, HTTPServer):
    log = log
    request_queue_size = 128
    allow_reuse_address = True
    busy_response = _BUSY_RESPONSE
    busy_message = "channel connection refused: server busy"

    def __init__(
        self,
        host: str,
        port: int,
        handlers: dict[str, events.Handler],
        limits: ChannelLimits | None = None,
        *,
        stage: str = "api",
    ) -> None:
        self.limits = limits or ChannelLimits()
        self.init_hardening(
            max_connections=self.limits.max_connections, connection_timeout_seconds=self.limits.handshake_seconds
        )
        super().__init__((host, port), ManagementHandler)
        self._handlers = handlers
        self._stage = stage
        self._channels: dict[str, _Channel] = {}
        self._channels_lock = threading.Lock()
        self._thread_channel = threading.local()
        self._serving: threading.Thread | None = None
        # websockets' connection handling without its accept loop: this server accepts, counts and
        # routes; the handshake, framing and closing are websockets'
        self._placeholder = socket.socket()
        self._ws = serve(
            self._serve_channel,
            sock=self._placeholder,
            compression=None,
            process_request=self._check_request,
            process_response=self._connect,
            server_header=None,
            open_timeout=self.limits.handshake_seconds,
            ping_interval=None,
            close_timeout=CLOSE_TIMEOUT_SECONDS,
            max_size=(self.limits.message_bytes, self.limits.frame_bytes),
            logger=_ws_log,
        )

    # --- where it serves -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def channel_url(self) -> str:
        return f"ws://{self._authority}{CHANNEL_PATH}"

    @property
    def management_url(self) -> str:
        return f"http://{self._authority}"

    @property
    def _authority(self) -> str:
        host = str(self.server_address[0])
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self) -> None:
        self._serving = threading.Thread(target=self.serve_forever, name="channel-server", daemon=True)
        self._serving.start()

    def stop(self) -> None:
        """Refuse new connections, close the open ones (1001; each gets its ``$disconnect``), stop."""
        self._ws.socket_closed.set()  # handshakes still under way are refused 503
        if self._serving is not None:
            self.shutdown()
        with self._channels_lock:
            channels = list(self._channels.values())
        connections = [channel.connection for channel in channels if channel.connection is not None]
        if connections:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(connections))) as pool:
                for connection in connections:
                    pool.submit(connection.close, CloseCode.GOING_AWAY, "the local stack is stopping")
        _wait_all(channels, CLOSE_TIMEOUT_SECONDS + 3)  # each connection's thread sends its $disconnect
        self.server_close()  # what is left (a client that never answered the close) is cut off
        _wait_all(channels, 2.0)
        self._ws.shutdown_watcher.close()
        self._ws.shutdown()
        if self._serving is not None:
            self._serving.join(timeout=5)

    @property
    def connection_ids(self) -> list[str]:
        with self._channels_lock:
            return sorted(self._channels)

    # --- routing ---------------------------------------------------------------------------------

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        route = _route(request)
        if route is None:
            return  # gone, or out of time, before its request line
        if route == "management":
            super().finish_request(request, client_address)
            return
        self.pause_deadline()  # websockets bounds the handshake; the handler, the connection's life
        self._thread_channel.value = None
        try:
            self._ws.handler(request, client_address)
        finally:
            channel: _Channel | None = self._thread_channel.value
            self._thread_channel.value = None
            if channel is not None:
                self._disconnected(channel)

    # --- the WebSocket side ----------------------------------------------------------------------

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        size = sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items())
        if size > self.limits.handshake_header_bytes:
            limit = self.limits.handshake_header_bytes
            return connection.respond(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"headers exceed {limit} bytes\n")
        return None

    def _connect(self, connection: ServerConnection, request: Request, response: Response) -> Response | None:
        """After websockets accepted the handshake request: ``$connect`` decides."""
        if response.status_code != HTTPStatus.SWITCHING_PROTOCOLS:
            return None  # not a valid WebSocket handshake: refused without the app, as API Gateway does
        address = connection.remote_address
        context = events.ConnectionContext(
            connection_id=events.new_connection_id(),
            domain_name=self._authority,
            stage=self._stage,
            source_ip=str(address[0]) if address else "",
            user_agent=request.headers.get("User-Agent", ""),
            connected_at_ms=int(time.time() * 1000),
        )
        answer = self._invoke(events.connect_event(context, list(request.headers.raw_items())))
        status = events.status_of(answer)
        if status != HTTPStatus.OK:
            log.info("channel refused", extra={"event": "channel_refused", "status": status})
            body = answer.get("body") if isinstance(answer, dict) else None
            refusal = connection.respond(status, body if isinstance(body, str) else f"refused ({status})\n")
            if isinstance(body, str) and body.startswith("{"):
                del refusal.headers["Content-Type"]
                refusal.headers["Content-Type"] = "application/json"
            return refusal
        channel = _Channel(context)
        log.info("channel opened", extra={"event": "channel_opened", "connection_id": context.connection_id})
        with self._channels_lock:
            self._channels[context.connection_id] = channel
        self._thread_channel.value = channel
        return None

    def _serve_channel(self, connection: ServerConnection) -> None:
        """An open connection: each message to ``$default`` until it closes or reaches a limit."""
        channel: _Channel | None = self._thread_channel.value
        if channel is None:  # pragma: no cover - every open connection went through _connect
            connection.close(CloseCode.INTERNAL_ERROR, "not connected")
            return
        channel.connection = connection
        channel.opened.set()
        ends = time.monotonic() + self.limits.max_seconds
        while True:
            left = ends - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                message = connection.recv(timeout=min(self.limits.idle_seconds, left))
            except TimeoutError:
                if time.monotonic() >= ends:
                    reason = f"connection reached its maximum of {self.limits.max_seconds:g} s"
                else:
                    reason = f"idle: no message for {self.limits.idle_seconds:g} s"
                connection.close(CloseCode.GOING_AWAY, reason)
                return
            except ConnectionClosed:
                return
            channel.last_active_at = time.time()
            body = message if isinstance(message, str) else events.binary_as_text(message)
            self._invoke(events.message_event(channel.context, body))

    def _disconnected(self, channel: _Channel) -> None:
        with self._channels_lock:
            self._channels.pop(channel.context.connection_id, None)
        channel.opened.set()  # a POST waiting for it to open: it never will
        connection = channel.connection
        code = reason = None
        if connection is not None:
            code, reason = connection.close_code, connection.close_reason
        try:
            self._invoke(events.disconnect_event(channel.context, code, reason or ""))
        finally:
            channel.done.set()
        log.info("channel closed", extra={"event": "channel_closed", "connection_id": channel.context.connection_id,
                                          "code": code, "reason": reason or ""})  # fmt: skip

    def _invoke(self, event: dict[str, Any]) -> Any:
        """Call the route's handler as Lambda would; a handler that raises is a 500 answer."""
        route = event["requestContext"]["routeKey"]
        try:
            return self._handlers[route](event, None)
        except Exception as error:  # noqa: BLE001 - as Lambda: the invocation failed, the server goes on
            log.error("channel handler failed", extra={"event": "channel_handler_failed", "route": route,
                                                        "error": type(error).__name__})  # fmt: skip
            return {"statusCode": 500}

    # --- the management side ---------------------------------------------------------------------

    def _open(self, connection_id: str) -> ServerConnection | None:
        with self._channels_lock:
            channel = self._channels.get(connection_id)
        if channel is None:
            return None
        channel.opened.wait(OPENING_WAIT_SECONDS)
        return channel.connection

    def send(self, connection_id: str, text: str) -> bool:
        """One text message to the connection; False when it is not open."""
        connection = self._open(connection_id)
        if connection is None:
            return False
        encoded = text.encode()
        step = max(1, self.limits.frame_bytes // 4)  # characters: at most 4 bytes each in UTF-8
        try:
            if len(encoded) <= self.limits.frame_bytes:
                connection.send(text)
            else:  # one message in frames of at most frame_bytes, as API Gateway splits it
                connection.send([text[start : start + step] for start in range(0, len(text), step)])
        except ConnectionClosed:
            return False
        return True

    def close_connection_id(self, connection_id: str) -> bool:
        connection = self._open(connection_id)
        if connection is None:
            return False
        threading.Thread(
            target=connection.close, args=(CloseCode.NORMAL_CLOSURE, "closed by the control plane"), daemon=True
        ).start()
        return True

    def describe(self, connection_id: str) -> dict[str, Any] | None:
        with self._channels_lock:
            channel = self._channels.get(connection_id)
        if channel is None:
            return None
        context = channel.context
        return {
            "connectedAt": _iso(context.connected_at_ms / 1000),
            "identity": {"sourceIp": context.source_ip, "userAgent": context.user_agent},
            "lastActiveAt": _iso(channel.last_active_at),
        }


def _wait_all(channels: list[_Channel], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for channel in channels:
        channel.done.wait(max(0.0, deadline - time.monotonic()))


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


#: The longest request line read to route a connection (websockets' own line limit).
_MAX_REQUEST_LINE = 8192


def _route(sock: socket.socket) -> str | None:
    """``channel`` for a GET of the channel's path, else ``management``; None when the client went
    away (or was cut off at its deadline) before sending its request line. Nothing is consumed."""
    seen = b""
    while b"\n" not in seen and len(seen) < _MAX_REQUEST_LINE:
        try:
            seen = sock.recv(_MAX_REQUEST_LINE, socket.MSG_PEEK)
        except OSError:
            return None
        if not seen:
            return None
        if b"\n" not in seen:
            time.sleep(0.01)  # a partial line: wait for more (the connection's deadline bounds this)
    parts = seen.split(b"\n", 1)[0].split()
    if len(parts) == 3 and parts[0] == b"GET":
        try:
            path = urlsplit(parts[1].decode("ascii")).path
        except (UnicodeDecodeError, ValueError):
            return "management"
        if path == CHANNEL_PATH:
            return "channel"
    return "management"
