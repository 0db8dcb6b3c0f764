"""A fake control plane on 127.0.0.1 (real sockets, http.server) and the real agent wired to it:
real ``ControlPlaneClient`` and session from ``transport.build_session``, injected stop, clock and
jitter, so the tests see exactly what the agent sends and reads over HTTP."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from modelforge_node_agent.agent import Agent
from modelforge_node_agent.config import load_config
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT, INVENTORY, ControlPlaneClient
from modelforge_node_agent.identity import StateVolume, new_identity
from modelforge_node_agent.gpu_source import NoGpus
from modelforge_node_agent.transport import base_url, build_session

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

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.seen.append(Seen(self.path, body, dict(self.headers), self.client_address[1]))
                fake.reply_for(self.path)(self)

            def log_message(self, *_: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def reply_for(self, path: str) -> Reply:
        script = self.replies.get(path)
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

    def close(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def fake_server(replies: dict[str, Reply | list[Reply]] | None = None) -> Iterator[FakeServer]:
    server = FakeServer(replies or {})
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
) -> tuple[Agent, StateVolume]:
    """The real Agent, configured from ``env`` as the process would be, with an injected stop,
    clock and jitter; ``client`` defaults to the real HTTP client and session, ``gpus`` to a CPU
    node. The one place tests build an agent in-process."""
    config = load_config(env)
    state = StateVolume(config.state_volume)
    state.prepare()
    client = client or ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    agent = Agent(
        config, client, state, gpus or NoGpus(), stop=stop, clock=clock or FakeClock(), jitter=lambda: jitter
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
