"""A whole-request deadline: connect, send, headers and body together, not per socket read.

Socket timeouts bound each read, so a server that trickles one byte at a time could hold a
request open forever. While a request runs under a ``Deadline``, every connection it uses is
enlisted (the session's connection classes do that, see ``POOL_CLASSES``); when the deadline
passes, a timer shuts those sockets down (``shutdown(SHUT_RDWR)``), which ends any blocked read
or write at once. The timer thread is cancelled and joined when the request ends: no thread
outlives its request.

Each connection keeps a duplicate of its socket's descriptor (``_guard``), because TLS wrapping
detaches the original socket object; shutting down either descriptor ends the one connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any, Self

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

TIMER_NAME = "modelforge-request-deadline"

_local = threading.local()


def _cut(connection: Any) -> None:
    guard = getattr(connection, "_guard", None)
    if guard is not None:
        with contextlib.suppress(OSError):
            guard.shutdown(socket.SHUT_RDWR)


class Deadline:
    """Use as ``with Deadline(seconds) as deadline:`` around one request on this thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._connections: list[Any] = []
        self._expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.name = TIMER_NAME
        self._timer.daemon = True

    @property
    def expired(self) -> bool:
        with self._lock:
            return self._expired

    def __enter__(self) -> Self:
        _local.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *_: object) -> None:
        _local.deadline = None
        self._timer.cancel()
        self._timer.join()

    def enlist(self, connection: Any) -> None:
        with self._lock:
            if not any(known is connection for known in self._connections):
                self._connections.append(connection)
            late = self._expired
        if late:  # connected after the deadline passed
            _cut(connection)

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            connections = list(self._connections)
        for connection in connections:
            _cut(connection)


def enlist(connection: Any) -> None:
    """Put ``connection`` under the deadline of the request running on this thread, if any."""
    deadline: Deadline | None = getattr(_local, "deadline", None)
    if deadline is not None:
        deadline.enlist(connection)


def _guarded(connection: Any, sock: socket.socket) -> socket.socket:
    connection._guard = sock.dup()
    enlist(connection)
    return sock


def _release(connection: Any) -> None:
    guard, connection._guard = connection._guard, None
    if guard is not None:
        guard.close()


class _Guarded:
    """Mixed into urllib3's connection classes: enlist every request under the thread's deadline."""

    _guard: socket.socket | None = None

    def _new_conn(self) -> socket.socket:
        return _guarded(self, super()._new_conn())  # type: ignore[misc]

    def request(self, *args: Any, **kwargs: Any) -> None:
        enlist(self)  # a kept-alive connection is reused without a new socket
        super().request(*args, **kwargs)  # type: ignore[misc]

    def close(self) -> None:
        try:
            super().close()  # type: ignore[misc]
        finally:
            _release(self)


class _GuardedHTTPConnection(_Guarded, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    pass


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


#: For ``PoolManager.pool_classes_by_scheme``: connections that enlist under a request's deadline.
POOL_CLASSES: dict[str, type[HTTPConnectionPool]] = {"http": _GuardedHTTPPool, "https": _GuardedHTTPSPool}
