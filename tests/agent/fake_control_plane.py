"""A fake control plane on 127.0.0.1 (real sockets, http.server) and the real agent wired to it:
real ``ControlPlaneClient`` and session from ``transport.build_session``, injected stop, clock and
jitter, so the tests see exactly what the agent sends and reads over HTTP.

With ``work`` (a ``FakeWork``) it also serves the work routes (claim, renew, complete, fail) and
hints ``work_waiting`` in heartbeat answers while an item is queued; ``ObjectServer`` is the
presigned-URL object store (GET and PUT) those items' URLs point at."""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from modelforge_node_agent.agent import Agent
from modelforge_node_agent.config import load_config
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT, INVENTORY, WORK_CLAIM, ControlPlaneClient
from modelforge_node_agent.gpu_source import NoGpus
from modelforge_node_agent.identity import StateVolume, new_identity
from modelforge_node_agent.transport import base_url, build_session
from modelforge_node_agent.work import WorkRunner, for_config
from modelforge_protocol.canonical import canonical_bytes

TOKEN = "mfe.enr_" + "0" * 32 + "." + "A" * 43
NODE_ID = "node_" + "c" * 32
ENROLLED = {"node_id": NODE_ID, "heartbeat_interval_seconds": 15, "replayed": False}
ONLINE = {"node_id": NODE_ID, "status": "online", "heartbeat_interval_seconds": 15, "work_waiting": False}
INVENTORY_STORED = {"node_id": NODE_ID, "inventory": {}}
NORMAL = {ENROLL: (201, ENROLLED), HEARTBEAT: (200, ONLINE), INVENTORY: (200, INVENTORY_STORED)}


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    client_port: int


#: A reply writes the whole answer itself (status line, headers, body) on the handler.
Reply = Callable[[BaseHTTPRequestHandler], None]


def json_reply(status: int, answer: Any, headers: dict[str, str] | None = None) -> Reply:
    raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode()

    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(raw)

    return reply


def no_content_reply() -> Reply:
    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(204)
        handler.end_headers()

    return reply


def error_reply(status: int, code: str) -> Reply:
    return json_reply(status, {"error": {"code": code, "message": code.replace("_", " ")}})


def normal_reply(path: str) -> Reply:
    status, answer = NORMAL[path]
    return json_reply(status, answer)


@dataclass
class FakeServer:
    """Answers each path with ``replies[path]`` (a list is used in order, its last item repeats),
    else like a healthy control plane. Records every request."""

    replies: dict[str, Reply | list[Reply]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    tls: ssl.SSLContext | None = None
    work: FakeWork | None = None

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.seen.append(Seen(self.path, body, dict(self.headers), self.client_address[1]))
                fake.reply_for(self.path, body)(self)

            def log_message(self, *_: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def reply_for(self, path: str, body: dict[str, Any] | None = None) -> Reply:
        script = self.replies.get(path)
        if script is None and self.work is not None:
            if path.startswith(WORK_PREFIX):
                return self.work.reply(path, body or {})
            if path == HEARTBEAT:
                features = {"features": list(self.work.features)} if self.work.features else {}
                return json_reply(200, {**ONLINE, "work_waiting": self.work.waiting(), **features})
        if script is None:
            return normal_reply(path)
        if isinstance(script, list):
            return script.pop(0) if len(script) > 1 else script[0]
        return script

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def paths(self) -> list[str]:
        return [request.path for request in self.seen]

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [request.body for request in list(self.seen) if request.path == path]

    def close(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def fake_server(
    replies: dict[str, Reply | list[Reply]] | None = None, work: FakeWork | None = None
) -> Iterator[FakeServer]:
    server = FakeServer(replies or {}, work=work)
    try:
        yield server
    finally:
        server.close()


class SilentListener:
    """A listening socket that never accepts: a connection to it stays in the backlog, where
    ``connections_waiting`` finds it. Nothing can reach it without being counted."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def connections_waiting(self) -> int:
        count = 0
        while True:
            try:
                connection, _ = self.sock.accept()
            except BlockingIOError:
                return count
            connection.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


class RecordingStop:
    """Stands in for threading.Event: records each requested sleep, advances the fake clock by
    it, and reports "stopped" after ``limit`` waits."""

    def __init__(self, limit: int, clock: FakeClock | None = None) -> None:
        self.limit = limit
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.clock is not None:
            self.clock.now += seconds
        return len(self.waits) >= self.limit

    def is_set(self) -> bool:
        return len(self.waits) >= self.limit


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def in_process_agent(
    env: dict[str, str],
    *,
    stop: Any,
    client: Any = None,
    gpus: Any = None,
    clock: Callable[[], float] | None = None,
    jitter: float = 1.0,
    work: WorkRunner | None = None,
    work_options: dict[str, Any] | None = None,
) -> tuple[Agent, StateVolume]:
    """The real Agent, configured from ``env`` as the process would be, with an injected stop,
    clock and jitter; ``client`` defaults to the real HTTP client and session, ``gpus`` to a CPU
    node; with ``MODELFORGE_AGENT_WORKER_URL``, ``work`` defaults to the real work loop
    (``work.for_config`` with ``work_options``). The one place tests build an agent
    in-process."""
    config = load_config(env)
    state = StateVolume(config.state_volume)
    state.prepare()
    client = client or ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    if work is None and config.worker_url is not None:
        work = for_config(config, **(work_options or {}))
    agent = Agent(
        config, client, state, gpus or NoGpus(), stop=stop, clock=clock or FakeClock(), jitter=lambda: jitter, work=work
    )
    return agent, state


def real_agent(
    tmp_path: Path, url: str, stop: RecordingStop, clock: FakeClock | None = None, **env: str
) -> tuple[Agent, StateVolume]:
    """The real Agent with the real HTTP client and session, in CPU mode."""
    settings = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
        "MODELFORGE_AGENT_HOSTNAME": "fake_node",
        **env,
    }
    return in_process_agent(settings, stop=stop, clock=clock)


def enrolled_before(state: StateVolume, url: str) -> None:
    """What an earlier start left behind: an enrolled identity, so this start begins publishing."""
    state.save(new_identity(url))
    identity = state.load()
    assert identity is not None
    state.enrolled_as(identity, NODE_ID)


# --- work: the presigned-URL object store and the control plane's work queue ---------------------

WORK_PREFIX = "/api/v1/agent/work/"
#: The "signature" every presigned URL carries: a bearer secret that must never reach a log.
SIGNATURE = "fake-signature-" + "9" * 40


@dataclass
class ObjectRequest:
    method: str
    key: str
    headers: dict[str, str]
    body: bytes


class _ObjectHandler(BaseHTTPRequestHandler):
    """Serves one ``ObjectServer`` (``store``, set on a subclass per server)."""

    store: ObjectServer

    protocol_version = "HTTP/1.1"

    def _key(self) -> str | None:
        parts = urlsplit(self.path)
        if parse_qs(parts.query).get("X-Amz-Signature") != [SIGNATURE] or not parts.path.startswith("/bucket/"):
            return None
        return parts.path[len("/bucket/") :]

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0)) if method == "PUT" else b""
        key = self._key()
        self.store.requests.append(ObjectRequest(method, key or "", dict(self.headers), body))
        if key is None:
            return self._send(403, b"<Error>SignatureDoesNotMatch</Error>")
        if key in self.store.redirects:
            return self._send(307, b"", {"Location": self.store.redirects[key]})
        if (method, key) in self.store.statuses:
            return self._send(self.store.statuses[(method, key)], b"<Error/>")
        if method == "PUT":
            self.store.objects[key] = body
            return self._send(200)
        if key not in self.store.objects:
            return self._send(404, b"<Error>NoSuchKey</Error>")
        return self._send(200, self.store.objects[key], {"Content-Type": "application/json"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def log_message(self, *_: Any) -> None:
        """Quiet."""


class ObjectServer:
    """A presigned-URL object store on 127.0.0.1: ``GET``/``PUT /bucket/<key>?X-Amz-Signature=...``
    (403 without the signature). ``redirects[key]`` answers that key with a 307 to another URL;
    ``statuses[(method, key)]`` answers it with that status. Records every request."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.requests: list[ObjectRequest] = []
        self.redirects: dict[str, str] = {}
        self.statuses: dict[tuple[str, str], int] = {}
        handler = type("ObjectHandler", (_ObjectHandler,), {"store": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, key: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/bucket/{key}?X-Amz-Algorithm=fake&X-Amz-Signature={SIGNATURE}"

    def puts(self) -> list[ObjectRequest]:
        return [request for request in list(self.requests) if request.method == "PUT"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class FakeItem:
    work_id: str
    capability: str
    lease_seconds: int
    status: str = "queued"
    epoch: int = 0
    #: answers renewal number n (1, 2, ...): None renews, else (status, error code)
    on_renew: Callable[[int], tuple[int, str] | None] | None = None
    renewals: int = 0

    @property
    def input_key(self) -> str:
        return f"inputs/{self.work_id}.json"

    def result_key(self) -> str:
        return f"results/{self.work_id}/{self.epoch}.json"


class FakeWork:
    """The control plane's work queue, as far as a lease holder sees it: claim (oldest queued item,
    else 204), renew, complete (checks the uploaded object's SHA-256 and size), fail. Records
    every call with the time it arrived."""

    def __init__(self, objects: ObjectServer) -> None:
        self.objects = objects
        self.items: dict[str, FakeItem] = {}
        self.claims: list[int] = []
        self.renewals: list[tuple[float, str, int]] = []
        self.completions: list[tuple[str, dict[str, Any]]] = []
        self.failures: list[tuple[str, dict[str, Any]]] = []
        self.claim_times: list[float] = []
        #: what heartbeat answers list in ``features`` (none, as a control plane of 1.3.0)
        self.features: list[str] = []
        self._lock = threading.Lock()

    def submit(
        self,
        capability: str,
        document: dict[str, Any],
        *,
        lease_seconds: int = 10,
        on_renew: Callable[[int], tuple[int, str] | None] | None = None,
    ) -> FakeItem:
        with self._lock:
            item = FakeItem(f"work_{len(self.items) + 1:032x}", capability, lease_seconds, on_renew=on_renew)
            self.objects.objects[item.input_key] = canonical_bytes(document)
            self.items[item.work_id] = item
            return item

    def waiting(self) -> bool:
        with self._lock:
            return any(item.status == "queued" for item in self.items.values())

    def reply(self, path: str, body: dict[str, Any]) -> Reply:
        with self._lock:
            if path == WORK_CLAIM:
                return self._claim()
            work_id, _, action = path[len(WORK_PREFIX) :].partition("/")
            item = self.items.get(work_id)
            if item is None:
                return error_reply(404, "work_not_found")
            if item.status == "cancelled":
                return error_reply(409, "work_cancelled")
            if item.status != "leased" or body.get("epoch") != item.epoch:
                return error_reply(409, "lease_lost")
            return getattr(self, f"_{action}")(item, body)

    def _claim(self) -> Reply:
        self.claim_times.append(time.monotonic())
        queued = [item for item in self.items.values() if item.status == "queued"]
        if not queued:
            self.claims.append(204)
            return no_content_reply()
        item = queued[0]
        item.status, item.epoch = "leased", item.epoch + 1
        self.claims.append(200)
        return json_reply(
            200,
            {
                "work_id": item.work_id,
                "capability": item.capability,
                "epoch": item.epoch,
                "lease_seconds": item.lease_seconds,
                "lease_expires_at": "2030-01-01T00:00:00Z",
                "input_url": self.objects.url(item.input_key),
                "result_upload_url": self.objects.url(item.result_key()),
            },
        )

    def _renew(self, item: FakeItem, body: dict[str, Any]) -> Reply:
        item.renewals += 1
        self.renewals.append((time.monotonic(), item.work_id, body["epoch"]))
        refusal = item.on_renew(item.renewals) if item.on_renew else None
        if refusal is not None:
            status, code = refusal
            item.status = "cancelled" if code == "work_cancelled" else "leased_elsewhere"
            return error_reply(status, code)
        return json_reply(200, {"work_id": item.work_id, "status": "leased"})

    def _complete(self, item: FakeItem, body: dict[str, Any]) -> Reply:
        self.completions.append((item.work_id, body))
        uploaded = self.objects.objects.get(item.result_key())
        if uploaded is None:
            return error_reply(409, "result_missing")
        if hashlib.sha256(uploaded).hexdigest() != body["sha256"] or len(uploaded) != body["size"]:
            return error_reply(409, "result_checksum_mismatch")
        item.status = "succeeded"
        return json_reply(200, {"work_id": item.work_id, "status": "succeeded"})

    def _fail(self, item: FakeItem, body: dict[str, Any]) -> Reply:
        self.failures.append((item.work_id, body))
        # a real queue would offer a retryable failure again; each test here looks at one attempt
        item.status = "failed"
        return json_reply(200, {"work_id": item.work_id, "status": "queued" if body["retryable"] else "dead"})
