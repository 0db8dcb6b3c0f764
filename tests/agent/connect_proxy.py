"""A small HTTP CONNECT proxy on 127.0.0.1: it records each request line and its headers, opens a
tunnel to the named host and port, and copies bytes both ways until either side closes. Any
request that is not a CONNECT is recorded and answered 405 (a forwarding proxy would see the
request in clear; the agent never asks one to)."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class ProxyRequest:
    line: str
    headers: dict[str, str]


@dataclass
class ConnectProxy:
    requests: list[ProxyRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def connects(self) -> list[str]:
        """The targets (host:port) of every CONNECT so far."""
        return [request.line.split()[1] for request in list(self.requests) if request.line.startswith("CONNECT ")]

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            self.requests.append(ProxyRequest(lines[0], headers))
            parts = lines[0].split()
            if len(parts) != 3 or parts[0] != "CONNECT":
                client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            host, _, port = parts[1].rpartition(":")
            try:
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
            except OSError:
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            with upstream:
                upstream.settimeout(None)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                pump = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
                pump.start()
                _copy(client, upstream)
                pump.join(timeout=5)


def _copy(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
