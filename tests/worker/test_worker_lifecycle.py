"""Time bounds of a real worker: a job over MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS is answered
504 and really aborted inside onnxruntime, and SIGTERM during a job aborts it, removes the
socket and exits 0 within seconds. Also: the loopback TCP listener."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from modelforge_runtime_worker.client import Answer

from tests.support.polling import wait_until
from tests.worker.worker_support import Worker, b64, start_worker, text_png, worker_env

#: 100 text lines: about 7 s of OCR on 2 idle cores, far over the 1 s deadline on any CPU.
LONG_PAGE = text_png([f"LINE {number:03d} OF A VERY LONG PAGE 2026" for number in range(100)], font_size=20)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lifecycle")


@pytest.fixture(scope="module")
def quick(root: Path) -> Iterator[Worker]:
    """A worker with a 1 s job deadline, on a free loopback port; its environment also holds an
    unknown and a misspelled variable."""
    env = worker_env(
        root,
        MODELFORGE_WORKER_LISTEN="http://127.0.0.1:0",
        MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS="1",
        MODELFORGE_WORKER_BANANA="1",
        MODELFORGE_WORKER_DEVISE="cpu",
    )
    with start_worker(root / "quick.log", env) as running:
        yield running


def records(worker: Worker, event: str) -> list[dict]:
    return [json.loads(line) for line in worker.output().splitlines() if f'"event": "{event}"' in line]


def test_it_listens_on_a_loopback_port(quick: Worker) -> None:
    assert quick.address.startswith("http://127.0.0.1:") and not quick.address.endswith(":0")
    assert quick.client().status().body["healthy"] is True


def test_worker_unknown_and_misspelled_variables_warn_one_line_each_and_it_starts(quick: Worker) -> None:
    warned = {record["variable"]: record["message"] for record in records(quick, "unknown_setting")}
    assert warned == {
        "MODELFORGE_WORKER_BANANA": "MODELFORGE_WORKER_BANANA is not a ModelForge setting and is ignored",
        "MODELFORGE_WORKER_DEVISE": "MODELFORGE_WORKER_DEVISE is not a ModelForge setting and is ignored "
        "(did you mean MODELFORGE_WORKER_DEVICE?)",
    }
    assert quick.client().status().body["healthy"] is True


def test_a_job_over_the_deadline_is_504_and_aborted(quick: Worker) -> None:
    started = time.monotonic()
    answer = quick.client().run("ocr", {"image_base64": b64(LONG_PAGE)})
    assert answer.status == 504, answer.body
    assert answer.body["error"] == {
        "code": "job_timeout",
        "message": "the job ran over 1 s and was aborted",
        "retryable": True,
    }
    assert time.monotonic() - started < 8
    # the abort reaches into onnxruntime: the job ends long before the page would have been read
    aborted = wait_until(lambda: records(quick, "job_aborted"), 10, "the aborted job to end", detail=quick.output)
    assert aborted[0]["duration_ms"] < 4000, aborted
    wait_until(lambda: quick.client().run("diagnostic.echo", {}).status == 200, 5, "the worker to take jobs again")


def test_sigterm_during_a_job_aborts_it_removes_the_socket_and_exits_0(root: Path) -> None:
    env = worker_env(root, MODELFORGE_WORKER_LOG_LEVEL="DEBUG")
    with start_worker(root / "stopped.log", env) as worker:
        answers: list[Answer | BaseException] = []

        def read_page() -> None:
            try:
                answers.append(worker.client().run("ocr", {"image_base64": b64(LONG_PAGE)}))
            except Exception as error:  # noqa: BLE001 - judged below
                answers.append(error)

        thread = threading.Thread(target=read_page, daemon=True)
        thread.start()
        worker.wait_for(r'"event": "job_started"', 30)
        began = time.monotonic()
        code = worker.stop(signal.SIGTERM, timeout=15)
        took = time.monotonic() - began
        thread.join(10)
    assert code == 0, worker.output()
    assert took < 6, took
    assert not (root / "worker.sock").exists()
    answer = answers[0]
    assert isinstance(answer, Answer), answer
    assert (
        answer.status == 503 and answer.body["error"]["code"] == "shutting_down" and answer.body["error"]["retryable"]
    )
    assert '"event": "worker_stopped"' in worker.output()


def test_a_sleep_over_the_deadline_is_504_and_the_worker_is_free_at_once(quick: Worker) -> None:
    started = time.monotonic()
    answer = quick.client().run("diagnostic.sleep", {"seconds": 30})
    assert answer.status == 504 and answer.body["error"]["code"] == "job_timeout", answer.body
    assert time.monotonic() - started < 5
    wait_until(lambda: quick.client().status().body["busy"] is False, 2, "the timed-out sleep to unwind")
    # The slot's new process loads the models (about 1 s on 2 busy cores, as long as this worker's
    # whole job deadline), so the first echo may itself time out waiting for it.
    wait_until(lambda: quick.client().run("diagnostic.echo", {}).status == 200, 15, "the restarted slot to answer")
