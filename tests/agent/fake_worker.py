"""Small fake runtime workers for the agent's tests: the standard library's http.server on a real
unix socket (or a real loopback port), answering ``GET /v1/status``, ``POST /v1/run`` and (when
given a ``cancel`` script; else 404 as a worker before cancel) ``POST /v1/cancel`` in the worker's
API shapes. Records every request."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import socketserver
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from modelforge_protocol.canonical import canonical_bytes

ECHO = {
    "name": "diagnostic.echo",
    "model": "builtin",
    "model_sha256": None,
    "device": "cpu",
    "available": True,
    "reason": None,
}
OCR = {
    "name": "ocr",
    "model": "rapidocr-3.10.0/PP-OCRv6-small",
    "model_sha256": "a" * 64,
    "device": "cpu",
    "available": True,
    "reason": None,
}
OCR_QUARANTINED = {**OCR, "available": False, "reason": "artifact_quarantined"}


def status_answer(
    *capabilities: dict[str, Any],
    protocol_version: Any = 1,
    healthy: bool | None = None,
    features: list[str] | None = None,
    slots: int | None = None,
) -> dict[str, Any]:
    """A worker's status; ``features`` (e.g. ``["cancel"]``) only when given, as a worker of 1.3.0
    has none; ``slots``: ``slots.total`` (with the ``slots`` feature), when given."""
    listed = list(capabilities) or [ECHO, OCR]
    answer = {
        "protocol_version": protocol_version,
        "worker_version": "1.3.0rc1",
        "healthy": all(entry["available"] for entry in listed) if healthy is None else healthy,
        "capabilities": listed,
    }
    if features is not None:
        answer["features"] = features
    if slots is not None:
        answer["features"] = sorted({*answer.get("features", []), "slots"})
        answer["slots"] = {"total": slots, "busy": 0}
    return answer


def echo_result(payload: dict[str, Any]) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(canonical_bytes(payload, ascii_only=True)).hexdigest(), "device": "cpu"}


def worker_error(status: int, code: str, message: str, retryable: bool) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message, "retryable": retryable}}


class Drop(Exception):
    """Raised by a ``run`` script: close the connection without answering (a crashed worker)."""


#: What a run answers: (HTTP status, JSON body), given the request's body.
RunScript = Callable[[dict[str, Any]], tuple[int, Any]]


def echo_run(request: dict[str, Any]) -> tuple[int, Any]:
    return 200, {"result": echo_result(request["input"])}


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeWorker:
    """``status`` is the status answer (a dict, raw bytes, or a callable giving either);
    ``run`` answers each run. ``unix=False`` listens on a loopback port instead of a socket."""

    def __init__(
        self,
        status: dict[str, Any] | bytes | Callable[[], Any] | None = None,
        run: RunScript = echo_run,
        *,
        unix: bool = True,
        cancel: RunScript | None = None,
    ) -> None:
        self.status = status if status is not None else status_answer()
        self.run = run
        self.cancel = cancel
        self.runs: list[dict[str, Any]] = []
        self.cancels: list[dict[str, Any]] = []
        #: when each run was answered (time.monotonic())
        self.run_ends: list[float] = []
        self.status_calls = 0
        self.finished_runs = 0
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, status: int, body: Any) -> None:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                worker.status_calls += 1
                status = worker.status() if callable(worker.status) else worker.status
                self._answer(200, status)

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/cancel":
                    worker.cancels.append(request)
                    old = worker_error(404, "route_not_found", "routes: GET /v1/status, POST /v1/run", False)
                    self._answer(*(old if worker.cancel is None else worker.cancel(request)))
                    return
                worker.runs.append(request)
                try:
                    status, body = worker.run(request)
                except Drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                finally:
                    worker.finished_runs += 1
                self._answer(status, body)
                worker.run_ends.append(time.monotonic())

            def log_message(self, *_: Any) -> None:
                """Quiet."""

        self._dir: str | None = None
        if unix:
            self._dir = tempfile.mkdtemp(prefix="mfw", dir="/tmp")  # sun_path holds 107 bytes: keep it short
            self.path = Path(self._dir) / "worker.sock"
            self._server: socketserver.BaseServer = _UnixServer(str(self.path), Handler)
            self.url = f"unix://{self.path}"
        else:
            tcp = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            tcp.daemon_threads = True
            self._server = tcp
            self.url = f"http://127.0.0.1:{tcp.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def fake_worker(
    status: dict[str, Any] | bytes | Callable[[], Any] | None = None,
    run: RunScript = echo_run,
    *,
    unix: bool = True,
    cancel: RunScript | None = None,
) -> Iterator[FakeWorker]:
    worker = FakeWorker(status, run, unix=unix, cancel=cancel)
    try:
        yield worker
    finally:
        worker.close()


@contextmanager
def socket_path() -> Iterator[Path]:
    """A short path where nothing listens."""
    folder = tempfile.mkdtemp(prefix="mfw", dir="/tmp")
    try:
        yield Path(folder) / "worker.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class CancellableRuns:
    """A worker's runs that hold their slot until cancelled by job id (as ``diagnostic.sleep``
    does): ``run`` waits for ``cancel`` and answers 409 ``job_cancelled``; ``release`` ends every
    run with a result instead."""

    def __init__(self) -> None:
        self.cancelled: set[str] = set()
        self.released = threading.Event()
        self._changed = threading.Condition()

    def run(self, request: dict[str, Any]) -> tuple[int, Any]:
        job_id = request.get("job_id")
        with self._changed:
            self._changed.wait_for(lambda: job_id in self.cancelled or self.released.is_set(), 30)
        if job_id in self.cancelled:
            return worker_error(409, "job_cancelled", f"job {job_id} was cancelled", True)
        return 200, {"result": echo_result(request["input"])}

    def cancel(self, request: dict[str, Any]) -> tuple[int, Any]:
        with self._changed:
            self.cancelled.add(request["job_id"])
            self._changed.notify_all()
        return 200, {"job_id": request["job_id"], "state": "ended"}

    def release(self) -> None:
        with self._changed:
            self.released.set()
            self._changed.notify_all()
