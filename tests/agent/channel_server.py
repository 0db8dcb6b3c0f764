"""A real WebSocket server on 127.0.0.1 (``websockets``' sync server), standing in for the control
plane's channel: it records every handshake and message, and a test decides how it answers a
handshake (``answer``: None accepts, else an HTTP status and headers) and what it sends."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

CHANNEL_PATH = "/api/v1/agent/channel"
#: how a handshake is answered: None accepts it; else (status, extra headers)
Answer = Callable[[Request], tuple[int, dict[str, str]] | None]


def accept(_request: Request) -> None:
    return None


def poll(condition: Callable[[], Any], seconds: float = 10.0) -> Any:
    """Wait (polling, with a deadline) until ``condition()`` is truthy; return its value."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@dataclass
class ChannelServer:
    tls: ssl.SSLContext | None = None
    answer: Answer = accept
    #: the handler closes each connection at once with this code (None: keeps it open)
    close_at_once: int | None = None
    handshakes: list[Headers] = field(default_factory=list)
    received: list[str | bytes] = field(default_factory=list)
    connections: list[ServerConnection] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server: Server = serve(
            self._handle,
            "127.0.0.1",
            0,
            ssl=self.tls,
            process_request=self._process_request,
            compression=None,
            max_size=256 * 1024,
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.socket.getsockname()[1])

    @property
    def url(self) -> str:
        return f"{'wss' if self.tls is not None else 'ws'}://127.0.0.1:{self.port}{CHANNEL_PATH}"

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.handshakes.append(request.headers)
        answer = self.answer(request)
        if answer is None:
            return None
        status, headers = answer
        response = connection.respond(status, "refused\n")
        for name, value in headers.items():
            response.headers[name] = value
        return response

    def _handle(self, connection: ServerConnection) -> None:
        self.connections.append(connection)
        if self.close_at_once is not None:
            connection.close(self.close_at_once)
            return
        try:
            for message in connection:
                self.received.append(message)
        except Exception:  # noqa: BLE001, S110 - a client gone mid-message: nothing to record
            pass

    def send(self, message: str | bytes, connection: int = -1) -> None:
        self.connections[connection].send(message)

    def close(self) -> None:
        self._server.shutdown()
        self._server.socket.close()
