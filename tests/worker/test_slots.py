"""Job slots as processes (slots.py), through a real worker with two slots: a job past its deadline
or cancelled is killed with its slot's process and the slot comes back with a new one; a crash in
one slot never touches the other; a hostile image fails its job at the decoder's cap while the
other slot answers at once; and the slot processes never outlive the worker."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelforge_runtime_worker.client import Answer

from tests.support.polling import wait_until
from tests.worker.test_decoder import hostile_progressive_jpeg
from tests.worker.worker_support import Worker, alive, b64, children_running, start_worker, worker_env

JOB_TIMEOUT = 8


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def worker(root: Path) -> Iterator[Worker]:
    env = worker_env(
        root,
        MODELFORGE_WORKER_SLOTS="2",
        MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS=str(JOB_TIMEOUT),
        MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS="3",
        MODELFORGE_WORKER_LOG_LEVEL="DEBUG",
    )
    with start_worker(root / "worker.log", env, timeout=120) as running:
        yield running


def _slot_pids(worker: Worker) -> list[int]:
    """The pids of the worker's slot processes now (its children running slot_process)."""
    return children_running(worker.process.pid, "modelforge_runtime_worker.slot_process")


def _run(worker: Worker, capability: str, payload: dict[str, Any], job_id: str | None = None) -> Answer:
    return worker.client(timeout=60).run(capability, payload, job_id)


def _in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    thread.start()
    return thread, outcome


def _status(worker: Worker) -> dict[str, Any]:
    return worker.client().status().body


def _both_ready(worker: Worker) -> None:
    """Both slots answer a job (a restarting slot takes its next job once it is up)."""
    wait_until(lambda: _status(worker)["slots"] == {"total": 2, "busy": 0, "gpus": []}, 30, "both slots to be free")
    for _ in range(2):
        assert _run(worker, "diagnostic.echo", {"n": 1}).status == 200


def test_the_status_says_how_many_slots_and_lists_the_feature(worker: Worker) -> None:
    status = _status(worker)
    assert status["slots"] == {"total": 2, "busy": 0, "gpus": []} and "slots" in status["features"]
    assert len(_slot_pids(worker)) == 2


def test_two_jobs_run_at_once_and_a_third_is_busy(worker: Worker) -> None:
    first, first_out = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 1.5}, "a:1"))
    second, second_out = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 1.5}, "b:1"))
    wait_until(lambda: _status(worker)["slots"]["busy"] == 2, 10, "both slots to be taken")
    assert _status(worker)["busy"] is True
    third = _run(worker, "diagnostic.echo", {"n": 3})
    assert (third.status, third.error_code) == (503, "worker_busy")
    began = time.monotonic()
    first.join(10)
    second.join(10)
    assert [answer.status for answer in first_out + second_out] == [200, 200]
    assert time.monotonic() - began < 2.5  # together, not one after the other


def test_a_job_past_its_deadline_is_killed_with_its_process_and_the_slot_comes_back(worker: Worker) -> None:
    before = _slot_pids(worker)
    began = time.monotonic()
    answer = _run(worker, "diagnostic.sleep", {"seconds": 300})
    assert (answer.status, answer.error_code) == (504, "job_timeout")
    assert time.monotonic() - began < JOB_TIMEOUT + 3
    wait_until(lambda: len(_slot_pids(worker)) == 2 and _slot_pids(worker) != before, 10, "a new slot process")
    assert len(set(before) & set(_slot_pids(worker))) == 1  # the other slot's process was not touched
    _both_ready(worker)


def test_a_cancelled_job_is_killed_with_its_process_and_answers_cancelled(worker: Worker) -> None:
    before = _slot_pids(worker)
    running, outcome = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 300}, "work_c:1"))
    wait_until(lambda: _status(worker)["slots"]["busy"] == 1, 10, "the sleep to start")
    cancel = worker.client().cancel("work_c:1")
    assert cancel.status == 200 and cancel.body["state"] == "ended"
    running.join(10)
    assert (outcome[0].status, outcome[0].error_code) == (409, "job_cancelled")
    wait_until(lambda: len(_slot_pids(worker)) == 2 and _slot_pids(worker) != before, 10, "a new slot process")
    _both_ready(worker)


def test_a_slot_restarted_by_a_job_keeps_its_new_process_for_the_jobs_after(worker: Worker) -> None:
    """A slot whose process died while idle is started again by its next job's thread. The new
    process outlives that thread (a child forked by a thread gets its parent-death signal when
    that thread ends), so the jobs after find it loaded and waiting."""
    _both_ready(worker)
    killed = _slot_pids(worker)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(_ended(pid) for pid in killed), 10, "the slot processes to end")
    _both_busy_once(worker)  # each slot's job starts its new process, waits for it, runs in it
    restarted, seen = _slot_pids(worker), len(worker.output())
    assert len(restarted) == 2
    _both_busy_once(worker)
    _both_busy_once(worker)
    assert _slot_pids(worker) == restarted
    assert '"event": "slot_started"' not in worker.output()[seen:]


def _ended(pid: int) -> bool:
    """Whether ``pid`` has ended so far that its parent can reap it: a zombie with no thread left
    (a killed process's leader is a zombie while its other threads still exit, and cannot be
    reaped until they have)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return not alive(pid) and "\nThreads:\t1\n" in status


def _both_busy_once(worker: Worker) -> None:
    jobs = [_in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 0.5})) for _ in range(2)]
    for thread, answers in jobs:
        thread.join(30)
        assert answers[0].status == 200


def test_a_slot_whose_process_dies_mid_job_fails_that_job_only(worker: Worker) -> None:
    _both_ready(worker)
    running, outcome = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 300}, "work_k:1"))
    wait_until(lambda: _status(worker)["slots"]["busy"] == 1, 10, "the sleep to start")
    log = worker.output()
    victim = _busy_slot_pid(log)
    os.kill(victim, signal.SIGKILL)  # an out-of-memory kill, say
    running.join(10)
    assert (outcome[0].status, outcome[0].error_code) == (500, "job_failed")
    assert "SIGKILL" in outcome[0].body["error"]["message"]
    assert _run(worker, "diagnostic.echo", {"still": "here"}).status == 200
    _both_ready(worker)


def test_a_hostile_image_fails_at_the_decoders_cap_while_the_other_slot_answers(worker: Worker) -> None:
    _both_ready(worker)
    hostile = {"image_base64": b64(hostile_progressive_jpeg())}
    began = time.monotonic()
    ocr, ocr_out = _in_thread(lambda: _run(worker, "ocr", hostile, "work_h:1"))
    wait_until(lambda: _status(worker)["slots"]["busy"] == 1, 10, "the OCR job to start")
    echo_began = time.monotonic()
    echo = _run(worker, "diagnostic.echo", {"while": "decoding"})
    assert echo.status == 200 and time.monotonic() - echo_began < 2
    ocr.join(JOB_TIMEOUT + 10)
    answer = ocr_out[0]
    assert (answer.status, answer.error_code, answer.body["error"]["retryable"]) == (422, "invalid_input", False)
    assert "took longer than 3 s to decode" in answer.body["error"]["message"]
    assert time.monotonic() - began < JOB_TIMEOUT + 5


def test_the_slot_processes_die_with_the_worker(root: Path) -> None:
    env = worker_env(root / "second", MODELFORGE_WORKER_SLOTS="2")
    (root / "second").mkdir()
    worker = start_worker(root / "second.log", env, timeout=120)
    try:
        pids = _slot_pids(worker)
        assert len(pids) == 2
        os.kill(worker.process.pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(pid) for pid in pids), 10, "the slot processes to end")
    finally:
        worker.stop(signal.SIGKILL)


def _busy_slot_pid(log: str) -> int:
    """The pid of the slot that started the last job (the worker logs each job's slot, the slot
    process logs its pid in its start line)."""
    started = [json.loads(line) for line in log.splitlines() if '"event": "job_started"' in line]
    slot = started[-1]["slot"]
    pids = [
        json.loads(line)["pid"]
        for line in log.splitlines()
        if '"event": "slot_started"' in line and json.loads(line).get("slot") == slot
    ]
    return int(pids[-1])
