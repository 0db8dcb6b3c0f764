"""The worker's HTTP API on a unix socket or a loopback port (standard library ``http.server``).

``GET /v1/status`` and ``POST /v1/run``, JSON in and out. Bounded: a body needs one
``Content-Length`` of at most ``MAX_BODY_BYTES`` (413 before it is read; chunked bodies get 411);
each request must arrive whole within ``READ_TIMEOUT_SECONDS`` of its first byte being awaited
(headers and body together, so a client trickling bytes cannot hold a connection), an idle
keep-alive connection is closed after the same time; at most ``MAX_CONNECTIONS`` are served at
once, the next gets 503 ``server_busy`` at once. Every error is
``{"error": {"code", "message", "retryable"}}``, also for what ``http.server`` itself refuses.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import socketserver
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from modelforge_protocol import strict_json

from . import WORKER_PROTOCOL_VERSION, WORKER_VERSION
from .capabilities import Capability, describe, refuse_unavailable
from .config import LISTEN, Listen
from .errors import ListenFailed, WorkerError
from .jobs import JobRunner

log = logging.getLogger("modelforge.worker.http")

MAX_BODY_BYTES = 8 * 1024 * 1024
READ_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 32
MAX_JSON_DEPTH = 64
SOCKET_MODE = 0o660
_HTTP_ERROR_CODES = {
    400: "bad_request",
    408: "request_timeout",
    413: "payload_too_large",
    414: "uri_too_long",
    431: "headers_too_large",
    501: "method_not_implemented",
    505: "http_version_not_supported",
}
_BUSY = json.dumps(
    {"error": {"code": "server_busy", "message": "too many connections; retry shortly", "retryable": True}}
).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY)}\r\n\r\n".encode()
    + _BUSY
)


class WorkerApp:
    """What the HTTP layer serves: the capabilities and the one job runner."""

    def __init__(self, capabilities: list[Capability], jobs: JobRunner) -> None:
        self.capabilities = {capability.name: capability for capability in capabilities}
        self.jobs = jobs
        self.stopping = False
        self._requests = 0
        self._idle = threading.Condition()

    def request_started(self) -> None:
        with self._idle:
            self._requests += 1

    def request_finished(self) -> None:
        with self._idle:
            self._requests -= 1
            self._idle.notify_all()

    def wait_answered(self, timeout: float) -> bool:
        """Wait until every request being handled has been answered (idle keep-alive connections
        do not count); False after ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._requests == 0, timeout)

    def status(self) -> dict[str, Any]:
        listed = [describe(capability) for capability in self.capabilities.values()]
        return {
            "protocol_version": WORKER_PROTOCOL_VERSION,
            "worker_version": WORKER_VERSION,
            "healthy": not self.stopping and all(entry["available"] for entry in listed),
            "capabilities": listed,
        }

    def run(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            raise WorkerError(
                400, "invalid_request", 'the body must be a JSON object {"capability": ..., "input": {...}}'
            )
        name, payload = request.get("capability"), request.get("input")
        if not isinstance(name, str) or not name:
            raise WorkerError(400, "invalid_request", "capability is required (a string)")
        unknown = sorted(set(request) - {"capability", "input"})
        if unknown:
            raise WorkerError(400, "invalid_request", f"unknown fields: {', '.join(unknown)}")
        capability = self.capabilities.get(name)
        if capability is None:
            known = ", ".join(sorted(self.capabilities))
            raise WorkerError(404, "unknown_capability", f"no capability {name[:64]!r} here; this worker runs: {known}")
        if not isinstance(payload, dict):
            raise WorkerError(422, "invalid_input", "input is required (a JSON object)")
        if not capability.available:
            raise refuse_unavailable(capability)
        if self.stopping:
            raise WorkerError(503, "shutting_down", "the worker is stopping", retryable=True)
        return {"result": self.jobs.run(capability, payload)}


class _DeadlineReader(io.RawIOBase):
    """The connection's read side; every read fails with TimeoutError once ``deadline`` passed."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = time.monotonic() + READ_TIMEOUT_SECONDS

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "modelforge-runtime-worker"
    sys_version = ""
    server: _Server

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader, 64 * 1024)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + READ_TIMEOUT_SECONDS
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
        finally:
            app.request_finished()

    def _serve(self, app: WorkerApp, method: str) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/v1/status" and method in ("GET", "HEAD"):
                self._discard_body()
                self._answer(200, app.status())
            elif path == "/v1/run" and method == "POST":
                request = self._read_json()
                if isinstance(request, dict) and isinstance(request.get("capability"), str):
                    self._capability = request["capability"][:64]
                self._answer(200, app.run(request))
            elif path in ("/v1/status", "/v1/run"):
                self.close_connection = True
                allowed = "GET, HEAD" if path == "/v1/status" else "POST"
                raise WorkerError(405, "method_not_allowed", f"{path} accepts {allowed}", retryable=False)
            else:
                self.close_connection = True
                raise WorkerError(404, "route_not_found", "routes: GET /v1/status, POST /v1/run")
        except WorkerError as error:
            self._answer(error.status, error.body(), error=error.code)

    # --- reading --------------------------------------------------------------------------------

    def _content_length(self) -> int:
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            if self.headers["Transfer-Encoding"].strip().lower() == "chunked":
                raise WorkerError(411, "length_required", "send the body with a Content-Length, not chunked")
            raise WorkerError(501, "transfer_encoding_not_supported", "Transfer-Encoding is not supported")
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return 0
        raw = values[0].strip()
        if len(values) != 1 or not raw.isascii() or not raw.isdigit() or len(raw) > 12:
            self.close_connection = True
            raise WorkerError(400, "invalid_content_length", "Content-Length must be one non-negative integer")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is never read
            raise WorkerError(
                413, "payload_too_large", f"the body is {length} bytes; at most {MAX_BODY_BYTES} are accepted"
            )
        return length

    def _discard_body(self) -> None:
        length = self._content_length()
        if length:
            self._read_exactly(length)

    def _read_exactly(self, length: int) -> bytes:
        data = self.rfile.read(length)
        if data is None or len(data) != length:
            self.close_connection = True
            raise WorkerError(400, "incomplete_body", "the connection ended before the whole body arrived")
        return data

    def _read_json(self) -> Any:
        length = self._content_length()
        if self.headers.get("Content-Length") is None:
            self.close_connection = True
            raise WorkerError(411, "length_required", "POST /v1/run needs a Content-Length")
        body = self._read_exactly(length)
        try:
            return strict_json.loads(body, max_depth=MAX_JSON_DEPTH)
        except strict_json.TooDeep:
            raise WorkerError(400, "invalid_json", f"the body is nested deeper than {MAX_JSON_DEPTH} levels") from None
        except strict_json.StrictJsonError:
            raise WorkerError(400, "invalid_json", "the body is not valid JSON (UTF-8, no NaN or Infinity)") from None

    # --- writing --------------------------------------------------------------------------------

    def _answer(self, status: int, body: dict[str, Any], *, error: str | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        try:
            self.connection.settimeout(READ_TIMEOUT_SECONDS)  # a client that does not read cannot hold the thread
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
        log.info(f"{self.command} {fields['path']} {status}", extra=fields)

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


class _Bounded(socketserver.ThreadingMixIn):
    """At most ``MAX_CONNECTIONS`` connections at once; one more is answered 503 and closed."""

    daemon_threads = True
    block_on_close = False
    app: WorkerApp

    def init_bounds(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(BUSY_RESPONSE)
            except OSError:
                pass
            self.shutdown_request(request)  # type: ignore[attr-defined]
            log.warning("connection refused: too many connections", extra={"event": "server_busy"})
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

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
