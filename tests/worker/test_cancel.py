"""Cancel in the worker, in this process: ``diagnostic.sleep`` on its own (input checks, abort),
the job runner's cancel by job id (the caller's answer comes once the job has unwound, a cancel
that overtakes its run, a job that ignores its abort), and ``POST /v1/cancel`` over HTTP with
stand-in capabilities whose timing the test controls (gates and events, not sleeps)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelforge_protocol import work
from modelforge_runtime_worker import errors
from modelforge_runtime_worker.app import WorkerApp
from modelforge_runtime_worker.capabilities import Sleep
from modelforge_runtime_worker.client import Answer, WorkerClient
from modelforge_runtime_worker.config import Listen
from modelforge_runtime_worker.jobs import REMEMBERED_CANCELS, JobRunner
from modelforge_runtime_worker.ocr import Cancel, JobCancelled
from modelforge_runtime_worker.server import Listener

from tests.support.polling import wait_until
from tests.worker.test_server import Gate


def _error(answer: Answer) -> tuple[int, str | None, bool]:
    assert set(answer.body) == {"error"}, answer.body
    return answer.status, answer.error_code, answer.body["error"]["retryable"]


# --- diagnostic.sleep on its own ------------------------------------------------------------


class Ticks:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 100.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_sleep_capability_zero_seconds_answers_what_the_clock_says_it_slept() -> None:
    result = Sleep(clock=Ticks(0.25)).run({"seconds": 0}, Cancel())
    assert result == {"slept_seconds": 0.25, "device": "cpu"}


def test_sleep_capability_an_aborted_job_stops_at_once() -> None:
    cancel = Cancel()
    cancel.set()
    with pytest.raises(JobCancelled):
        Sleep().run({"seconds": 300}, cancel)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "input/seconds is required"),
        ({"seconds": "5"}, "input/seconds is required"),
        ({"seconds": True}, "input/seconds is required"),
        ({"seconds": None}, "input/seconds is required"),
        ({"seconds": -0.5}, "input/seconds must be between 0 and 300"),
        ({"seconds": 300.5}, "input/seconds must be between 0 and 300"),
        ({"seconds": 1, "extra": 1}, "input has unknown fields: extra"),
    ],
)
def test_sleep_capability_bad_input_is_invalid_input(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        Sleep().run(payload, Cancel())
    assert refused.value.message.startswith(message)


def test_sleep_capability_is_bounded_by_the_job_timeout_and_frees_the_worker_at_once() -> None:
    jobs = JobRunner(timeout_seconds=0.2)
    with pytest.raises(errors.JobTimedOut):
        jobs.run(Sleep(), {"seconds": 300})
    wait_until(lambda: not jobs.busy, 2, "the timed-out sleep to unwind")


def test_sleep_input_schema_of_the_control_plane_matches_the_workers_rule() -> None:
    from jsonschema import Draft202012Validator

    schema = Draft202012Validator(work.INPUTS[work.SLEEP])
    assert work.SLEEP in work.CAPABILITIES
    assert schema.is_valid({"seconds": 0}) and schema.is_valid({"seconds": 300}) and schema.is_valid({"seconds": 2.5})
    for bad in ({}, {"seconds": 301}, {"seconds": -1}, {"seconds": "1"}, {"seconds": True}, {"seconds": 1, "x": 1}):
        assert not schema.is_valid(bad), bad


# --- the job runner ---------------------------------------------------------------------------


def _run_in_thread(jobs: JobRunner, capability: Any, job_id: str | None) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(jobs.run(capability, {}, job_id))
        except errors.RunError as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_jobs_cancel_of_the_running_job_answers_ended_and_its_caller_gets_cancelled() -> None:
    jobs, gate = JobRunner(30), Gate()
    thread, outcome = _run_in_thread(jobs, gate, "work_1:1")
    assert gate.entered.wait(10)
    assert jobs.cancel("work_1:1", wait_seconds=5) == "ended"
    assert not jobs.busy  # ended means free
    thread.join(5)
    (error,) = outcome
    assert isinstance(error, errors.Cancelled) and error.code == "job_cancelled" and error.retryable


def test_jobs_cancel_of_another_id_leaves_the_running_job_alone() -> None:
    jobs, gate = JobRunner(30), Gate()
    thread, outcome = _run_in_thread(jobs, gate, "work_1:1")
    assert gate.entered.wait(10)
    assert jobs.cancel("work_1:2", wait_seconds=0) == "not_running"
    assert jobs.busy and not gate.ended.is_set()
    gate.opened.set()
    thread.join(5)
    assert outcome == [{"echo": {}}]


def test_jobs_a_cancel_that_overtakes_its_run_refuses_the_run_when_it_comes() -> None:
    jobs, gate = JobRunner(30), Gate()
    assert jobs.cancel("work_1:1", wait_seconds=0) == "not_running"
    with pytest.raises(errors.Cancelled):
        jobs.run(gate, {}, "work_1:1")
    assert not gate.entered.is_set() and not jobs.busy
    gate.opened.set()
    assert jobs.run(gate, {}, "work_1:1") == {"echo": {}}  # remembered once


def test_jobs_remember_only_the_last_cancels_of_ids_not_running() -> None:
    jobs, gate = JobRunner(30), Gate()
    gate.opened.set()
    for number in range(REMEMBERED_CANCELS + 1):
        jobs.cancel(f"work_{number}:1", wait_seconds=0)
    assert jobs.run(gate, {}, "work_0:1") == {"echo": {}}  # the oldest was forgotten
    with pytest.raises(errors.Cancelled):
        jobs.run(gate, {}, f"work_{REMEMBERED_CANCELS}:1")


def test_jobs_a_job_that_ignores_its_abort_answers_ending_and_the_worker_stays_busy_until_it_ends() -> None:
    jobs, stubborn = JobRunner(30), Gate(obeys_abort=False)
    thread, outcome = _run_in_thread(jobs, stubborn, "work_1:1")
    assert stubborn.entered.wait(10)
    assert jobs.cancel("work_1:1", wait_seconds=0.05) == "ending"
    assert jobs.busy and outcome == []  # its caller is answered only once it has unwound
    stubborn.opened.set()
    thread.join(5)
    assert isinstance(outcome[0], errors.Cancelled) and not jobs.busy


def test_jobs_a_cancelled_sleep_ends_at_once() -> None:
    jobs = JobRunner(30)
    thread, outcome = _run_in_thread(jobs, _FixedSleep(), "work_1:1")
    wait_until(lambda: jobs.busy, 5, "the sleep to start")
    assert jobs.cancel("work_1:1", wait_seconds=5) == "ended"
    thread.join(5)
    assert isinstance(outcome[0], errors.Cancelled)


class _FixedSleep(Sleep):
    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        return super().run({"seconds": 300}, cancel)


# --- POST /v1/cancel over HTTP ------------------------------------------------------------------


@pytest.fixture()
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.opened.set()


@pytest.fixture()
def served(tmp_path: Path, gate: Gate) -> Iterator[tuple[WorkerApp, WorkerClient]]:
    path = Path(tmp_path) / "w.sock"
    app = WorkerApp([gate, Sleep()], JobRunner(30))
    listener = Listener(Listen(url=f"unix://{path}", path=path))
    listener.serve(app, poll_interval=0.02)
    yield app, WorkerClient(listener.address, timeout=10)
    listener.close()


def test_http_status_advertises_cancel_and_says_when_it_is_busy(
    served: tuple[WorkerApp, WorkerClient], gate: Gate
) -> None:
    _, client = served
    body = client.status().body
    assert body["features"] == ["cancel", "slots", "gpu_slots"] and body["busy"] is False
    assert body["slots"] == {"total": 1, "busy": 0, "gpus": []}
    thread = threading.Thread(target=lambda: client.run("gate", {}, "work_1:1"), daemon=True)
    thread.start()
    assert gate.entered.wait(10)
    busy = WorkerClient(client.address).status().body
    assert busy["busy"] is True and busy["slots"] == {"total": 1, "busy": 1, "gpus": []}
    gate.opened.set()
    thread.join(5)


def test_http_cancel_of_a_running_job_answers_ended_and_its_run_409_job_cancelled(
    served: tuple[WorkerApp, WorkerClient], gate: Gate
) -> None:
    _, client = served
    answers: list[Answer] = []
    thread = threading.Thread(target=lambda: answers.append(client.run("gate", {"n": 1}, "work_1:1")), daemon=True)
    thread.start()
    assert gate.entered.wait(10)
    cancelled = WorkerClient(client.address).cancel("work_1:1")
    assert (cancelled.status, cancelled.body) == (200, {"job_id": "work_1:1", "state": "ended"})
    thread.join(5)
    assert _error(answers[0]) == (409, "job_cancelled", True)
    assert WorkerClient(client.address).run("diagnostic.sleep", {"seconds": 0}).status == 200


def test_http_cancel_of_no_running_job_answers_not_running(served: tuple[WorkerApp, WorkerClient]) -> None:
    _, client = served
    answer = client.cancel("work_9:9")
    assert (answer.status, answer.body) == (200, {"job_id": "work_9:9", "state": "not_running"})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[]", 'the body must be a JSON object {"job_id": "..."}'),
        (b"{}", "job_id must be a string of 1 to 128 characters"),
        (b'{"job_id": ""}', "job_id must be a string of 1 to 128 characters"),
        (b'{"job_id": "a b"}', "job_id must be a string of 1 to 128 characters"),
        (b'{"job_id": 7}', "job_id must be a string of 1 to 128 characters"),
        (b'{"job_id": "' + b"a" * 129 + b'"}', "job_id must be a string of 1 to 128 characters"),
        (b'{"job_id": "a", "why": 1}', "unknown fields: why"),
    ],
)
def test_http_cancel_bad_request_is_400_invalid_request(
    served: tuple[WorkerApp, WorkerClient], body: bytes, message: str
) -> None:
    _, client = served
    answer = client.request("POST", "/v1/cancel", body)
    assert _error(answer) == (400, "invalid_request", False)
    assert answer.body["error"]["message"].startswith(message)


def test_http_run_with_a_bad_job_id_is_400_invalid_request(served: tuple[WorkerApp, WorkerClient]) -> None:
    _, client = served
    answer = client.run("diagnostic.sleep", {"seconds": 0}, job_id="not a job id")
    assert _error(answer) == (400, "invalid_request", False)
    assert answer.body["error"]["message"].startswith("job_id must be")


def test_http_cancel_accepts_post_only(served: tuple[WorkerApp, WorkerClient]) -> None:
    _, client = served
    assert _error(client.request("GET", "/v1/cancel")) == (405, "method_not_allowed", False)


def test_http_a_run_without_a_job_id_as_an_old_agent_sends_it_still_runs(
    served: tuple[WorkerApp, WorkerClient],
) -> None:
    _, client = served
    answer = client.request("POST", "/v1/run", b'{"capability": "diagnostic.sleep", "input": {"seconds": 0}}')
    assert answer.status == 200 and set(answer.body["result"]) == {"slept_seconds", "device"}
