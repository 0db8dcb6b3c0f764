"""Cancel reaches the job: the real agent and work loop (in-process, a fake control plane on
127.0.0.1) against a fake worker with the ``cancel`` feature, a fake worker without it (a 1.3.0
worker), and a real runtime worker process running ``diagnostic.sleep``. A renewal answered 409
(at its interval, or at once after ``WorkRunner.renew_now``) stops the job on the worker and frees
the slot within 2 s; nothing is uploaded and nothing is failed."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelforge_protocol.work import MAX_LEASE_SECONDS

from tests.agent.fake_worker import CancellableRuns, echo_result, fake_worker, status_answer
from tests.agent.test_work_runner import ECHO_CAPABILITY, Running, running_agent
from tests.support.polling import wait_until
from tests.worker.worker_support import Worker, start_worker, worker_env

#: The issue's bound: from the renewal's 409 to the worker's slot being free.
FREE_WITHIN_SECONDS = 2.0
CANCELS = status_answer(features=["cancel"])


def _never(lease_seconds: float) -> float:
    """No renewal at an interval during a test: only ``renew_now`` renews."""
    return MAX_LEASE_SECONDS


def _every_third_of_a_second(lease_seconds: float) -> float:
    return 0.3


def _held_runs(runs: CancellableRuns) -> Any:
    """Runs whose input says ``hold`` wait for their cancel; others echo at once."""

    def run(request: dict[str, Any]) -> tuple[int, Any]:
        if request["input"].get("hold"):
            return runs.run(request)
        return 200, {"result": echo_result(request["input"])}

    return run


def _refused_first(code: str) -> Any:
    return lambda number: (409, code) if number == 1 else None


def _assert_nothing_settled(running: Running, work_id: str) -> None:
    assert running.work.failures == []
    assert all(completed != work_id for completed, _ in running.work.completions)
    assert all(not upload.key.startswith(f"results/{work_id}/") for upload in running.objects.puts())


# --- a fake worker that cancels ------------------------------------------------------------------


def test_work_renew_now_renews_at_once_and_the_409_frees_the_worker_within_2_s(tmp_path: Path) -> None:
    runs = CancellableRuns()
    with (
        fake_worker(CANCELS, run=_held_runs(runs), cancel=runs.cancel) as worker,
        running_agent(tmp_path, worker.url, renew_interval=_never) as running,
    ):
        item = running.work.submit(ECHO_CAPABILITY, {"hold": True}, on_renew=_refused_first("work_cancelled"))
        wait_until(lambda: worker.runs, 10, "the run to reach the worker")
        running.runner.renew_now(item.work_id)  # what a channel's cancel message does
        assert running.wait_outcomes(1) == ["work_cancelled"]
        wait_until(lambda: worker.run_ends, 5, "the worker to answer the cancelled run")
        freed = worker.run_ends[0] - running.work.renewals[0][0]
        assert 0 <= freed < FREE_WITHIN_SECONDS, freed
        job_id = f"{item.work_id}:1"
        assert worker.runs[0]["job_id"] == job_id and worker.cancels == [{"job_id": job_id}]
        running.work.submit(ECHO_CAPABILITY, {"n": 2})  # the slot is free: the next item runs
        assert running.wait_outcomes(2) == ["work_cancelled", "succeeded"]
    _assert_nothing_settled(running, item.work_id)


def test_work_renew_now_for_work_not_running_here_renews_nothing(tmp_path: Path) -> None:
    runs = CancellableRuns()
    with (
        fake_worker(CANCELS, run=_held_runs(runs), cancel=runs.cancel) as worker,
        running_agent(tmp_path, worker.url, renew_interval=_never) as running,
    ):
        running.work.submit(ECHO_CAPABILITY, {"hold": True})
        wait_until(lambda: worker.runs, 10, "the run to reach the worker")
        running.runner.renew_now("work_" + "f" * 32)
        running.wait_heartbeats(3)
        assert running.work.renewals == [] and worker.cancels == []
        runs.release()
        assert running.wait_outcomes(1) == ["succeeded"]


@pytest.mark.parametrize("code", ["work_cancelled", "lease_lost"])
def test_work_without_a_channel_the_next_renewals_409_frees_the_worker_within_2_s(tmp_path: Path, code: str) -> None:
    runs = CancellableRuns()
    with (
        fake_worker(CANCELS, run=_held_runs(runs), cancel=runs.cancel) as worker,
        running_agent(tmp_path, worker.url, renew_interval=_every_third_of_a_second) as running,
    ):
        item = running.work.submit(ECHO_CAPABILITY, {"hold": True}, on_renew=_refused_first(code))
        assert running.wait_outcomes(1) == [code]
        wait_until(lambda: worker.run_ends, 5, "the worker to answer the cancelled run")
        freed = worker.run_ends[0] - running.work.renewals[0][0]
        assert 0 <= freed < FREE_WITHIN_SECONDS, freed
        assert worker.cancels == [{"job_id": f"{item.work_id}:1"}]
    _assert_nothing_settled(running, item.work_id)


def test_work_stopping_the_agent_also_cancels_the_job_on_the_worker(tmp_path: Path) -> None:
    runs = CancellableRuns()
    with fake_worker(CANCELS, run=_held_runs(runs), cancel=runs.cancel) as worker:
        with running_agent(tmp_path, worker.url) as running:
            item = running.work.submit(ECHO_CAPABILITY, {"hold": True})
            wait_until(lambda: worker.runs, 10, "the run to reach the worker")
            running.stop.set()
            running.thread.join(5)
        wait_until(lambda: worker.cancels, 5, "the cancel to reach the worker")
    assert worker.cancels == [{"job_id": f"{item.work_id}:1"}]
    wait_until(lambda: running.work.failures, 5, "the retryable failure")
    assert running.work.failures[0][1]["retryable"] is True


# --- a worker without cancel (1.3.0): the agent only stops waiting, as before ---------------------


def test_work_new_agent_and_old_worker_sends_no_job_id_and_no_cancel(tmp_path: Path) -> None:
    release = threading.Event()

    def held(request: dict[str, Any]) -> tuple[int, Any]:
        release.wait(10)
        return 200, {"result": echo_result(request["input"])}

    with (
        fake_worker(run=held) as worker,  # its status lists no features
        running_agent(tmp_path, worker.url, renew_interval=_never) as running,
    ):
        item = running.work.submit(ECHO_CAPABILITY, {"n": 1}, on_renew=_refused_first("work_cancelled"))
        wait_until(lambda: worker.runs, 10, "the run to reach the worker")
        running.runner.renew_now(item.work_id)
        assert running.wait_outcomes(1) == ["work_cancelled"]
        second = running.work.submit(ECHO_CAPABILITY, {"n": 2})
        running.wait_heartbeats(3)
        assert running.work.claims == [200]  # the worker is still on the first job: nothing claimed
        release.set()
        assert running.wait_outcomes(2) == ["work_cancelled", "succeeded"]
    assert "job_id" not in worker.runs[0] and worker.cancels == []
    assert [work_id for work_id, _ in running.work.completions] == [second.work_id]
    _assert_nothing_settled(running, item.work_id)


# --- a real runtime worker ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    root = tmp_path_factory.mktemp("cancel-worker")
    with start_worker(root / "worker.log", worker_env(root)) as worker:
        yield worker


def _events(worker: Worker, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.output().splitlines() if f'"event": "{event}"' in line]


@pytest.mark.parametrize("renew", ["renew_now", "interval"])
def test_work_a_cancelled_sleep_stops_on_a_real_worker_within_2_s_of_the_409(
    tmp_path: Path, real_worker: Worker, renew: str, caplog: pytest.LogCaptureFixture
) -> None:
    interval = _never if renew == "renew_now" else (lambda lease_seconds: 1.0)
    client = real_worker.client()
    with (
        caplog.at_level(logging.INFO, logger="modelforge.agent"),
        running_agent(tmp_path, real_worker.address, renew_interval=interval) as running,
    ):
        before = len(_events(real_worker, "job_aborted"))
        item = running.work.submit("diagnostic.sleep", {"seconds": 60}, on_renew=_refused_first("work_cancelled"))
        wait_until(lambda: client.status().body["busy"], 20, "the sleep to start on the worker", interval=0.02)
        if renew == "renew_now":
            running.runner.renew_now(item.work_id)
        assert running.wait_outcomes(1) == ["work_cancelled"]
        wait_until(lambda: not client.status().body["busy"], FREE_WITHIN_SECONDS, "the worker to be free")
        aborted = wait_until(lambda: _events(real_worker, "job_aborted")[before:], 5, "the worker's job_aborted")
        lost = [record for record in caplog.records if getattr(record, "event", None) == "work_lease_lost"]
        freed = aborted[0]["ts"] - lost[0].created  # both clocks are this host's wall clock
        assert aborted[0]["cancelled"] is True and aborted[0]["job_id"] == f"{item.work_id}:1"
        assert freed < FREE_WITHIN_SECONDS, freed
        print(f"renewal 409 -> worker free: {freed * 1000:.0f} ms ({renew})")
        running.work.submit(ECHO_CAPABILITY, {"after": "cancel"})
        assert running.wait_outcomes(2) == ["work_cancelled", "succeeded"]
    _assert_nothing_settled(running, item.work_id)
