"""The agent's client of its runtime worker, over real unix sockets and real loopback ports with
small fake workers: status judged (protocol verdict, schema, availability), runs bounded in time
and size; and the configuration of ``MODELFORGE_AGENT_WORKER_URL``."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from modelforge_node_agent.config import WORKER_URL, load_config
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID, exit_for
from modelforge_node_agent.failures import ConfigurationInvalid
from modelforge_node_agent.inventory import capabilities
from modelforge_node_agent.worker_client import (
    DEGRADED,
    INCOMPATIBLE,
    OK,
    UNREACHABLE,
    Cutter,
    WorkerClient,
    WorkerFailure,
    WorkerRefused,
)
from modelforge_protocol.versions import Verdict

from tests.agent.fake_worker import (
    ECHO,
    OCR,
    OCR_QUARANTINED,
    Drop,
    echo_result,
    fake_worker,
    socket_path,
    status_answer,
    worker_error,
)

TOKEN = "mfe.enr_" + "0" * 32 + "." + "A" * 43


# --- status --------------------------------------------------------------------------------------


@pytest.mark.parametrize("unix", [True, False], ids=["unix-socket", "loopback-port"])
def test_worker_status_ok_lists_what_it_can_run(unix: bool) -> None:
    with fake_worker(unix=unix) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == OK and view.verdict is Verdict.COMPATIBLE
    assert view.available == ("diagnostic.echo", "ocr") and view.claimable
    assert view.to_health() == {"status": "ok", "detail": "worker 1.3.0rc1: diagnostic.echo, ocr", "unavailable": []}


def test_worker_quarantined_capability_is_degraded_and_not_available() -> None:
    with fake_worker(status_answer(ECHO, OCR_QUARANTINED)) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == DEGRADED and view.available == ("diagnostic.echo",) and view.claimable
    assert view.to_health()["unavailable"] == [{"name": "ocr", "reason": "artifact_quarantined"}]
    assert "ocr (artifact_quarantined)" in view.detail
    assert capabilities([], view.available) == ["cpu", "diagnostic.echo"]


def test_worker_unhealthy_with_everything_available_is_degraded_and_not_claimable() -> None:
    with fake_worker(status_answer(ECHO, OCR, healthy=False)) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == DEGRADED and not view.claimable


@pytest.mark.parametrize(
    ("reported", "judged"),
    [
        (2, Verdict.TOO_NEW),
        (0, Verdict.UNKNOWN),
        ("1", Verdict.UNKNOWN),
        (True, Verdict.UNKNOWN),
        (None, Verdict.UNKNOWN),
    ],
)
def test_worker_with_another_protocol_is_incompatible_with_its_verdict_and_next_step(
    reported: Any, judged: Verdict
) -> None:
    with fake_worker(status_answer(protocol_version=reported)) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == INCOMPATIBLE and view.verdict is judged
    assert view.available == () and not view.claimable
    assert view.next_step and "COMPATIBILITY.md" in view.next_step and judged.value in view.detail


@pytest.mark.parametrize(
    ("answer", "status", "words"),
    [
        (
            {**status_answer(), "capabilities": [{**ECHO, "device": "tpu"}]},
            INCOMPATIBLE,
            "capabilities.0.device fails enum",
        ),
        ({"protocol_version": 1}, INCOMPATIBLE, "fails required"),
        ([1, 2], INCOMPATIBLE, "not a JSON object"),
        (b"<html>not a worker</html>", UNREACHABLE, "InvalidAnswer"),
        (b'{"protocol_version": 1, "pad": "' + b"x" * 300_000 + b'"}', UNREACHABLE, "larger than"),
    ],
)
def test_worker_status_that_is_not_the_protocol_is_never_believed(answer: Any, status: str, words: str) -> None:
    with fake_worker(answer) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == status and words in view.detail and view.available == ()


def test_worker_not_listening_is_unreachable() -> None:
    with socket_path() as path:
        view = WorkerClient(f"unix://{path}").status()
    assert view.status == UNREACHABLE and view.detail == "ConnectError on GET /v1/status"
    assert view.to_health()["status"] == "unreachable"


def test_worker_status_is_bounded_in_time_even_when_the_worker_never_answers() -> None:
    with socket_path() as path:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(4)  # accepted by the kernel, never answered
        try:
            started = time.monotonic()
            view = WorkerClient(f"unix://{path}", status_timeout_seconds=0.3).status()
            assert time.monotonic() - started < 2
        finally:
            listener.close()
    assert view.status == UNREACHABLE and "DeadlineExceeded" in view.detail


# --- runs ---------------------------------------------------------------------------------------


def test_worker_run_returns_the_result_and_sends_the_capability_and_input() -> None:
    with fake_worker() as worker:
        result = WorkerClient(worker.url).run("diagnostic.echo", {"text": "hé"})
    assert result == echo_result({"text": "hé"})
    assert worker.runs == [{"capability": "diagnostic.echo", "input": {"text": "hé"}}]


@pytest.mark.parametrize(
    ("answer", "code", "retryable"),
    [
        (worker_error(422, "invalid_input", "image_base64 is not a PNG or JPEG image", False), "invalid_input", False),
        (worker_error(503, "worker_busy", "another job is running", True), "worker_busy", True),
        (worker_error(504, "job_timeout", "the job ran over 120 s", True), "job_timeout", True),
        (worker_error(409, "artifact_quarantined", "ocr is unavailable", False), "artifact_quarantined", False),
    ],
)
def test_worker_run_error_carries_its_code_message_and_retryable(
    answer: tuple[int, Any], code: str, retryable: bool
) -> None:
    with fake_worker(run=lambda request: answer) as worker, pytest.raises(WorkerRefused) as refused:
        WorkerClient(worker.url).run("ocr", {"image_base64": "AAAA"})
    assert (refused.value.code, refused.value.retryable, refused.value.status) == (code, retryable, answer[0])
    assert refused.value.message == answer[1]["error"]["message"]


def test_worker_run_message_is_one_printable_line_of_bounded_length() -> None:
    answer = worker_error(422, "invalid_input", "bad\r\ninput\x1b[31m" + "x" * 5000, False)
    with fake_worker(run=lambda request: answer) as worker, pytest.raises(WorkerRefused) as refused:
        WorkerClient(worker.url).run("ocr", {})
    assert "\n" not in refused.value.message and "\x1b" not in refused.value.message
    assert len(refused.value.message) == 1024


@pytest.mark.parametrize(
    ("answer", "label"),
    [
        ((200, {"error": {"code": "x", "retryable": True}}), "InvalidAnswer (HTTP 200)"),
        ((500, {"result": {}}), "InvalidAnswer (HTTP 500)"),
        ((200, {"result": "text"}), "InvalidAnswer (HTTP 200)"),
        ((502, b"Bad Gateway"), "InvalidAnswer (HTTP 502)"),
    ],
)
def test_worker_run_answer_that_is_not_the_protocol_is_a_failure(answer: tuple[int, Any], label: str) -> None:
    with fake_worker(run=lambda request: answer) as worker, pytest.raises(WorkerFailure) as failed:
        WorkerClient(worker.url).run("diagnostic.echo", {})
    assert failed.value.label == label


def test_worker_that_drops_the_connection_is_a_failure() -> None:
    def crash(request: dict[str, Any]) -> tuple[int, Any]:
        raise Drop()

    with fake_worker(run=crash) as worker, pytest.raises(WorkerFailure) as failed:
        WorkerClient(worker.url).run("diagnostic.echo", {})
    assert failed.value.label == "Disconnected"


def test_worker_run_past_its_deadline_is_cut_and_a_cutter_ends_it_early() -> None:
    release = threading.Event()

    def slow(request: dict[str, Any]) -> tuple[int, Any]:
        release.wait(10)
        return 200, {"result": {}}

    with fake_worker(run=slow) as worker:
        started = time.monotonic()
        with pytest.raises(WorkerFailure) as failed:
            WorkerClient(worker.url, run_timeout_seconds=0.3).run("diagnostic.echo", {})
        assert failed.value.label == "DeadlineExceeded" and time.monotonic() - started < 3
        cutter = Cutter()
        threading.Timer(0.2, cutter.cut).start()
        with pytest.raises(WorkerFailure) as aborted:
            WorkerClient(worker.url).run("diagnostic.echo", {}, cutter)
        assert aborted.value.label == "Aborted"
        release.set()


def test_worker_run_answer_over_the_cap_is_refused_before_it_is_read() -> None:
    from modelforge_node_agent import worker_client

    huge = b'{"result": {"pad": "' + b"x" * (worker_client.MAX_RUN_ANSWER_BYTES + 10) + b'"}}'
    with fake_worker(run=lambda request: (200, huge)) as worker, pytest.raises(WorkerFailure) as failed:
        WorkerClient(worker.url).run("diagnostic.echo", {})
    assert "larger than" in failed.value.detail


# --- cancel ---------------------------------------------------------------------------------------


def test_worker_status_features_say_whether_the_worker_cancels() -> None:
    with fake_worker(status_answer(features=["cancel", "something_later"])) as new, fake_worker() as old:
        assert WorkerClient(new.url).status().cancels is True
        assert WorkerClient(old.url).status().cancels is False  # a 1.3.0 worker lists no features


def test_worker_status_slots_come_from_a_worker_that_lists_the_feature() -> None:
    without_feature = {**status_answer(), "slots": {"total": 4, "busy": 0}}  # not advertised: not used
    with (
        fake_worker(status_answer(slots=3)) as new,
        fake_worker() as old,
        fake_worker(without_feature) as unadvertised,
        fake_worker(status_answer(features=["slots"])) as missing,
    ):
        assert WorkerClient(new.url).status().slots == 3
        assert WorkerClient(old.url).status().slots == 1  # a worker before slots runs one job at a time
        assert WorkerClient(unadvertised.url).status().slots == 1
        assert WorkerClient(missing.url).status().slots == 1


@pytest.mark.parametrize("slots", [0, 65, "2", {"total": 2}])
def test_worker_status_with_malformed_slots_is_incompatible(slots: Any) -> None:
    answer = {
        **status_answer(features=["slots"]),
        "slots": slots if isinstance(slots, dict) else {"total": slots, "busy": 0},
    }
    with fake_worker(answer) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == INCOMPATIBLE and "slots" in view.detail and view.slots == 1


def test_worker_status_with_malformed_features_is_incompatible() -> None:
    with fake_worker(status_answer(features=["Not A Feature!"])) as worker:
        view = WorkerClient(worker.url).status()
    assert view.status == INCOMPATIBLE and "features" in view.detail and not view.cancels


def test_worker_run_sends_the_job_id_only_when_given() -> None:
    with fake_worker() as worker:
        client = WorkerClient(worker.url)
        client.run("diagnostic.echo", {"n": 1})
        client.run("diagnostic.echo", {"n": 2}, job_id="work_1:2")
    assert worker.runs == [
        {"capability": "diagnostic.echo", "input": {"n": 1}},
        {"capability": "diagnostic.echo", "input": {"n": 2}, "job_id": "work_1:2"},
    ]


@pytest.mark.parametrize("state", ["ended", "ending", "not_running"])
def test_worker_cancel_answers_what_the_worker_says_of_the_job(state: str) -> None:
    with fake_worker(cancel=lambda request: (200, {"job_id": request["job_id"], "state": state})) as worker:
        assert WorkerClient(worker.url).cancel("work_1:2") == state
    assert worker.cancels == [{"job_id": "work_1:2"}]


@pytest.mark.parametrize(
    ("answer", "error", "label_or_code"),
    [
        ((200, {"job_id": "work_1:2", "state": "exploded"}), WorkerFailure, "InvalidAnswer (HTTP 200)"),
        ((200, b"not json"), WorkerFailure, "InvalidAnswer (HTTP 200)"),
        ((502, b"Bad Gateway"), WorkerFailure, "InvalidAnswer (HTTP 502)"),
        (worker_error(400, "invalid_request", "job_id must be ...", False), WorkerRefused, "invalid_request"),
    ],
)
def test_worker_cancel_answer_that_is_not_a_state_is_a_failure_or_a_refusal(
    answer: tuple[int, Any], error: type[Exception], label_or_code: str
) -> None:
    with fake_worker(cancel=lambda request: answer) as worker, pytest.raises(error) as failed:
        WorkerClient(worker.url).cancel("work_1:2")
    assert getattr(failed.value, "label", None) == label_or_code or getattr(failed.value, "code", None) == label_or_code


def test_worker_cancel_to_a_worker_without_it_is_refused_404() -> None:
    with fake_worker() as worker, pytest.raises(WorkerRefused) as refused:
        WorkerClient(worker.url).cancel("work_1:2")
    assert (refused.value.status, refused.value.code) == (404, "route_not_found")


def test_worker_cancel_is_bounded_in_time() -> None:
    release = threading.Event()

    def stuck(request: dict[str, Any]) -> tuple[int, Any]:
        release.wait(10)
        return 200, {"job_id": request["job_id"], "state": "ended"}

    with fake_worker(cancel=stuck) as worker:
        started = time.monotonic()
        with pytest.raises(WorkerFailure) as failed:
            WorkerClient(worker.url, cancel_timeout_seconds=0.3).cancel("work_1:2")
        assert failed.value.label == "DeadlineExceeded" and time.monotonic() - started < 3
        release.set()


# --- configuration --------------------------------------------------------------------------------


def _env(tmp_path: Path, url: str | None) -> dict[str, str]:
    env = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "https://cp.internal:8443",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
        "MODELFORGE_AGENT_HOSTNAME": "gpu_node",
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
    }
    if url is not None:
        env[WORKER_URL] = url
    return env


def test_config_without_a_worker_url_runs_no_work(tmp_path: Path) -> None:
    assert load_config(_env(tmp_path, None)).worker_url is None
    assert load_config(_env(tmp_path, "  ")).worker_url is None


@pytest.mark.parametrize(
    "url",
    [
        "unix:///var/lib/modelforge/worker/worker.sock",
        "http://127.0.0.1:8090",
        "http://[::1]:8090",
        "http://localhost:8090",
        "http://127.0.0.1:8090/",
    ],
)
def test_config_worker_url_on_a_unix_socket_or_loopback_is_accepted(tmp_path: Path, url: str) -> None:
    assert load_config(_env(tmp_path, url)).worker_url == url.rstrip("/")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:8090",  # not loopback
        "https://127.0.0.1:8090",  # the worker speaks plain HTTP on loopback
        "http://127.0.0.1",  # no port
        "http://127.0.0.1:0",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:8090/v1",
        "http://user@127.0.0.1:8090",
        "http://worker.internal:8090",
        "unix://relative/worker.sock",
        "unix:///run/modelforge/",
        "unix:///" + "x" * 120,
        "tcp://127.0.0.1:8090",
        "/var/lib/modelforge/worker.sock",
    ],
)
def test_config_worker_url_anywhere_else_is_a_configuration_error_named_by_variable(tmp_path: Path, url: str) -> None:
    with pytest.raises(ConfigurationInvalid) as invalid:
        load_config(_env(tmp_path, url))
    assert WORKER_URL in invalid.value.message
    assert exit_for(invalid.value).code == CONFIGURATION_INVALID
