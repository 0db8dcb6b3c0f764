"""The worker's HTTP layer and job runner in this process, with stand-in capabilities whose
timing the test controls (gates, not sleeps): one job at a time, deadlines, aborts, the bounds
on connections and bodies, and JSON errors for everything, http.server's own refusals included."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelforge_runtime_worker import server as server_module
from modelforge_runtime_worker.client import Answer, WorkerClient
from modelforge_runtime_worker.config import Listen
from modelforge_runtime_worker.errors import ListenFailed
from modelforge_runtime_worker.jobs import JobRunner
from modelforge_runtime_worker.ocr import Cancel, JobCancelled
from modelforge_runtime_worker.server import Listener, WorkerApp

from tests.support.polling import wait_until
from tests.support.raw_http import closed_within, read_until_closed, split_answers

#: the head of a POST /v1/run as the worker requires it (a JSON body)
JSON_POST = b"POST /v1/run HTTP/1.1\r\nContent-Type: application/json\r\n"


class Gate:
    """A capability that runs until the test opens its gate; ``obeys_abort``: it also ends when
    its job is aborted (as the OCR engine does), else it ignores the abort."""

    model, model_sha256, device, available, reason = "stand-in", None, "cpu", True, None

    def __init__(self, name: str = "gate", obeys_abort: bool = True) -> None:
        self.name = name
        self.obeys_abort = obeys_abort
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.ended = threading.Event()

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        self.entered.set()
        try:
            while not self.opened.wait(0.01):
                if self.obeys_abort and cancel.is_set():
                    raise JobCancelled()
            return {"echo": payload}
        finally:
            self.ended.set()


class Fixed:
    model, model_sha256, device = "stand-in", None, "cpu"

    def __init__(
        self, name: str, available: bool = True, reason: str | None = None, error: Exception | None = None
    ) -> None:
        self.name, self.available, self.reason, self.error = name, available, reason, error

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {"n": len(payload)}


class Served:
    def __init__(self, tmp: Path, capabilities: list[Any], timeout: float = 30) -> None:
        self.path = tmp / "w.sock"
        self.jobs = JobRunner(timeout)
        self.app = WorkerApp(capabilities, self.jobs)
        self.listener = Listener(Listen(url=f"unix://{self.path}", path=self.path))
        self.listener.serve(self.app, poll_interval=0.02)
        self.address = self.listener.address

    def client(self) -> WorkerClient:
        return WorkerClient(self.address, timeout=10)

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(self.path))
        return sock

    def exchange(self, request: bytes, within: float = 10) -> list[Any]:
        with self.connect() as sock:
            # a server that answers at accept (503 past the connection limit) may close before
            # the request is sent; on a unix socket the send then fails with EPIPE, while the
            # answer it wrote is still there to read
            with contextlib.suppress(BrokenPipeError):
                sock.sendall(request)
            return split_answers(read_until_closed(sock, within))


@pytest.fixture()
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.opened.set()


@pytest.fixture()
def served(tmp_path_factory: pytest.TempPathFactory, gate: Gate) -> Iterator[Served]:
    capabilities = [
        gate,
        Fixed("echoish"),
        Fixed("quarantined", available=False, reason="artifact_quarantined"),
        Fixed("no-cuda", available=False, reason="cuda_unavailable"),
        Fixed("crashing", error=RuntimeError("boom")),
    ]
    running = Served(tmp_path_factory.mktemp("srv"), capabilities, timeout=30)
    yield running
    running.listener.close()


def run_in_thread(client: WorkerClient, capability: str, payload: Any) -> tuple[threading.Thread, list[Answer]]:
    answers: list[Answer] = []
    thread = threading.Thread(target=lambda: answers.append(client.run(capability, payload)), daemon=True)
    thread.start()
    return thread, answers


def error(answer: Answer) -> tuple[int, str | None, bool]:
    assert set(answer.body) == {"error"} and set(answer.body["error"]) == {"code", "message", "retryable"}, answer.body
    return answer.status, answer.error_code, answer.body["error"]["retryable"]


def test_a_second_job_while_one_runs_is_refused_busy_and_retryable(served: Served, gate: Gate) -> None:
    first, answers = run_in_thread(served.client(), "gate", {"job": 1})
    assert gate.entered.wait(10)
    assert error(served.client().run("echoish", {"job": 2})) == (503, "worker_busy", True)
    assert error(served.client().run("gate", {"job": 3})) == (503, "worker_busy", True)
    assert served.client().status().status == 200  # status is never blocked by a job
    gate.opened.set()
    first.join(10)
    assert answers[0].status == 200 and answers[0].body == {"result": {"echo": {"job": 1}}}
    assert served.client().run("echoish", {"a": 1}).body == {"result": {"n": 1}}


def test_a_job_over_its_deadline_is_aborted_and_answered_504(tmp_path_factory: pytest.TempPathFactory) -> None:
    gate = Gate()
    running = Served(tmp_path_factory.mktemp("srv"), [gate, Fixed("echoish")], timeout=1)
    try:
        assert error(running.client().run("gate", {})) == (504, "job_timeout", True)
        assert gate.ended.wait(5), "the aborted job did not end"
        wait_until(lambda: not running.jobs.busy, 5, "the worker to be idle again")
        assert running.client().run("echoish", {}).status == 200
    finally:
        gate.opened.set()
        running.listener.close()


def test_a_job_that_ignores_its_abort_keeps_the_worker_busy_until_it_ends(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    stubborn = Gate(obeys_abort=False)
    running = Served(tmp_path_factory.mktemp("srv"), [stubborn, Fixed("echoish")], timeout=1)
    try:
        assert error(running.client().run("gate", {})) == (504, "job_timeout", True)
        assert error(running.client().run("echoish", {})) == (503, "worker_busy", True)  # never two jobs at once
        stubborn.opened.set()
        wait_until(lambda: not running.jobs.busy, 5, "the worker to be idle again")
        assert running.client().run("echoish", {}).status == 200
    finally:
        stubborn.opened.set()
        running.listener.close()


def test_stopping_aborts_the_running_job_and_refuses_new_ones(served: Served, gate: Gate) -> None:
    first, answers = run_in_thread(served.client(), "gate", {})
    assert gate.entered.wait(10)
    served.app.stopping = True
    assert served.jobs.stop(grace_seconds=5) is True
    first.join(10)
    assert error(answers[0]) == (503, "shutting_down", True)
    assert error(served.client().run("echoish", {})) == (503, "shutting_down", True)
    assert served.client().status().body["healthy"] is False


def test_unavailable_capabilities_are_refused_not_retryable(served: Served) -> None:
    assert error(served.client().run("quarantined", {})) == (409, "artifact_quarantined", False)
    answer = served.client().run("no-cuda", {})
    assert error(answer) == (409, "capability_unavailable", False)
    assert "cuda_unavailable" in answer.body["error"]["message"]


def test_a_failing_job_is_500_without_its_detail(served: Served) -> None:
    answer = served.client().run("crashing", {})
    assert error(answer) == (500, "job_failed", False)
    assert "boom" not in answer.body["error"]["message"]


def test_status_lists_every_capability(served: Served) -> None:
    body = served.client().status().body
    assert body["healthy"] is False  # two capabilities are unavailable
    assert [entry["name"] for entry in body["capabilities"]] == [
        "gate",
        "echoish",
        "quarantined",
        "no-cuda",
        "crashing",
    ]
    assert body["capabilities"][2] == {
        "name": "quarantined",
        "model": "stand-in",
        "model_sha256": None,
        "device": "cpu",
        "available": False,
        "reason": "artifact_quarantined",
    }


#: whether the connection can serve another request after the error (the body was read whole)
KEEPS = {"invalid_json", "invalid_request"}


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (JSON_POST + b"Content-Length: 7\r\n\r\n{nope!}", 400, "invalid_json"),
        (JSON_POST + b"Content-Length: 3\r\n\r\nNaN", 400, "invalid_json"),
        (JSON_POST + b"Content-Length: 2\r\n\r\n[]", 400, "invalid_request"),
        (JSON_POST + b"Content-Length: 2\r\n\r\n{}", 400, "invalid_request"),
        (JSON_POST + b"Content-Length: 2\r\n\r\n\xff\xfe", 400, "invalid_json"),
        (JSON_POST + b"\r\n", 411, "length_required"),
        (b"POST /v1/run HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, "length_required"),
        (b"POST /v1/run HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "transfer_encoding_not_supported"),
        (JSON_POST + b"Content-Length: -1\r\n\r\n", 400, "invalid_content_length"),
        (JSON_POST + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400, "invalid_content_length"),
        (JSON_POST + b"Content-Length: 9000000\r\n\r\n", 413, "payload_too_large"),
        (b"GET /v1/run HTTP/1.1\r\n\r\n", 405, "method_not_allowed"),
        (b"DELETE /v1/status HTTP/1.1\r\n\r\n", 405, "method_not_allowed"),
        (b"GET /v2/status HTTP/1.1\r\n\r\n", 404, "route_not_found"),
        (b"BREW /v1/status HTTP/1.1\r\n\r\n", 501, "method_not_implemented"),
        (b"this is not http\r\n\r\n", 400, "bad_request"),
        (b"GET /v1/status HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431, "headers_too_large"),
    ],
)
def test_protocol_errors_are_json_and_close_or_keep_the_connection_correctly(
    served: Served, request_bytes: bytes, status: int, code: str
) -> None:
    answers = served.exchange(request_bytes + b"GET /v1/status HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answers[0].status == status, answers[0].body
    body = answers[0].json()
    assert body["error"]["code"] == code and body["error"]["retryable"] is False
    assert answers[0].headers["content-type"] == "application/json"
    if code in KEEPS:
        assert [answer.status for answer in answers] == [status, 200]
    else:
        assert len(answers) == 1 and answers[0].headers["connection"] == "close"


def test_a_request_nested_too_deep_is_refused(served: Served) -> None:
    deep = "[" * 100 + "]" * 100
    body = f'{{"capability": "echoish", "input": {{"x": {deep}}}}}'.encode()
    answer = served.client().request("POST", "/v1/run", body)
    assert error(answer) == (400, "invalid_json", False)


def test_keep_alive_serves_several_requests_on_one_connection(served: Served) -> None:
    body = b'{"capability":"echoish","input":{"a":1,"b":2}}'
    run = JSON_POST + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    head = b"HEAD /v1/status HTTP/1.1\r\n\r\n"
    with served.connect() as sock:
        sock.sendall(run + head + run + b"GET /v1/status HTTP/1.1\r\nConnection: close\r\n\r\n")
        answers = split_answers(read_until_closed(sock), head_only=(False, True))
    assert [answer.status for answer in answers] == [200, 200, 200, 200]
    assert answers[0].json() == answers[2].json() == {"result": {"n": 2}}
    assert answers[1].body == b"" and int(answers[1].headers["content-length"]) > 0


def test_a_client_that_trickles_its_request_is_cut_off(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "READ_TIMEOUT_SECONDS", 0.5)  # read when the server is made
    served = Served(tmp_path_factory.mktemp("srv"), [Fixed("echoish")])
    try:
        with served.connect() as sock:
            closed_after = closed_within(sock, within=5, trickle=b"GET /v1/status HTTP/1.1\r\nX-Slow: " + b"a" * 100)
        assert closed_after is not None and closed_after < 3
        with served.connect() as idle:  # an idle connection is closed after the same time
            assert closed_within(idle, within=5) is not None
    finally:
        served.listener.close()


def test_connections_past_the_limit_get_503_at_once(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 2)
    running = Served(tmp_path_factory.mktemp("srv"), [Fixed("echoish")])
    held = [running.connect(), running.connect()]
    try:

        def refused() -> list | None:  # type: ignore[type-arg]
            # the two held connections count once the server has accepted both
            got = running.exchange(b"GET /v1/status HTTP/1.1\r\n\r\n", within=2)
            return got if got and got[0].status == 503 else None

        answers = wait_until(refused, 10, "a third connection refused with 503")
        assert answers[0].status == 503 and answers[0].json()["error"] == {
            "code": "server_busy",
            "message": "too many connections; retry shortly",
            "retryable": True,
        }
        for sock in held:
            sock.close()

        def served_again() -> bool:
            try:
                return running.client().status().status == 200
            except OSError:  # refused before the slots were released: closed before the request was read
                return False

        wait_until(served_again, 5, "a slot to free up")
    finally:
        for sock in held:
            sock.close()
        running.listener.close()


def test_the_socket_is_0660_and_removed_on_close(tmp_path: Path) -> None:
    running = Served(tmp_path, [Fixed("echoish")])
    assert stat.S_IMODE(os.stat(running.path).st_mode) == 0o660
    running.listener.close()
    assert not running.path.exists()


def test_a_stale_socket_is_replaced_but_a_live_one_or_a_file_is_not(tmp_path: Path) -> None:
    path = tmp_path / "w.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nothing listens: a worker that was killed
    first = Served(tmp_path, [Fixed("echoish")])
    try:
        assert first.client().status().status == 200
        with pytest.raises(ListenFailed, match="another process is listening"):
            Listener(Listen(url=f"unix://{path}", path=path))
        assert first.client().status().status == 200  # the live socket was left alone
    finally:
        first.listener.close()
    path.write_text("not a socket")
    with pytest.raises(ListenFailed, match="is not a socket"):
        Listener(Listen(url=f"unix://{path}", path=path))
    assert path.read_text() == "not a socket"


def test_a_replaced_socket_file_is_not_removed_by_the_old_worker(tmp_path: Path) -> None:
    running = Served(tmp_path, [Fixed("echoish")])
    running.path.unlink()
    running.path.write_text("someone else's")
    running.listener.close()
    assert running.path.read_text() == "someone else's"


def test_loopback_tcp_with_a_free_port(tmp_path: Path) -> None:
    listener = Listener(Listen(url="http://127.0.0.1:0", host="127.0.0.1", port=0))
    try:
        listener.serve(WorkerApp([Fixed("echoish")], JobRunner(5)), poll_interval=0.02)
        assert listener.address.startswith("http://127.0.0.1:") and not listener.address.endswith(":0")
        answer = WorkerClient(listener.address).run("echoish", {"x": [1]})
        assert answer.body == {"result": {"n": 1}}
    finally:
        listener.close()


def test_loopback_ipv6(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        listener = Listener(Listen(url="http://[::1]:0", host="::1", port=0))
    except ListenFailed as failed:
        pytest.skip(f"no IPv6 loopback here: {failed}")
    try:
        listener.serve(WorkerApp([Fixed("echoish")], JobRunner(5)), poll_interval=0.02)
        assert listener.address.startswith("http://[::1]:")
        assert WorkerClient(listener.address).status().status == 200
    finally:
        listener.close()


def test_the_error_shape_is_the_same_everywhere(served: Served) -> None:
    answer = served.client().request("POST", "/v1/run", json.dumps({"capability": "nope", "input": {}}).encode())
    assert error(answer) == (404, "unknown_capability", False)
    assert "echoish" in answer.body["error"]["message"]


def test_an_answered_status_ask_is_logged_at_debug_and_a_job_at_info(served: Served) -> None:
    """The agent asks for the status at every heartbeat: those lines would fill an idle log."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("modelforge.worker.http")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        assert served.client().status().status == 200
        assert served.client().run("echoish", {"a": 1}).status == 200
        wait_until(lambda: len(records) >= 2, 5, "both access lines")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    levels = {record.path: record.levelname for record in records}  # type: ignore[attr-defined]
    assert levels == {"/v1/status": "DEBUG", "/v1/run": "INFO"}
