"""The hardened base of ModelForge's two standard-library HTTP servers (the local stack's API
server and the runtime worker's API): what a hostile or broken client cannot do to them.

- **Deadlines.** Every connection has one (TLS handshake, idle keep-alive wait, request line,
  headers and body all count; the application's own work does not: the handler pauses it). The
  serve loop shuts down connections past their deadline (``service_actions``), so a client that
  trickles bytes is cut off as surely as an idle one, without a timer thread per request.
- **A connection cap.** At most ``max_connections`` are served at once; the accept loop answers
  the next one with the server's ``busy_response`` (a 503) and closes it, and no thread starts.
- **Framing before reading.** ``request_body_length`` takes a body's length from exactly one
  valid ``Content-Length`` within the server's cap, before a byte of the body is read, and refuses
  every ``Transfer-Encoding`` (no chunked bodies, so no request smuggling).

Each server keeps its own answers: a ``BodyRefused`` names the rule broken (``kind``) and the
standard status, and the server words the error in its own API's shape.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

# --- framing ---------------------------------------------------------------------------------------

#: ``BodyRefused.kind``: what the request's framing got wrong.
TRANSFER_ENCODING_MALFORMED = "transfer_encoding_malformed"  # the field names no coding at all
CHUNKED = "chunked"
TRANSFER_ENCODING = "transfer_encoding"  # any other coding
CONTENT_LENGTH_INVALID = "content_length_invalid"
TOO_LARGE = "too_large"

_STATUS = {
    TRANSFER_ENCODING_MALFORMED: HTTPStatus.BAD_REQUEST,
    CHUNKED: HTTPStatus.LENGTH_REQUIRED,
    TRANSFER_ENCODING: HTTPStatus.NOT_IMPLEMENTED,
    CONTENT_LENGTH_INVALID: HTTPStatus.BAD_REQUEST,
    TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
}


class Headers(Protocol):
    def get_all(self, name: str, failobj: Any = None) -> list[Any] | Any: ...


class BodyRefused(Exception):
    """The request's body cannot be read safely; nothing of it was read. ``length``: the declared
    length (``TOO_LARGE`` only)."""

    def __init__(self, kind: str, limit: int, length: int | None = None) -> None:
        super().__init__(kind)
        self.kind, self.limit, self.length = kind, limit, length
        self.status = _STATUS[kind]


@dataclass(frozen=True)
class Framing:
    """How strictly ``Content-Length`` is read: at most ``max_digits`` ASCII digits, and whether
    the same value repeated in several fields is one length (RFC 9112 allows either)."""

    max_digits: int
    repeated_identical_lengths: bool


def request_body_length(headers: Headers, limit: int, framing: Framing) -> int:
    """The body's length (0 without one), or ``BodyRefused`` before any of it is read."""
    codings_fields = headers.get_all("Transfer-Encoding") or []
    if codings_fields:
        codings = ",".join(codings_fields).lower()
        if not codings.replace(",", "").strip(" \t"):
            raise BodyRefused(TRANSFER_ENCODING_MALFORMED, limit)
        raise BodyRefused(CHUNKED if "chunked" in codings else TRANSFER_ENCODING, limit)
    fields = [value.strip(" \t") for value in headers.get_all("Content-Length") or []]
    if not fields:
        return 0
    values = set(fields) if framing.repeated_identical_lengths else fields
    digits = re.compile(f"[0-9]{{1,{framing.max_digits}}}")
    if len(values) != 1 or not digits.fullmatch(fields[0]):
        raise BodyRefused(CONTENT_LENGTH_INVALID, limit)
    length = int(fields[0])
    if length > limit:
        raise BodyRefused(TOO_LARGE, limit, length)
    return length


# --- connections -------------------------------------------------------------------------------------


@dataclass
class Connection:
    """One accepted connection: the socket to shut down and when (None: the application works)."""

    sock: socket.socket
    client: str
    deadline: float | None
    phase: str
    reaped: bool = False


class HardenedServer(socketserver.ThreadingMixIn):
    """Mixed in before a ``socketserver`` server class: the connection cap and the deadlines.

    A subclass calls ``init_hardening`` before the server class's ``__init__``, sets ``log`` (its
    component's logger) and ``busy_response`` (the bytes of its 503, or None to close without
    answering, as a TLS server must), and overrides ``handle_error`` with its one log line. Its
    handler calls ``arm_deadline`` before each step of a request and ``pause_deadline`` when the
    request is read, before the application works.
    """

    daemon_threads = True
    block_on_close = False
    log: logging.Logger = logging.getLogger("modelforge.http")
    busy_response: bytes | None = None
    busy_message = "connection refused: server busy"
    #: Whether ``server_close`` also cuts off connections whose request the application is
    #: working on (False: they still get their answer, as a worker's aborted job does).
    close_working_connections = True

    def init_hardening(self, *, max_connections: int, connection_timeout_seconds: float) -> None:
        if connection_timeout_seconds <= 0 or max_connections < 1:
            raise ValueError("connection_timeout_seconds must be > 0 and max_connections >= 1")
        self.max_connections = max_connections
        self.connection_timeout_seconds = connection_timeout_seconds
        self._connections: dict[socket.socket, Connection] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._busy_refusals = 0
        self._busy_logged_at = 0.0

    def first_phase(self) -> str:
        """What a new connection does first (``handshake`` for a TLS server)."""
        return "request"

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet finished (what ``max_connections`` bounds)."""
        with self._lock:
            return len(self._connections)

    @property
    def current_connection(self) -> Connection | None:
        """The calling handler thread's connection."""
        record: Connection | None = getattr(self._local, "connection", None)
        return record

    def replace_socket(self, record: Connection, sock: socket.socket) -> None:
        """The connection now reads through ``sock`` (a TLS wrapper): the reaper shuts that down."""
        with self._lock:
            record.sock = sock

    # --- the cap -----------------------------------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        """Runs on the accept loop: count the connection in, or refuse it without a thread."""
        deadline = time.monotonic() + self.connection_timeout_seconds
        record = Connection(request, _client(client_address), deadline, self.first_phase())
        with self._lock:
            admitted = len(self._connections) < self.max_connections
            if admitted:
                self._connections[request] = record
        if not admitted:
            self._refuse_busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.forget(request)
            raise

    def _refuse_busy(self, request: socket.socket) -> None:
        """Answer without blocking the accept loop, and log at most once a second."""
        try:
            request.setblocking(False)
            if self.busy_response is not None:
                request.send(self.busy_response)  # fits in an empty send buffer
            for _ in range(16):  # what already arrived, so that closing does not reset the answer
                if not request.recv(64 * 1024):
                    break
        except OSError:
            pass
        self.shutdown_request(request)  # type: ignore[attr-defined]
        self._busy_refusals += 1
        now = time.monotonic()
        if now - self._busy_logged_at >= 1.0:
            self.log.warning(
                self.busy_message,
                extra={"event": "server_busy", "refused": self._busy_refusals, "max_connections": self.max_connections},
            )
            self._busy_refusals, self._busy_logged_at = 0, now

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._local.connection = self._connections.get(request)
        try:
            self.finish_request(request, client_address)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - as socketserver does; handle_error logs it as one line
            self.handle_error(request, client_address)  # type: ignore[attr-defined]
        finally:
            self.forget(request)
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def forget(self, request: socket.socket) -> None:
        with self._lock:
            self._connections.pop(request, None)

    # --- deadlines -----------------------------------------------------------------------------

    def arm_deadline(self, phase: str) -> None:
        """The calling connection's next step (writing, waiting, reading) must end in time."""
        record = self.current_connection
        if record is not None:
            with self._lock:
                record.deadline, record.phase = time.monotonic() + self.connection_timeout_seconds, phase

    def pause_deadline(self) -> bool:
        """The request is read: no deadline while the application works. False if it was already
        cut off (then there is nobody to answer)."""
        record = self.current_connection
        if record is None:
            return True
        with self._lock:
            record.deadline, record.phase = None, "app"
            return not record.reaped

    def service_actions(self) -> None:
        """Runs on the serve loop after each poll: shut down connections past their deadline."""
        now = time.monotonic()
        with self._lock:
            late = [
                c for c in self._connections.values() if not c.reaped and c.deadline is not None and now >= c.deadline
            ]
            for record in late:
                record.reaped = True
                _shut_down(record.sock)
        for record in late:
            self.log.info(
                "connection timed out",
                extra={"event": "connection_timeout", "client": record.client, "phase": record.phase},
            )

    def server_close(self) -> None:
        """Close the listening socket and shut down the connections (see ``close_working_connections``)."""
        super().server_close()
        with self._lock:
            for record in self._connections.values():
                if record.deadline is None and not self.close_working_connections:
                    continue
                record.reaped = True
                _shut_down(record.sock)


def _client(client_address: Any) -> str:
    """The peer's address for logs (a unix socket's peer has none)."""
    if isinstance(client_address, tuple) and client_address:
        return str(client_address[0])
    return "local"


def _shut_down(sock: socket.socket) -> None:
    """The socket's own shutdown, not SSLSocket's: it wakes a thread blocked on it, TLS or not."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
