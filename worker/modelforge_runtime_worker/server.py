"""The worker's HTTP API on a unix socket or a loopback port (standard library ``http.server`` on
the bottom layer's hardened base, ``modelforge_protocol.http_server``).

``GET /v1/status``, ``POST /v1/run`` and ``POST /v1/cancel``, JSON in and out. Only local programs:
a request with an ``Origin`` header (a browser's) is refused, on loopback TCP the ``Host`` must name
loopback (a DNS-rebound page sends its own name), and a POST needs ``Content-Type: application/json``
(which a page cannot send cross-origin without asking first). Bounded: a body needs one
``Content-Length`` of at most ``MAX_BODY_BYTES`` (413 before it is read; chunked bodies get 411);
each request must arrive whole within ``READ_TIMEOUT_SECONDS`` of its first byte being awaited
(headers and body together, so a client trickling bytes cannot hold a connection), an idle
keep-alive connection is closed after the same time; at most ``MAX_CONNECTIONS`` are served at
once, the next gets 503 ``server_busy`` at once. Every error is
``{"error": {"code", "message", "retryable"}}``, also for what ``http.server`` itself refuses.

This is the only part of the worker that knows HTTP status codes: ``STATUS`` maps the worker's
own errors (``errors.RunError``) to them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import socketserver
import stat
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from modelforge_protocol import http_server, strict_json
from modelforge_protocol.addresses import is_loopback_host
from modelforge_protocol.http_server import BodyRefused, Framing, HardenedServer, request_body_length

from .app import WorkerApp
from .config import LISTEN, Listen
from .errors import (
    Cancelled,
    CapabilityUnavailable,
    GpuSlotsFull,
    InvalidInput,
    InvalidRequest,
    JobFailed,
    JobTimedOut,
    ListenFailed,
    RunError,
    ShuttingDown,
    UnknownCapability,
    WorkerBusy,
)

__all__ = ["STATUS", "Listener", "WorkerApp", "WorkerError", "http_error"]

log = logging.getLogger("modelforge.worker.http")

MAX_BODY_BYTES = 8 * 1024 * 1024
READ_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 32
MAX_JSON_DEPTH = 64
SOCKET_MODE = 0o660

#: The status of each of the worker's own errors.
STATUS: dict[type[RunError], int] = {
    InvalidRequest: 400,
    UnknownCapability: 404,
    CapabilityUnavailable: 409,
    Cancelled: 409,
    InvalidInput: 422,
    JobFailed: 500,
    WorkerBusy: 503,
    GpuSlotsFull: 503,
    ShuttingDown: 503,
    JobTimedOut: 504,
}
#: Each route and the methods it accepts.
_ROUTES = {"/v1/status": "GET, HEAD", "/v1/run": "POST", "/v1/cancel": "POST"}
_HTTP_ERROR_CODES = {
    400: "bad_request",
    408: "request_timeout",
    413: "payload_too_large",
    414: "uri_too_long",
    431: "headers_too_large",
    501: "method_not_implemented",
    505: "http_version_not_supported",
}
#: A Host field: a name, an IPv4 address or a bracketed IPv6 address, and an optional port.
_HOST_FIELD = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?\Z")
#: Content-Length: one field of at most 12 digits (a repeated field is refused, even with one value).
_FRAMING = Framing(max_digits=12, repeated_identical_lengths=False)
#: The worker's answer to each framing refusal: status, code, message.
_REFUSALS = {
    http_server.TRANSFER_ENCODING_MALFORMED: (
        501,
        "transfer_encoding_not_supported",
        "Transfer-Encoding is not supported",
    ),
    http_server.CHUNKED: (411, "length_required", "send the body with a Content-Length, not chunked"),
    http_server.TRANSFER_ENCODING: (501, "transfer_encoding_not_supported", "Transfer-Encoding is not supported"),
    http_server.CONTENT_LENGTH_INVALID: (
        400,
        "invalid_content_length",
        "Content-Length must be one non-negative integer",
    ),
    http_server.TOO_LARGE: (413, "payload_too_large", "the body is {length} bytes; at most {limit} are accepted"),
}
_BUSY = json.dumps(
    {"error": {"code": "server_busy", "message": "too many connections; retry shortly", "retryable": True}}
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY)}\r\n\r\n".encode()
    + _BUSY
)


class WorkerError(Exception):
    """An answer other than 200, with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "retryable": self.retryable}}


def http_error(error: RunError) -> WorkerError:
    """The answer to one of the worker's own errors."""
    return WorkerError(STATUS[type(error)], error.code, error.message, retryable=error.retryable)


class _CutOff(Exception):
    """The connection passed its deadline while its request was read: nobody to answer."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "modelforge-runtime-worker"
    sys_version = ""
    server: _Server

    def handle_one_request(self) -> None:
        self.server.arm_deadline("request")  # the idle wait, the request line, headers and body
        self._started = time.monotonic()
        self._capability: str | None = None
        super().handle_one_request()

    # --- routes -------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def _route(self, method: str) -> None:
        app = self.server.app
        app.request_started()
        try:
            self._serve(app, method)
        except _CutOff:
            self.close_connection = True
        finally:
            app.request_finished()

    def _serve(self, app: WorkerApp, method: str) -> None:
        path = urlsplit(self.path).path
        try:
            self._check_caller()
            if path == "/v1/status" and method in ("GET", "HEAD"):
                self._discard_body()
                self._answer(200, app.status())
            elif path == "/v1/run" and method == "POST":
                request = self._read_json()
                if isinstance(request, dict) and isinstance(request.get("capability"), str):
                    self._capability = request["capability"][:64]
                self._answer(200, self._call(app.run, request))
            elif path == "/v1/cancel" and method == "POST":
                self._answer(200, self._call(app.cancel, self._read_json()))
            elif path in _ROUTES:
                self.close_connection = True
                raise WorkerError(405, "method_not_allowed", f"{path} accepts {_ROUTES[path]}", retryable=False)
            else:
                self.close_connection = True
                raise WorkerError(404, "route_not_found", "routes: GET /v1/status, POST /v1/run, POST /v1/cancel")
        except WorkerError as error:
            self._answer(error.status, error.body(), error=error.code)

    @staticmethod
    def _call(handler: Callable[[Any], dict[str, Any]], request: Any) -> dict[str, Any]:
        try:
            return handler(request)
        except RunError as error:
            raise http_error(error) from None

    def _check_caller(self) -> None:
        """Refuse what a browser page could send: an ``Origin`` (any: the worker serves no page), and
        on TCP a ``Host`` other than one loopback name (DNS rebinding points a foreign name here)."""
        if self.headers.get_all("Origin"):
            self.close_connection = True
            raise WorkerError(
                403, "origin_not_allowed", "requests with an Origin header are refused: no web page may call the worker"
            )
        if self.server.checks_host and not _loopback_host_field(self.headers.get_all("Host") or []):
            self.close_connection = True
            raise WorkerError(
                403,
                "host_not_allowed",
                "the Host header must name loopback: 127.0.0.1, localhost or [::1], with an optional port",
            )

    def _check_content_type(self) -> None:
        media_types = self.headers.get_all("Content-Type") or []
        if len(media_types) != 1 or media_types[0].split(";", 1)[0].strip().lower() != "application/json":
            self.close_connection = True  # the body is never read
            raise WorkerError(
                415, "unsupported_media_type", f"POST {urlsplit(self.path).path} needs Content-Type: application/json"
            )

    # --- reading --------------------------------------------------------------------------------

    def _content_length(self) -> int:
        try:
            return request_body_length(self.headers, MAX_BODY_BYTES, _FRAMING)
        except BodyRefused as refused:
            self.close_connection = True  # the body is never read
            status, code, message = _REFUSALS[refused.kind]
            raise WorkerError(status, code, message.format(length=refused.length, limit=refused.limit)) from None

    def _discard_body(self) -> None:
        length = self._content_length()
        if length:
            self._read_exactly(length)
        self._request_read()

    def _read_exactly(self, length: int) -> bytes:
        data = self.rfile.read(length)
        if data is None or len(data) != length:
            self.close_connection = True
            raise WorkerError(400, "incomplete_body", "the connection ended before the whole body arrived")
        return data

    def _request_read(self) -> None:
        """No deadline while the application works; a connection already cut off gets no answer."""
        if not self.server.pause_deadline():
            raise _CutOff

    def _read_json(self) -> Any:
        length = self._content_length()
        if self.headers.get("Content-Length") is None:
            self.close_connection = True
            raise WorkerError(411, "length_required", f"POST {urlsplit(self.path).path} needs a Content-Length")
        self._check_content_type()
        body = self._read_exactly(length)
        self._request_read()
        try:
            return strict_json.loads(body, max_depth=MAX_JSON_DEPTH)
        except strict_json.TooDeep:
            raise WorkerError(400, "invalid_json", f"the body is nested deeper than {MAX_JSON_DEPTH} levels") from None
        except strict_json.StrictJsonError:
            raise WorkerError(400, "invalid_json", "the body is not valid JSON (UTF-8, no NaN or Infinity)") from None

    # --- writing --------------------------------------------------------------------------------

    def _answer(self, status: int, body: dict[str, Any], *, error: str | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.server.arm_deadline("responding")  # a client that does not read cannot hold the thread
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.close_connection = True
        fields = {
            "event": "http_request",
            "method": self.command,
            "path": urlsplit(self.path).path[:200],
            "status": status,
            "duration_ms": round((time.monotonic() - self._started) * 1000, 2),
        }
        if self._capability is not None:
            fields["capability"] = self._capability
        if error is not None:
            fields["error"] = error
        # the agent asks for the status at every heartbeat: an answered ask is routine (debug), so
        # an idle worker's log stays quiet; jobs, refusals and errors are info
        routine = self.command == "GET" and fields["path"] == "/v1/status" and status == 200
        log.log(logging.DEBUG if routine else logging.INFO, f"{self.command} {fields['path']} {status}", extra=fields)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What ``http.server`` refuses by itself (a malformed request line, headers too long, an
        unknown method), in the worker's JSON error shape."""
        self.close_connection = True
        if not hasattr(self, "_started"):
            self._started = time.monotonic()
        if not getattr(self, "command", None):
            self.command = "-"
        if not getattr(self, "path", None):
            self.path = "-"
        if getattr(self, "request_version", None) not in ("HTTP/1.0", "HTTP/1.1"):
            self.request_version = "HTTP/1.1"  # an answer with a status line and headers, even to a non-HTTP line
        error = WorkerError(code, _HTTP_ERROR_CODES.get(code, "bad_request"), message or "bad request")
        self._answer(code, error.body(), error=error.code)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug(format % args, extra={"event": "http_server"})

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Each request is logged once, by ``_answer``."""


# --- servers ---------------------------------------------------------------------------------


class _Bounded(HardenedServer):
    """The hardened base with the worker's limits (read when the server is made) and answers."""

    log = log
    busy_response = BUSY_RESPONSE
    busy_message = "connection refused: too many connections"
    close_working_connections = False  # a request whose job is aborted on stop still gets its 503
    #: whether requests must carry a loopback ``Host`` (TCP; no browser reaches a unix socket)
    checks_host = True
    app: WorkerApp

    def init_bounds(self) -> None:
        self.init_hardening(max_connections=MAX_CONNECTIONS, connection_timeout_seconds=READ_TIMEOUT_SECONDS)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets or breaks its connection: one line, never a traceback."""
        error = sys.exc_info()[1]
        log.warning(f"connection error ({type(error).__name__})", extra={"event": "connection_error"})


class _Server(_Bounded, HTTPServer):
    """TCP on a loopback address."""

    allow_reuse_address = True

    def __init__(self, listen: Listen) -> None:
        assert listen.host is not None and listen.port is not None
        self.address_family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        self.init_bounds()
        super().__init__((listen.host, listen.port), Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: it resolves a host name
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _UnixServer(_Bounded, socketserver.UnixStreamServer):
    """A unix socket, mode 0660, created with a umask that never leaves it wider."""

    checks_host = False

    def __init__(self, path: Path) -> None:
        self.init_bounds()
        self.server_name, self.server_port = "localhost", 0
        super().__init__(str(path), Handler)  # type: ignore[arg-type]

    def server_bind(self) -> None:
        previous = os.umask(0o117)
        try:
            super().server_bind()
        finally:
            os.umask(previous)
        os.chmod(self.server_address, SOCKET_MODE)  # type: ignore[arg-type]


class Listener:
    """The bound, listening socket (opened before the models load, so a taken address fails
    fast) and, once ``serve`` is called, the thread that accepts on it."""

    def __init__(self, listen: Listen) -> None:
        self.listen = listen
        self._inode: int | None = None
        self._thread: threading.Thread | None = None
        if listen.path is not None:
            _claim_socket_path(listen.path)
            try:
                listen.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
                self.server: _Server | _UnixServer = _UnixServer(listen.path)
            except OSError as error:
                raise ListenFailed(f"cannot listen on {listen.url}: {error.strerror or error} ({LISTEN})") from error
            self._inode = os.stat(listen.path).st_ino
        else:
            try:
                self.server = _Server(listen)
            except OSError as error:
                raise ListenFailed(f"cannot listen on {listen.url}: {error.strerror or error} ({LISTEN})") from error

    @property
    def address(self) -> str:
        """Where it listens, with the port a ``:0`` got."""
        if self.listen.path is not None:
            return f"unix://{self.listen.path}"
        host, port = cast(tuple[str, int], self.server.server_address)[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}"

    def serve(self, app: WorkerApp, poll_interval: float = 0.2) -> None:
        """Accept on a thread; ``close`` takes up to ``poll_interval`` to stop it."""
        self.server.app = app
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": poll_interval}, name="http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, close the listening socket and remove the socket file (when it is
        still the one this worker created)."""
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server.server_close()
        path = self.listen.path
        if path is not None and self._inode is not None:
            try:
                if os.lstat(path).st_ino == self._inode:
                    path.unlink()
            except FileNotFoundError:
                pass
            self._inode = None


def _loopback_host_field(fields: list[str]) -> bool:
    """Whether the request carried exactly one Host field, naming a loopback host."""
    if len(fields) != 1:
        return False
    match = _HOST_FIELD.match(fields[0].strip())
    return match is not None and is_loopback_host(match.group(1).strip("[]"))


def _claim_socket_path(path: Path) -> None:
    """A socket file left by a worker that is gone is removed; one that answers, or a path that is
    not a socket, is never touched."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ListenFailed(f"{path} exists and is not a socket; refusing to replace it ({LISTEN})")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # nothing answers: a stale socket
    except OSError as error:
        raise ListenFailed(
            f"cannot tell whether something listens on {path} ({error.strerror or error}); "
            f"refusing to replace it ({LISTEN})"
        ) from error
    else:
        raise ListenFailed(f"another process is listening on {path}; is a worker already running? ({LISTEN})")
    finally:
        probe.close()
    path.unlink(missing_ok=True)
    log.info("removed a stale socket file", extra={"event": "stale_socket_removed", "path": str(path)})
