"""The runtime worker's local API as the agent calls it: ``GET /v1/status``, ``POST /v1/run`` and,
to a worker whose status lists the ``cancel`` feature, ``POST /v1/cancel``; over a unix socket
(``unix:///path``) or a loopback port (``http://127.0.0.1:PORT``).

``http.client`` with a connection class that can also dial a unix socket: no new dependency, and
nothing that could follow a redirect (a 3xx is an unexpected answer). Every call is bounded: a
whole-request deadline (a timer shuts the socket down when it passes, which ends a blocked read
at once; a caller that stops waiting can cut it the same way, ``Cutter``), answers read up to a
cap, parsed strictly and validated against the protocol's worker schemas
(``modelforge_protocol.work.WORKER_STATUS``, ``WORKER_RUN_ANSWER``, ``WORKER_CANCEL_ANSWER``). The worker's
``protocol_version`` is judged with ``versions.verdict(Component.WORKER, ...)`` before anything
else in its status is believed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from modelforge_protocol import capped_read, schemas, work
from modelforge_protocol.versions import Component, Verdict, next_step, verdict

from . import answers
from .answers import MalformedAnswer

OK, DEGRADED, UNREACHABLE, INCOMPATIBLE = schemas.WORKER_STATES
_CANCEL_ANSWER = Draft202012Validator(work.WORKER_CANCEL_ANSWER)
#: Bound of one status call (the agent polls once per heartbeat, on the publishing thread).
STATUS_TIMEOUT_SECONDS = 5.0
#: Bound of one run. The worker bounds each job itself (MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS, at
#: most 3600 s) and answers 504 ``job_timeout``; this only catches a worker that never answers.
RUN_TIMEOUT_SECONDS = 3600.0 + 30.0
MAX_STATUS_BYTES = schemas.MAX_ANSWER_BYTES
#: A run's answer carries the result, which may be as large as the control plane accepts.
MAX_RUN_ANSWER_BYTES = work.MAX_RESULT_BYTES + 64 * 1024
#: Bound of one cancel call: the worker answers once the job has unwound, or after about 1 s.
CANCEL_TIMEOUT_SECONDS = 3.0
MAX_CANCEL_ANSWER_BYTES = 4096
MAX_DETAIL_CHARS = 512
STATUS_PATH, RUN_PATH, CANCEL_PATH = "/v1/status", "/v1/run", "/v1/cancel"
_CONTROL = {code: " " for code in [*range(0x20), 0x7F]}


def printable(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters: control characters become spaces."""
    return text.translate(_CONTROL).strip()[:limit]


class WorkerFailure(Exception):
    """No usable answer: not reachable, reset, past the deadline, cut, or malformed. ``label``
    names the error class or HTTP status (never a body)."""

    def __init__(self, label: str, detail: str = "") -> None:
        super().__init__(f"{label}{': ' + detail if detail else ''}")
        self.label, self.detail = label, detail


class WorkerRefused(Exception):
    """The worker answered a run with an error: ``code``, its ``message`` and whether the same
    input may succeed later (``retryable``)."""

    def __init__(self, status: int, code: str, message: str, retryable: bool) -> None:
        super().__init__(f"HTTP {status} {code}")
        self.status, self.code, self.message, self.retryable = status, code, message, retryable


class Cutter:
    """Shuts one call's socket down from another thread (the deadline's timer, or a caller that
    stopped waiting); a call that connects after the cut is cut at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.reason: str | None = None

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            late = self.reason is not None
        if late:
            _shutdown(sock)

    def cut(self, reason: str = "aborted") -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            sock = self._sock
        if sock is not None:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class Endpoint:
    """Where the worker listens: a unix socket ``path``, or ``host``:``port`` (loopback; the
    configuration checked that)."""

    path: str | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return cls(path=parts.path)
        return cls(host=parts.hostname or "127.0.0.1", port=parts.port)


class _Connection(http.client.HTTPConnection):
    """HTTP over the endpoint's unix socket or TCP port; every socket is handed to the cutter."""

    def __init__(self, endpoint: Endpoint, timeout: float, cutter: Cutter) -> None:
        super().__init__(endpoint.host or "localhost", endpoint.port, timeout=timeout)
        self._unix_path = endpoint.path
        self._cutter = cutter

    def connect(self) -> None:
        if self._unix_path is None:
            super().connect()
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self._unix_path)
            except BaseException:
                sock.close()
                raise
            self.sock = sock
        self._cutter.attach(self.sock)


def _label(error: BaseException, connected: bool, cutter: Cutter, late: bool = False) -> str:
    if cutter.reason == "deadline" or (cutter.reason is None and late):
        return "DeadlineExceeded"
    if cutter.reason is not None:
        return "Aborted"
    if not connected:
        return "ConnectTimeout" if isinstance(error, TimeoutError) else "ConnectError"
    if isinstance(error, TimeoutError):
        return "ReadTimeout"
    if isinstance(error, (http.client.RemoteDisconnected, ConnectionError, http.client.IncompleteRead)):
        return "Disconnected"
    return type(error).__name__


@dataclass(frozen=True)
class WorkerCapability:
    name: str
    available: bool
    reason: str | None


@dataclass(frozen=True)
class WorkerStatus:
    """What the agent knows of its worker after one status call.

    ``status``: ``ok``; ``degraded`` (unhealthy, or a capability unavailable, e.g.
    ``artifact_quarantined``); ``unreachable`` (no usable answer); ``incompatible`` (its protocol
    version, or an answer that does not match the protocol)."""

    status: str
    detail: str
    capabilities: tuple[WorkerCapability, ...] = ()
    healthy: bool = False
    verdict: Verdict | None = None
    next_step: str | None = None
    worker_version: str | None = None
    #: what the worker can do beyond running jobs (``work.WORKER_FEATURES``: ``cancel``, ``slots``)
    features: frozenset[str] = frozenset()
    #: jobs the worker runs at once (its ``slots.total``; 1 for a worker without the ``slots`` feature)
    slots: int = 1

    @property
    def cancels(self) -> bool:
        """Whether runs can be given a job id and cancelled by it."""
        return work.WORKER_FEATURE_CANCEL in self.features

    @property
    def available(self) -> tuple[str, ...]:
        """The capabilities the node can serve now (what its inventory advertises)."""
        if self.status not in (OK, DEGRADED):
            return ()
        return tuple(sorted(capability.name for capability in self.capabilities if capability.available))

    @property
    def unavailable(self) -> list[dict[str, str]]:
        return [
            {"name": capability.name, "reason": capability.reason or "unavailable"}
            for capability in self.capabilities
            if not capability.available
        ]

    @property
    def claimable(self) -> bool:
        """Worth claiming for: something available, and the worker healthy (or unhealthy only
        because some capability is unavailable)."""
        return bool(self.available) and (self.healthy or bool(self.unavailable))

    def to_health(self) -> dict[str, Any]:
        """The heartbeat's ``health.worker`` (``schemas.WORKER_HEALTH``)."""
        return {
            "status": self.status,
            "detail": printable(self.detail, MAX_DETAIL_CHARS),
            "unavailable": self.unavailable[: schemas.MAX_CAPABILITIES],
        }


def _judged(answer: Any) -> WorkerStatus:
    if not isinstance(answer, dict):
        return WorkerStatus(INCOMPATIBLE, "the status answer is not a JSON object")
    judged = verdict(Component.WORKER, answer.get("protocol_version"))
    if judged is not Verdict.COMPATIBLE:
        step = next_step(Component.WORKER, judged)
        return WorkerStatus(INCOMPATIBLE, f"worker protocol {judged.value}: {step}", verdict=judged, next_step=step)
    try:
        answers.check(answers.WORKER_STATUS, answer)
    except MalformedAnswer as malformed:
        return WorkerStatus(INCOMPATIBLE, f"the status answer does not match the protocol ({malformed.reason})")
    seen: dict[str, WorkerCapability] = {}
    for entry in answer["capabilities"]:
        seen.setdefault(entry["name"], WorkerCapability(entry["name"], entry["available"], entry.get("reason")))
    capabilities = tuple(seen.values())
    version = answer["worker_version"]
    features = frozenset(answer.get("features") or ())
    missing = [
        f"{capability.name} ({capability.reason or 'unavailable'})"
        for capability in capabilities
        if not capability.available
    ]
    if missing:
        status, detail = DEGRADED, f"worker {version}: unavailable: {', '.join(missing)}"
    elif not answer["healthy"]:
        status, detail = DEGRADED, f"worker {version} reports itself unhealthy"
    else:
        names = ", ".join(sorted(seen)) or "no capabilities"
        status, detail = OK, f"worker {version}: {names}"
    return WorkerStatus(
        status,
        detail,
        capabilities,
        healthy=answer["healthy"],
        verdict=judged,
        worker_version=version,
        features=features,
        slots=_slots(answer, features),
    )


def _slots(answer: dict[str, Any], features: frozenset[str]) -> int:
    """The worker's slot count: ``slots.total`` where it lists the ``slots`` feature, else 1 (an
    older worker runs one job at a time)."""
    slots = answer.get("slots")
    if work.WORKER_FEATURE_SLOTS not in features or not isinstance(slots, dict):
        return 1
    return int(slots["total"])


class WorkerClient:
    def __init__(
        self,
        url: str,
        *,
        status_timeout_seconds: float = STATUS_TIMEOUT_SECONDS,
        run_timeout_seconds: float = RUN_TIMEOUT_SECONDS,
        cancel_timeout_seconds: float = CANCEL_TIMEOUT_SECONDS,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        self._status_timeout = status_timeout_seconds
        self._run_timeout = run_timeout_seconds
        self._cancel_timeout = cancel_timeout_seconds

    def status(self) -> WorkerStatus:
        """The worker's status, judged; never raises."""
        try:
            status, raw = self._exchange("GET", STATUS_PATH, None, self._status_timeout, MAX_STATUS_BYTES, None)
        except WorkerFailure as failure:
            detail = f": {failure.detail}" if failure.detail else ""
            return WorkerStatus(UNREACHABLE, f"{failure.label} on GET {STATUS_PATH}{detail}")
        if status != 200:
            return WorkerStatus(UNREACHABLE, f"HTTP {status} on GET {STATUS_PATH}")
        try:
            answer = answers.parse(raw)
        except MalformedAnswer as malformed:
            return WorkerStatus(UNREACHABLE, f"InvalidAnswer on GET {STATUS_PATH}: {malformed.reason}")
        return _judged(answer)

    def run(
        self,
        capability: str,
        payload: dict[str, Any],
        cutter: Cutter | None = None,
        job_id: str | None = None,
        gpu_uuid: str | None = None,
    ) -> dict[str, Any]:
        """The result of running ``payload``; ``WorkerRefused`` when the worker answers an error,
        ``WorkerFailure`` when there is no usable answer (``cutter`` ends the call early).
        ``job_id`` (only to a worker that ``cancels``) names the job for ``cancel``; ``gpu_uuid``
        (only to a worker with ``gpu_slots``) is the GPU it runs on."""
        request: dict[str, Any] = {"capability": capability, "input": payload}
        if job_id is not None:
            request["job_id"] = job_id
        if gpu_uuid is not None:
            request["gpu_uuid"] = gpu_uuid
        body = json.dumps(request, separators=(",", ":"), ensure_ascii=False)
        status, raw = self._exchange(
            "POST", RUN_PATH, body.encode("utf-8"), self._run_timeout, MAX_RUN_ANSWER_BYTES, cutter
        )
        try:
            answer = answers.validated(answers.WORKER_RUN_ANSWER, raw, max_bytes=MAX_RUN_ANSWER_BYTES)
        except MalformedAnswer as malformed:
            raise WorkerFailure(f"InvalidAnswer (HTTP {status})", malformed.reason) from None
        if status == 200 and "result" in answer:
            return answer["result"]  # type: ignore[no-any-return]
        if status != 200 and "error" in answer:
            error = answer["error"]
            message = printable(str(error.get("message") or ""), work.MAX_REASON_CHARS)
            raise WorkerRefused(status, error["code"], message, error["retryable"])
        raise WorkerFailure(f"InvalidAnswer (HTTP {status})", "the status and the answer disagree")

    def cancel(self, job_id: str) -> str:
        """Stop the job ``job_id`` on the worker: what the worker says of it (``ended``: it has
        unwound, the worker is free; ``ending``; ``not_running``). ``WorkerRefused`` or
        ``WorkerFailure`` as for ``run``."""
        body = json.dumps({"job_id": job_id}, separators=(",", ":")).encode("utf-8")
        status, raw = self._exchange("POST", CANCEL_PATH, body, self._cancel_timeout, MAX_CANCEL_ANSWER_BYTES, None)
        if status != 200:
            try:
                error = answers.validated(answers.WORKER_RUN_ANSWER, raw, max_bytes=MAX_CANCEL_ANSWER_BYTES)["error"]
            except (MalformedAnswer, KeyError):
                raise WorkerFailure(f"InvalidAnswer (HTTP {status})", "not an error answer") from None
            message = printable(str(error.get("message") or ""), work.MAX_REASON_CHARS)
            raise WorkerRefused(status, error["code"], message, error["retryable"])
        try:
            answer = answers.validated(_CANCEL_ANSWER, raw, max_bytes=MAX_CANCEL_ANSWER_BYTES)
        except MalformedAnswer as malformed:
            raise WorkerFailure("InvalidAnswer (HTTP 200)", malformed.reason) from None
        return answer["state"]  # type: ignore[no-any-return]

    def _exchange(
        self, method: str, path: str, body: bytes | None, timeout: float, cap: int, cutter: Cutter | None
    ) -> tuple[int, bytes]:
        cutter = cutter or Cutter()
        timer = threading.Timer(timeout, cutter.cut, args=("deadline",))
        timer.name = "modelforge-worker-deadline"
        timer.daemon = True
        connection = _Connection(self.endpoint, timeout, cutter)
        connected = False
        started = time.monotonic()
        timer.start()
        try:
            connection.connect()
            connected = True
            headers = {"Accept": "application/json", "User-Agent": "modelforge-node-agent"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            try:
                raw = capped_read.read_capped(response.read, response.headers, cap)
            except capped_read.TooLarge:
                raise WorkerFailure(
                    f"InvalidAnswer (HTTP {response.status})", f"answer larger than {cap} bytes"
                ) from None
            except capped_read.Compressed as compressed:
                raise WorkerFailure(f"InvalidAnswer (HTTP {response.status})", compressed.reason) from None
            if cutter.reason is not None:  # the answer may have looked whole when its socket was shut down
                raise WorkerFailure(_label(TimeoutError(), True, cutter))
            return response.status, raw
        except (OSError, http.client.HTTPException) as error:
            late = time.monotonic() - started >= timeout  # a socket timeout may fire with the deadline
            raise WorkerFailure(_label(error, connected, cutter, late)) from None
        finally:
            timer.cancel()
            timer.join()
            connection.close()
