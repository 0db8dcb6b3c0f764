"""The agent's work loop end to end in-process: the real Agent and work loop, a fake control plane
with the work routes on 127.0.0.1, a fake presigned-URL object store, and a small fake runtime
worker on a real unix socket. Real threads and real (short) time: heartbeats every 0.1 s."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from modelforge_node_agent.agent import Agent
from modelforge_node_agent.config import load_config
from modelforge_node_agent.control_plane import COMPLETE, ENROLL, HEARTBEAT, INVENTORY, WORK_CLAIM, work_path
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID, IDENTITY_REFUSED, exit_for
from modelforge_node_agent.failures import RedirectRefused
from modelforge_node_agent.main import run_agent
from modelforge_node_agent.work import WorkRunner, for_config
from modelforge_node_agent.work.claimed import default_renew_interval
from modelforge_node_agent.work.transfers import TransferFailed, check_presigned_url
from modelforge_protocol import schemas, work
from modelforge_protocol.canonical import canonical_bytes

from tests.agent.fake_control_plane import (
    SIGNATURE,
    TOKEN,
    FakeServer,
    FakeWork,
    ObjectServer,
    Reply,
    SilentListener,
    error_reply,
    fake_server,
    in_process_agent,
    json_reply,
    no_content_reply,
)
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
from tests.support.polling import wait_until

ECHO_CAPABILITY = "diagnostic.echo"
WORKER_OK = {"status": "ok", "detail": "worker 1.3.0rc1: diagnostic.echo, ocr", "unavailable": []}


@dataclass
class Running:
    plane: FakeServer
    work: FakeWork
    objects: ObjectServer
    agent: Agent
    runner: WorkRunner
    stop: threading.Event
    thread: threading.Thread
    errors: list[BaseException]

    def heartbeats(self) -> list[dict[str, Any]]:
        return self.plane.bodies(HEARTBEAT)

    def claims(self) -> int:
        return self.plane.paths().count(WORK_CLAIM)

    def wait_heartbeats(self, count: int) -> None:
        target = len(self.heartbeats()) + count
        wait_until(lambda: len(self.heartbeats()) >= target, 10, f"{count} more heartbeats")

    def wait_outcomes(self, count: int) -> list[str]:
        wait_until(
            lambda: len(self.runner.outcomes) >= count,
            10,
            f"{count} finished jobs",
            detail=lambda: repr(self.runner.outcomes),
        )
        return self.runner.outcomes


@contextmanager
def running_agent(
    tmp_path: Path,
    worker_url: str | None,
    *,
    replies: dict[str, Reply | list[Reply]] | None = None,
    renew_interval: Callable[[float], float] | None = None,
) -> Iterator[Running]:
    """The real agent publishing every 0.1 s on its own thread (stopped on exit), with the real
    work loop when ``worker_url`` is given."""
    objects = ObjectServer()
    work = FakeWork(objects)
    try:
        with fake_server(replies, work=work) as plane:
            settings = {
                "MODELFORGE_AGENT_CONTROL_PLANE_URL": plane.url,
                "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
                "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
                "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
                "MODELFORGE_AGENT_HOSTNAME": "fake_node",
                "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "0.1",
                "MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS": "2",
            }
            if worker_url is not None:
                settings["MODELFORGE_AGENT_WORKER_URL"] = worker_url
            options = {"renew_interval": renew_interval} if renew_interval is not None else {}
            runner = for_config(load_config(settings), **options) if worker_url is not None else None
            stop = threading.Event()
            agent, _ = in_process_agent(settings, stop=stop, clock=time.monotonic, work=runner)
            errors: list[BaseException] = []

            def publish() -> None:
                try:
                    agent.run()
                except BaseException as error:  # noqa: BLE001 - the test looks at it
                    errors.append(error)

            thread = threading.Thread(target=publish, name="test-publisher", daemon=True)
            thread.start()
            try:
                yield Running(plane, work, objects, agent, runner, stop, thread, errors)  # type: ignore[arg-type]
            finally:
                stop.set()
                thread.join(5)
                assert not thread.is_alive(), "the agent did not stop"
    finally:
        objects.close()


def _last_health(running: Running) -> dict[str, Any]:
    return running.heartbeats()[-1]["health"]


_REQUESTS = {
    ENROLL: schemas.ENROLL,
    HEARTBEAT: schemas.HEARTBEAT,
    INVENTORY: schemas.REPLACE_INVENTORY,
    WORK_CLAIM: schemas.EMPTY,
    "renew": work.RENEW_WORK,
    "complete": work.COMPLETE_WORK,
    "fail": work.FAIL_WORK,
}


def _assert_wire(plane: FakeServer) -> None:
    """Everything the agent sent matches the protocol's request schemas (the control plane's view)."""
    for seen in list(plane.seen):
        schema = _REQUESTS.get(seen.path) or _REQUESTS[seen.path.rsplit("/", 1)[-1]]
        Draft202012Validator(schema).validate(seen.body)


# --- claiming --------------------------------------------------------------------------------------


def test_work_an_idle_node_never_claims_and_claims_once_hinted(tmp_path: Path) -> None:
    with fake_worker() as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(5)
        assert running.claims() == 0  # no hint, no claim
        item = running.work.submit(ECHO_CAPABILITY, {"text": "hello"})
        assert running.wait_outcomes(1) == ["succeeded"]
        wait_until(lambda: running.work.claims == [200, 204], 5, "the drain to end with 204")
        running.wait_heartbeats(5)
        assert running.work.claims == [200, 204]  # drained: nothing more until the next hint
        assert running.work.items[item.work_id].status == "succeeded"
        assert running.errors == []
    _assert_wire(running.plane)


def test_work_drains_until_the_claim_answers_204(tmp_path: Path) -> None:
    with fake_worker() as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(1)
        items = [running.work.submit(ECHO_CAPABILITY, {"n": n}) for n in range(3)]
        assert running.wait_outcomes(3) == ["succeeded"] * 3
        wait_until(lambda: running.work.claims == [200, 200, 200, 204], 5, "three claims then 204")
        running.wait_heartbeats(3)
        assert running.work.claims == [200, 200, 200, 204]
        assert [work_id for work_id, _ in running.work.completions] == [item.work_id for item in items]
        assert [run["input"] for run in worker.runs] == [{"n": 0}, {"n": 1}, {"n": 2}]


class _Overlap:
    """Runs that wait until ``width`` of them are running at once (or 3 s), and record the most
    that ever ran together."""

    def __init__(self, width: int, wait_seconds: float = 3.0) -> None:
        self.width, self.running, self.most, self.wait_seconds = width, 0, 0, wait_seconds
        self.guard = threading.Condition()

    def run(self, request: dict[str, Any]) -> tuple[int, Any]:
        with self.guard:
            self.running += 1
            self.most = max(self.most, self.running)
            self.guard.notify_all()
            self.guard.wait_for(lambda: self.running >= self.width, self.wait_seconds)
        time.sleep(0.05)
        with self.guard:
            self.running -= 1
        return 200, {"result": echo_result(request["input"])}


def test_work_a_worker_with_two_slots_runs_two_items_at_once(tmp_path: Path) -> None:
    overlap = _Overlap(2)
    status = status_answer(ECHO, OCR, features=["cancel"], slots=2)
    with fake_worker(status, overlap.run) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(1)
        items = [running.work.submit(ECHO_CAPABILITY, {"n": n}) for n in range(4)]
        assert running.wait_outcomes(4) == ["succeeded"] * 4
        assert overlap.most == 2  # two claims, two runs at once: never a third
        assert sorted(work_id for work_id, _ in running.work.completions) == sorted(i.work_id for i in items)
        assert {run["job_id"] for run in worker.runs} == {f"{item.work_id}:1" for item in items}


def test_work_heartbeats_report_the_slots_only_to_a_control_plane_that_lists_them(tmp_path: Path) -> None:
    gate = threading.Event()

    def held(request: dict[str, Any]) -> tuple[int, Any]:
        gate.wait(10)
        return 200, {"result": echo_result(request["input"])}

    status = status_answer(ECHO, OCR, features=["cancel"], slots=2)
    with fake_worker(status, held) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(2)
        assert all("slots" not in body for body in running.heartbeats())  # not listed: never sent
        running.work.features = ["slots"]
        running.work.submit(ECHO_CAPABILITY, {"n": 1})
        wait_until(
            lambda: running.heartbeats()[-1].get("slots") == {"total": 2, "busy": 1, "schedulable": 2},
            10,
            "a heartbeat with one slot busy",
        )
        gate.set()
        assert running.wait_outcomes(1) == ["succeeded"]
        running.wait_heartbeats(2)
        assert running.heartbeats()[-1]["slots"] == {"total": 2, "busy": 0, "schedulable": 2}
    _assert_wire(running.plane)


def test_work_a_worker_without_the_slots_feature_gets_one_run_at_a_time(tmp_path: Path) -> None:
    overlap = _Overlap(2, wait_seconds=0.3)
    with fake_worker(status_answer(ECHO, OCR), overlap.run) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(1)
        for n in range(3):
            running.work.submit(ECHO_CAPABILITY, {"n": n})
        assert running.wait_outcomes(3) == ["succeeded"] * 3
        assert overlap.most == 1 and running.runner.slots == 1


def test_work_complete_carries_the_sha256_and_size_of_the_uploaded_canonical_result(tmp_path: Path) -> None:
    document = {"text": "grüße", "list": [3, 1, 2], "nested": {"b": 1, "a": 2}}
    with fake_worker() as worker, running_agent(tmp_path, worker.url) as running:
        item = running.work.submit(ECHO_CAPABILITY, document)
        assert running.wait_outcomes(1) == ["succeeded"]
    (upload,) = running.objects.puts()
    expected = canonical_bytes(echo_result(document))
    assert upload.key == f"results/{item.work_id}/1.json" and upload.body == expected
    assert upload.headers["Content-Type"] == "application/json"
    (completed,) = running.work.completions
    assert completed == (
        item.work_id,
        {"epoch": 1, "sha256": hashlib.sha256(expected).hexdigest(), "size": len(expected)},
    )
    for request in running.objects.requests:  # the presigned URL is the only credential there
        assert "Authorization" not in request.headers and "X-ModelForge-Node-Id" not in request.headers


def test_work_without_a_worker_url_the_agent_claims_nothing_and_reports_plain_health(tmp_path: Path) -> None:
    with running_agent(tmp_path, None) as running:
        running.work.submit(ECHO_CAPABILITY, {})
        running.wait_heartbeats(5)
        assert running.claims() == 0
        assert _last_health(running) == {"status": "ok"}
        assert running.plane.bodies(ENROLL)[0]["inventory"]["capabilities"] == ["cpu"]


# --- the lease ---------------------------------------------------------------------------------------


def test_work_lease_is_renewed_at_its_interval_while_the_worker_runs(tmp_path: Path) -> None:
    def slow(request: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(1.0)  # the job itself
        return 200, {"result": echo_result(request["input"])}

    with (
        fake_worker(run=slow) as worker,
        running_agent(tmp_path, worker.url, renew_interval=lambda lease: lease / 50) as running,
    ):
        item = running.work.submit(ECHO_CAPABILITY, {}, lease_seconds=10)  # renewed every 0.2 s
        assert running.wait_outcomes(1) == ["succeeded"]
    times = [at for at, work_id, epoch in running.work.renewals if work_id == item.work_id and epoch == 1]
    assert 3 <= len(times) <= 6, times
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(gap >= 0.15 for gap in gaps), gaps


def test_work_default_renewal_is_a_third_of_the_lease() -> None:
    assert default_renew_interval(30) == 10 and default_renew_interval(10) == pytest.approx(3.333, abs=0.001)


@pytest.mark.parametrize("code", ["work_cancelled", "lease_lost"])
def test_work_a_renewal_answered_409_stops_the_job_and_uploads_nothing(
    tmp_path: Path, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    def held(request: dict[str, Any]) -> tuple[int, Any]:
        release.wait(10)
        return 200, {"result": echo_result(request["input"])}

    with (
        fake_worker(run=held) as worker,
        running_agent(tmp_path, worker.url, renew_interval=lambda lease: 0.1) as running,
        caplog.at_level(logging.INFO, logger="modelforge.agent"),
    ):
        first = running.work.submit(ECHO_CAPABILITY, {"n": 1}, on_renew=lambda n: (409, code))
        assert running.wait_outcomes(1) == [code]
        # the worker still runs the first job: the next item is not claimed before it ends
        second = running.work.submit(ECHO_CAPABILITY, {"n": 2})
        running.wait_heartbeats(4)
        assert running.work.claims == [200] and len(worker.runs) == 1
        release.set()
        assert running.wait_outcomes(2) == [code, "succeeded"]
    assert [work_id for work_id, _ in running.work.completions] == [second.work_id]
    assert [upload.key for upload in running.objects.puts()] == [f"results/{second.work_id}/1.json"]
    assert running.work.failures == []
    lost = [record for record in caplog.records if getattr(record, "event", "") == "work_lease_lost"]
    assert len(lost) == 1 and lost[0].work_id == first.work_id and lost[0].code == code  # type: ignore[attr-defined]


# --- failures ----------------------------------------------------------------------------------------


def _failure(running: Running) -> dict[str, Any]:
    wait_until(lambda: running.work.failures, 10, "a failure")
    return running.work.failures[0][1]


def test_work_a_crashed_worker_fails_the_work_retryable_and_claims_stop(tmp_path: Path) -> None:
    def crash(request: dict[str, Any]) -> tuple[int, Any]:
        raise Drop()

    with fake_worker(run=crash) as worker, running_agent(tmp_path, worker.url) as running:
        running.work.submit(ECHO_CAPABILITY, {})
        failure = _failure(running)
        running.wait_heartbeats(3)
        assert running.work.claims == [200]  # no drain after a failure of the node's own
    assert failure == {"epoch": 1, "reason": "worker_unreachable: Disconnected", "retryable": True}
    _assert_wire(running.plane)


@pytest.mark.parametrize(
    ("answer", "retryable"),
    [
        (worker_error(503, "worker_busy", "another job is running; retry when it is done", True), True),
        (worker_error(504, "job_timeout", "the job ran over 120 s and was aborted", True), True),
        # the worker cannot serve it; the work is fine and another node can: retryable
        (worker_error(409, "artifact_quarantined", "ocr is unavailable (artifact_quarantined)", False), True),
        (worker_error(500, "job_failed", "ocr failed (ValueError)", False), False),
    ],
)
def test_work_worker_errors_fail_the_work_with_its_message_and_retryable(
    tmp_path: Path, answer: tuple[int, Any], retryable: bool
) -> None:
    with fake_worker(run=lambda request: answer) as worker, running_agent(tmp_path, worker.url) as running:
        running.work.submit(ECHO_CAPABILITY, {})
        failure = _failure(running)
    assert failure == {"epoch": 1, "reason": answer[1]["error"]["message"], "retryable": retryable}


def test_work_a_busy_worker_is_failed_as_a_node_fault_where_the_control_plane_lists_it(tmp_path: Path) -> None:
    busy = worker_error(503, "worker_busy", "all 2 slots are running jobs; retry when one is done", True)
    with fake_worker(run=lambda request: busy) as worker, running_agent(tmp_path, worker.url) as running:
        running.work.features = ["node_fault"]
        running.wait_heartbeats(2)
        running.work.submit(ECHO_CAPABILITY, {})
        failure = _failure(running)
    assert failure == {"epoch": 1, "reason": busy[1]["error"]["message"], "retryable": True, "node_fault": True}


def test_work_invalid_input_fails_not_retryable_with_the_workers_message_and_the_drain_goes_on(tmp_path: Path) -> None:
    message = "image_base64 is not a PNG or JPEG image"

    def judge(request: dict[str, Any]) -> tuple[int, Any]:
        if request["input"].get("bad"):
            return worker_error(422, "invalid_input", message, False)
        return 200, {"result": echo_result(request["input"])}

    with fake_worker(run=judge) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(1)
        bad = running.work.submit(ECHO_CAPABILITY, {"bad": True})
        good = running.work.submit(ECHO_CAPABILITY, {"bad": False})
        assert running.wait_outcomes(2) == ["failed", "succeeded"]
    assert running.work.failures == [(bad.work_id, {"epoch": 1, "reason": message, "retryable": False})]
    assert [work_id for work_id, _ in running.work.completions] == [good.work_id]


def test_work_result_checksum_mismatch_at_completion_fails_the_work_retryable(tmp_path: Path) -> None:
    with fake_worker() as worker, running_agent(tmp_path, worker.url) as running:
        item = running.work.submit(ECHO_CAPABILITY, {})
        running.plane.replies[work_path(item.work_id, COMPLETE)] = error_reply(409, "result_checksum_mismatch")
        failure = _failure(running)
    assert failure["retryable"] is True and failure["reason"].startswith("result_checksum_mismatch")


def test_work_stopping_the_agent_during_a_job_fails_it_retryable(tmp_path: Path) -> None:
    release = threading.Event()

    def held(request: dict[str, Any]) -> tuple[int, Any]:
        release.wait(10)
        return 200, {"result": {}}

    with fake_worker(run=held) as worker:
        with running_agent(tmp_path, worker.url) as running:
            running.work.submit(ECHO_CAPABILITY, {})
            wait_until(lambda: worker.runs, 10, "the run to start")
            started = time.monotonic()
            running.stop.set()
            running.thread.join(5)
            assert time.monotonic() - started < 2
        failure = _failure(running)
        release.set()
    assert failure["retryable"] is True and failure["reason"].startswith("agent_stopping")
    assert running.objects.puts() == []


# --- the worker's status: inventory and health --------------------------------------------------------


def test_work_health_reports_the_worker_and_its_status_is_polled_at_most_once_per_heartbeat(tmp_path: Path) -> None:
    with fake_worker() as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(6)
        polls, beats = worker.status_calls, len(running.heartbeats())
        assert polls <= beats + 1  # one before enrolling (used by the first heartbeat), then one per heartbeat
        assert _last_health(running) == {"status": "ok", "worker": WORKER_OK}
    assert running.plane.bodies(ENROLL)[0]["inventory"]["capabilities"] == ["cpu", "diagnostic.echo", "ocr"]


def test_work_quarantined_capability_is_not_advertised_and_health_says_why(tmp_path: Path) -> None:
    with fake_worker(status_answer(ECHO, OCR_QUARANTINED)) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(2)
        health = _last_health(running)
    assert running.plane.bodies(ENROLL)[0]["inventory"]["capabilities"] == ["cpu", "diagnostic.echo"]
    assert health["status"] == "degraded" and "ocr (artifact_quarantined)" in health["detail"]
    assert health["worker"]["status"] == "degraded"
    assert health["worker"]["unavailable"] == [{"name": "ocr", "reason": "artifact_quarantined"}]
    _assert_wire(running.plane)


def test_work_inventory_is_sent_again_only_when_the_workers_capabilities_change(tmp_path: Path) -> None:
    current = {"answer": status_answer(ECHO, OCR)}
    with fake_worker(lambda: current["answer"]) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(4)
        assert running.plane.bodies(INVENTORY) == []  # the enrollment carried it; nothing changed since
        current["answer"] = status_answer(ECHO, OCR_QUARANTINED)
        wait_until(lambda: running.plane.bodies(INVENTORY), 5, "the changed inventory")
        running.wait_heartbeats(4)
        sent = running.plane.bodies(INVENTORY)
    assert [body["inventory"]["capabilities"] for body in sent] == [["cpu", "diagnostic.echo"]]
    _assert_wire(running.plane)


def test_work_incompatible_worker_gets_no_claims_and_its_verdict_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="modelforge.agent"),
        fake_worker(status_answer(protocol_version=2)) as worker,
        running_agent(tmp_path, worker.url) as running,
    ):
        running.work.submit(ECHO_CAPABILITY, {})
        running.wait_heartbeats(6)
        assert running.claims() == 0 and worker.runs == []
        health = _last_health(running)
    assert health["status"] == "degraded" and health["worker"]["status"] == "incompatible"
    assert running.plane.bodies(ENROLL)[0]["inventory"]["capabilities"] == ["cpu"]
    logged = [record for record in caplog.records if getattr(record, "event", "") == "worker_status"]
    assert len(logged) == 1  # once, not every heartbeat
    assert logged[0].verdict == "TOO_NEW" and "COMPATIBILITY.md" in logged[0].next_step  # type: ignore[attr-defined]
    assert "TOO_NEW" in logged[0].getMessage() and "claiming no work" in logged[0].getMessage()
    _assert_wire(running.plane)


def test_work_unreachable_worker_gets_no_claims_and_health_is_degraded(tmp_path: Path) -> None:
    with socket_path() as path, running_agent(tmp_path, f"unix://{path}") as running:
        running.work.submit(ECHO_CAPABILITY, {})
        running.wait_heartbeats(4)
        assert running.claims() == 0
        health = _last_health(running)
    assert health["status"] == "degraded"
    assert health["worker"] == {"status": "unreachable", "detail": "ConnectError on GET /v1/status", "unavailable": []}
    _assert_wire(running.plane)


def test_work_worker_on_a_loopback_port_runs_work_too(tmp_path: Path) -> None:
    with fake_worker(unix=False) as worker, running_agent(tmp_path, worker.url) as running:
        running.work.submit(ECHO_CAPABILITY, {"via": "tcp"})
        assert running.wait_outcomes(1) == ["succeeded"]


# --- presigned URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["input", "result"])
def test_work_presigned_url_that_redirects_is_refused_and_not_followed(tmp_path: Path, which: str) -> None:
    elsewhere = SilentListener()
    try:
        with fake_worker() as worker, running_agent(tmp_path, worker.url) as running:
            running.wait_heartbeats(1)
            item = running.work.submit(ECHO_CAPABILITY, {})
            key = item.input_key if which == "input" else f"results/{item.work_id}/1.json"
            running.objects.redirects[key] = elsewhere.url + "/bucket/" + key
            failure = _failure(running)
        assert elsewhere.connections_waiting() == 0
    finally:
        elsewhere.close()
    method = "GET" if which == "input" else "PUT"
    verb = "input_download_failed" if which == "input" else "result_upload_failed"
    assert failure == {
        "epoch": 1,
        "reason": f"{verb}: HTTP 307 redirect on {method} {which} (not followed)",
        "retryable": True,
    }
    assert running.work.completions == []
    assert len(worker.runs) == (0 if which == "input" else 1)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:9000/bucket/x?sig=1",
        "http://s3.amazonaws.com/bucket/x",
        "ftp://127.0.0.1/x",
        "https://user:pw@s3.amazonaws.com/x",
        "https://[::1/x",
    ],
)
def test_work_presigned_url_must_be_https_or_loopback(url: str) -> None:
    with pytest.raises(TransferFailed) as refused:
        check_presigned_url(url)
    assert url not in refused.value.reason and "refused" in refused.value.reason


@pytest.mark.parametrize(
    "url", ["https://bucket.s3.amazonaws.com/x?X-Amz-Signature=1", "http://127.0.0.1:9000/x", "http://[::1]:9000/x"]
)
def test_work_presigned_url_https_or_loopback_http_is_used(url: str) -> None:
    check_presigned_url(url)


def test_work_presigned_urls_never_reach_a_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger="modelforge"),
        fake_worker() as worker,
        running_agent(tmp_path, worker.url) as running,
    ):
        running.wait_heartbeats(1)
        running.work.submit(ECHO_CAPABILITY, {"n": 1})
        denied = running.work.submit(ECHO_CAPABILITY, {"n": 2})
        running.objects.statuses[("GET", denied.input_key)] = 403
        assert running.wait_outcomes(2) == ["succeeded", "failed"]
    text = caplog.text + "".join(repr(vars(record)) for record in caplog.records)
    assert "work_claimed" in text and "work_finished" in text
    assert SIGNATURE not in text and "X-Amz" not in text and "/bucket/" not in text
    assert running.work.failures[0][1]["reason"] == "input_download_failed: HTTP 403 on GET input"


# --- answers from the control plane --------------------------------------------------------------------


def test_work_claim_refused_node_not_online_is_logged_and_claimed_again_at_the_next_hint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At debug level: each slot's first claim can race the node's first heartbeat, and the
    heartbeat says when it is online (8 GPU slots made 8 warnings at every start)."""
    replies: dict[str, Reply | list[Reply]] = {WORK_CLAIM: [error_reply(409, "node_not_online"), no_content_reply()]}
    with (
        caplog.at_level(logging.DEBUG, logger="modelforge.agent"),
        fake_worker() as worker,
        running_agent(tmp_path, worker.url, replies=replies) as running,
    ):
        running.work.submit(ECHO_CAPABILITY, {})
        wait_until(lambda: running.claims() >= 2, 5, "a second claim at a later hint")
        assert running.errors == [] and running.thread.is_alive()
    refused = [record for record in caplog.records if getattr(record, "code", "") == "node_not_online"]
    assert refused and all(record.levelno == logging.DEBUG for record in refused)


@pytest.mark.parametrize(
    ("reply", "error", "exit_code"),
    [
        (json_reply(307, {}, {"Location": "https://elsewhere.example/claim"}), RedirectRefused, CONFIGURATION_INVALID),
        (error_reply(401, "credential_revoked"), None, IDENTITY_REFUSED),
    ],
)
def test_work_fatal_claim_answers_stop_the_agent_as_a_heartbeat_would(
    tmp_path: Path, reply: Reply, error: type | None, exit_code: int
) -> None:
    with fake_worker() as worker, running_agent(tmp_path, worker.url, replies={WORK_CLAIM: reply}) as running:
        running.work.submit(ECHO_CAPABILITY, {})
        running.thread.join(5)
        assert not running.thread.is_alive()
    (stopped,) = running.errors
    assert error is None or isinstance(stopped, error)
    assert exit_for(stopped).code == exit_code


def test_work_claim_of_a_capability_the_worker_no_longer_offers_fails_retryable_without_running(tmp_path: Path) -> None:
    with fake_worker(status_answer(ECHO, OCR_QUARANTINED)) as worker, running_agent(tmp_path, worker.url) as running:
        running.wait_heartbeats(1)
        running.work.submit("ocr", {"image_base64": "AAAA"})  # as if the control plane still thought it could
        failure = _failure(running)
    assert failure["retryable"] is True and failure["reason"].startswith("capability_unavailable")
    assert worker.runs == []


def test_work_the_entry_points_run_agent_wires_the_work_loop(tmp_path: Path) -> None:
    objects = ObjectServer()
    queue = FakeWork(objects)
    try:
        with fake_worker() as worker, fake_server(work=queue) as plane:
            config = load_config(
                {
                    "MODELFORGE_AGENT_CONTROL_PLANE_URL": plane.url,
                    "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
                    "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
                    "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
                    "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "0.1",
                    "MODELFORGE_AGENT_WORKER_URL": worker.url,
                }
            )
            stop = threading.Event()
            codes: list[int] = []
            thread = threading.Thread(target=lambda: codes.append(run_agent(config, stop=stop)), daemon=True)
            thread.start()
            item = queue.submit(ECHO_CAPABILITY, {"from": "run_agent"})
            wait_until(lambda: queue.completions, 10, "the work to complete")
            stop.set()
            thread.join(5)
    finally:
        objects.close()
    assert codes == [0] and queue.items[item.work_id].status == "succeeded"
