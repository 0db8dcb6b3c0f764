"""Who may call the worker, over real HTTP: on loopback TCP only a loopback ``Host``, never an
``Origin``, and a POST only as ``application/json`` -- so a DNS-rebound or cross-site browser page
cannot run a job (security pass 2, item 8). Every refusal is a JSON 4xx and runs nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelforge_runtime_worker.client import WorkerClient
from modelforge_runtime_worker.config import Listen
from modelforge_runtime_worker.jobs import JobRunner
from modelforge_runtime_worker.ocr import Cancel
from modelforge_runtime_worker.server import Listener, WorkerApp

from tests.support import raw_http


class Recording:
    """A capability that counts the jobs it ran."""

    name, model, model_sha256, device, available, reason = "echoish", "stand-in", None, "cpu", True, None

    def __init__(self) -> None:
        self.runs = 0
        self._guard = threading.Lock()

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        with self._guard:
            self.runs += 1
        return {"n": len(payload)}


@pytest.fixture()
def recording() -> Recording:
    return Recording()


@pytest.fixture()
def tcp(recording: Recording) -> Iterator[str]:
    listener = Listener(Listen(url="http://127.0.0.1:0", host="127.0.0.1", port=0))
    listener.serve(WorkerApp([recording], JobRunner(5)), poll_interval=0.02)
    yield listener.address
    listener.close()


BODY = b'{"capability":"echoish","input":{"a":1}}'


def post(host: bytes | None, content_type: bytes | None, extra: bytes = b"") -> bytes:
    head = b"POST /v1/run HTTP/1.1\r\n"
    if host is not None:
        head += b"Host: " + host + b"\r\n"
    if content_type is not None:
        head += b"Content-Type: " + content_type + b"\r\n"
    return head + extra + b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BODY), BODY)


def refused(url: str, request: bytes) -> tuple[int, str, str]:
    [answer] = raw_http.exchange(url, request)
    body = answer.json()
    assert set(body) == {"error"} and body["error"]["retryable"] is False, body
    return answer.status, body["error"]["code"], answer.headers["connection"]


def test_a_text_plain_post_with_a_foreign_host_runs_nothing(tcp: str, recording: Recording) -> None:
    # the probe's request: what a DNS-rebound page sends (its own name, a "simple" content type)
    assert refused(tcp, post(b"rebind.example:8080", b"text/plain")) == (403, "host_not_allowed", "close")
    assert refused(tcp, post(b"rebind.example", b"application/json")) == (403, "host_not_allowed", "close")
    assert recording.runs == 0


@pytest.mark.parametrize(
    "host",
    [b"127.0.0.2.rebind.example", b"127.0.0.1@evil.example", b"localhost.evil.example", b"::1", b"", b"[::1]x"],
)
def test_a_host_that_only_looks_like_loopback_is_refused(tcp: str, recording: Recording, host: bytes) -> None:
    assert refused(tcp, post(host, b"application/json"))[:2] == (403, "host_not_allowed")
    assert recording.runs == 0


def test_a_request_without_a_host_on_tcp_is_refused(tcp: str, recording: Recording) -> None:
    request = b"GET /v1/status HTTP/1.0\r\n\r\n"
    assert refused(tcp, request)[:2] == (403, "host_not_allowed")


def test_a_loopback_post_that_is_not_json_is_refused_415(tcp: str, recording: Recording) -> None:
    for content_type in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x"):
        assert refused(tcp, post(b"127.0.0.1", content_type)) == (415, "unsupported_media_type", "close")
    assert refused(tcp, post(b"127.0.0.1", None)) == (415, "unsupported_media_type", "close")
    two = post(b"127.0.0.1", b"application/json", b"Content-Type: text/plain\r\n")
    assert refused(tcp, two)[:2] == (415, "unsupported_media_type")
    assert recording.runs == 0


def test_any_origin_is_refused_even_a_loopback_one(tcp: str, recording: Recording) -> None:
    for origin in (b"http://rebind.example", b"http://127.0.0.1:8000", b"null"):
        request = post(b"127.0.0.1", b"application/json", b"Origin: " + origin + b"\r\n")
        assert refused(tcp, request) == (403, "origin_not_allowed", "close")
    status = b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://rebind.example\r\n\r\n"
    assert refused(tcp, status)[:2] == (403, "origin_not_allowed")
    assert recording.runs == 0


@pytest.mark.parametrize("host", [b"127.0.0.1", b"127.0.0.1:1234", b"localhost", b"LOCALHOST:80", b"[::1]:9"])
def test_every_loopback_host_with_json_is_served(tcp: str, recording: Recording, host: bytes) -> None:
    [answer] = raw_http.exchange(tcp, post(host, b"application/json; charset=utf-8"))
    assert answer.status == 200 and answer.json() == {"result": {"n": 1}}
    assert recording.runs == 1


def test_the_worker_clients_send_what_the_worker_requires(tcp: str, recording: Recording) -> None:
    from modelforge_node_agent.worker_client import WorkerClient as AgentWorkerClient
    from modelforge_node_agent.worker_client import WorkerRefused

    assert WorkerClient(tcp).run("echoish", {"a": 1}).body == {"result": {"n": 1}}
    agent = AgentWorkerClient(tcp)
    assert agent.status().available == ("echoish",)
    assert agent.run("echoish", {"a": 1, "b": 2}) == {"n": 2}
    try:
        agent.cancel("job-1")
    except WorkerRefused as refusal:  # whatever the worker thinks of the job id, it read the request
        assert refusal.status not in (403, 415)
    assert recording.runs == 2


def test_on_a_unix_socket_the_host_is_free_but_json_is_required(tmp_path: Path, recording: Recording) -> None:
    path = tmp_path / "w.sock"
    listener = Listener(Listen(url=f"unix://{path}", path=path))
    listener.serve(WorkerApp([recording], JobRunner(5)), poll_interval=0.02)
    try:
        client = WorkerClient(listener.address)
        assert client.request("POST", "/v1/run", BODY, {"Host": "worker"}).status == 200
        answer = client.request("POST", "/v1/run", BODY, {"Content-Type": "text/plain"})
        assert (answer.status, answer.error_code) == (415, "unsupported_media_type")
        answer = client.request("GET", "/v1/status", None, {"Origin": "http://rebind.example"})
        assert (answer.status, answer.error_code) == (403, "origin_not_allowed")
        assert recording.runs == 1
    finally:
        listener.close()
