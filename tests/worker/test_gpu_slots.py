"""Jobs on a chosen GPU (``gpu_uuid``): each GPU has its own slot, whose process is started with
``CUDA_VISIBLE_DEVICES=<the UUID>`` and an environment built for it (no secret of the worker's).

In-process: the run request's field, the job runner's two pools and its bound on GPU slots, the
environments. Then a real worker (on this CPU-only machine the device is ``cpu``, so
``CUDA_VISIBLE_DEVICES`` is only a variable, read back from ``/proc/<pid>/environ``): two GPUs run
two jobs at once, the same GPU twice is busy, a killed GPU slot comes back on the same GPU, its
image decoder sees no GPU, an invalid UUID is a 400, and the GPU slots end with the worker."""

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
from modelforge_protocol.work import MAX_WORKER_SLOTS
from modelforge_runtime_worker import decoder, errors
from modelforge_runtime_worker.app import FEATURES, WorkerApp
from modelforge_runtime_worker.client import Answer
from modelforge_runtime_worker.jobs import JobRunner
from modelforge_runtime_worker.slots import SLOT_ENVIRONMENT, slot_environment

from tests.support.polling import wait_until
from tests.worker.test_decoder import hostile_progressive_jpeg
from tests.worker.test_server import Fixed, Gate
from tests.worker.worker_support import Worker, alive, b64, children_running, start_worker, worker_env

GPU_A = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
GPU_B = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"
MIG = "MIG-4a5b6c7d-1234-5678-9abc-def012345678"
#: The worker's own CUDA_VISIBLE_DEVICES: what the pool's slot keeps, and the GPU slots do not.
WORKERS_OWN = "GPU-workers-own-devices"
ADMIN_TOKEN = "not-for-slots-0123456789abcdef"
JOB_TIMEOUT = 8
SLOT_MODULE = "modelforge_runtime_worker.slot_process"


# --- in this process ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gpu_uuid",
    [
        "0",
        "GPU-1234567",  # 7 after the prefix: too short
        "gpu-0a1b2c3d-0000",
        "GPU-0a1b2c3d_0000",
        "GPU-0a1b2c3d-0000\n",
        "GPU-" + "a" * 97,
        "MIG-GPU-0a1b2c3d/1/0",
        7,
        None,
    ],
)
def test_an_invalid_gpu_uuid_is_refused_as_an_invalid_request(gpu_uuid: Any) -> None:
    app = WorkerApp([Fixed("echoish")], JobRunner(5))
    with pytest.raises(errors.InvalidRequest) as refused:
        app.run({"capability": "echoish", "input": {}, "gpu_uuid": gpu_uuid})
    assert refused.value.message.startswith("gpu_uuid must be a GPU's UUID as NVML names it")


@pytest.mark.parametrize("gpu_uuid", [GPU_A, MIG, "GPU-" + "a" * 96, "GPU-12345678"])
def test_a_valid_gpu_uuid_runs_in_that_gpus_slot(gpu_uuid: str) -> None:
    jobs = JobRunner(5)
    app = WorkerApp([Fixed("echoish")], jobs)
    assert app.run({"capability": "echoish", "input": {"a": 1}, "gpu_uuid": gpu_uuid}) == {"result": {"n": 1}}
    assert app.status()["slots"] == {"total": 1, "busy": 0, "gpus": [{"uuid": gpu_uuid, "busy": False}]}
    assert "gpu_slots" in app.status()["features"] and "gpu_slots" in FEATURES


def _in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except errors.RunError as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_jobs_a_gpus_slot_and_the_pool_never_share() -> None:
    """The pool's one slot busy: a GPU job still runs. A GPU's slot busy: a pool job still runs,
    another GPU's job still runs, a second job for it is busy."""
    seen: list[Any] = []

    def execute(slot: Any, capability: Any, payload: dict[str, Any], cancel: Any) -> dict[str, Any]:
        seen.append(slot)
        return capability.run(payload, cancel)  # type: ignore[no-any-return]

    jobs, pool_gate, gpu_gate = JobRunner(30, 1, execute), Gate("pool"), Gate("gpu")
    pool, _ = _in_thread(lambda: jobs.run(pool_gate, {}))
    gpu, _ = _in_thread(lambda: jobs.run(gpu_gate, {}, None, GPU_A))
    assert pool_gate.entered.wait(10) and gpu_gate.entered.wait(10)
    assert jobs.busy and jobs.slots_busy == 1
    assert jobs.gpu_slots == [{"uuid": GPU_A, "busy": True}]
    with pytest.raises(errors.WorkerBusy, match=f"the slot of GPU {GPU_A} is running a job"):
        jobs.run(Fixed("echo"), {}, None, GPU_A)
    with pytest.raises(errors.WorkerBusy, match="another job is running"):
        jobs.run(Fixed("echo"), {})
    assert jobs.run(Fixed("echo"), {"b": 2}, None, GPU_B) == {"n": 1}
    assert jobs.gpu_slots == [{"uuid": GPU_A, "busy": True}, {"uuid": GPU_B, "busy": False}]
    pool_gate.opened.set()
    gpu_gate.opened.set()
    pool.join(5)
    gpu.join(5)
    assert sorted(seen, key=str) == sorted([0, GPU_A, GPU_B], key=str)
    assert not jobs.busy and jobs.gpu_slots == [{"uuid": GPU_A, "busy": False}, {"uuid": GPU_B, "busy": False}]


def test_jobs_a_gpu_one_past_the_bound_is_refused_and_the_others_go_on() -> None:
    jobs = JobRunner(5)
    uuids = [f"GPU-{number:08d}" for number in range(MAX_WORKER_SLOTS)]
    for uuid in uuids:
        assert jobs.run(Fixed("echo"), {}, None, uuid) == {"n": 0}
    with pytest.raises(errors.GpuSlotsFull) as refused:
        jobs.run(Fixed("echo"), {}, None, "GPU-one-too-many")
    assert refused.value.code == "gpu_slots_full" and refused.value.retryable
    assert f"already has slots for {MAX_WORKER_SLOTS} GPUs" in refused.value.message
    assert jobs.run(Fixed("echo"), {}, None, uuids[-1]) == {"n": 0}  # a GPU that has its slot still runs
    assert jobs.run(Fixed("echo"), {}) == {"n": 0}  # and so does the pool
    assert [entry["uuid"] for entry in jobs.gpu_slots] == uuids


def test_slot_environment_is_built_not_inherited() -> None:
    worker = {
        "PATH": "/usr/bin",
        "HOME": "/var/lib/modelforge",
        "LANG": "C.UTF-8",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN,
        "AWS_SECRET_ACCESS_KEY": "secret",
        "MODELFORGE_WORKER_LISTEN": "unix:///run/w.sock",
        "CUDA_VISIBLE_DEVICES": WORKERS_OWN,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    common = {
        "PATH": "/usr/bin",
        "HOME": "/var/lib/modelforge",
        "LANG": "C.UTF-8",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    }
    assert slot_environment(GPU_A, worker) == {**common, "CUDA_VISIBLE_DEVICES": GPU_A}
    assert slot_environment(None, worker) == {
        **common,
        "CUDA_VISIBLE_DEVICES": WORKERS_OWN,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert "CUDA_VISIBLE_DEVICES" not in SLOT_ENVIRONMENT


def test_the_decoder_child_gets_no_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", GPU_A)
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", ADMIN_TOKEN)
    assert set(decoder._child_environment()) <= {"PATH", "PYTHONPATH", "LANG", "LC_ALL", "SYSTEMROOT"}


# --- a real worker ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu_slots")


@pytest.fixture(scope="module")
def worker(root: Path) -> Iterator[Worker]:
    env = worker_env(
        root,
        MODELFORGE_WORKER_SLOTS="1",
        MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS=str(JOB_TIMEOUT),
        MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS="3",
        MODELFORGE_WORKER_LOG_LEVEL="DEBUG",
        MODELFORGE_ADMIN_TOKEN=ADMIN_TOKEN,
        CUDA_VISIBLE_DEVICES=WORKERS_OWN,
    )
    with start_worker(root / "worker.log", env, timeout=120) as running:
        yield running


def _run(
    worker: Worker, capability: str, payload: dict[str, Any], job_id: str | None = None, gpu: str | None = None
) -> Answer:
    return worker.client(timeout=60).run(capability, payload, job_id, gpu)


def _status(worker: Worker) -> dict[str, Any]:
    return worker.client().status().body


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def _slots_by_device(worker: Worker) -> dict[str | None, int]:
    """The worker's slot processes now, by the CUDA_VISIBLE_DEVICES each was started with."""
    found: dict[str | None, int] = {}
    for pid in children_running(worker.process.pid, SLOT_MODULE):
        try:
            found[_environ(pid).get("CUDA_VISIBLE_DEVICES")] = pid
        except OSError:
            continue  # it ended meanwhile
    return found


def _gpus(worker: Worker) -> dict[str, bool]:
    return {entry["uuid"]: entry["busy"] for entry in _status(worker)["slots"]["gpus"]}


def test_the_status_lists_the_feature_and_no_gpu_slot_before_a_gpu_job(worker: Worker) -> None:
    status = _status(worker)
    assert "gpu_slots" in status["features"]
    assert status["slots"] == {"total": 1, "busy": 0, "gpus": []}
    assert list(_slots_by_device(worker)) == [WORKERS_OWN]


def test_two_gpus_run_two_jobs_at_once_beside_the_pool(worker: Worker) -> None:
    for gpu in (GPU_A, GPU_B):  # each GPU's first job starts its slot (and waits for its models)
        assert _run(worker, "diagnostic.echo", {"gpu": gpu}, gpu=gpu).status == 200
    assert _gpus(worker) == {GPU_A: False, GPU_B: False}
    loaded = _slots_by_device(worker)
    began = time.monotonic()
    first, first_out = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 1.5}, "ga:1", GPU_A))
    second, second_out = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 1.5}, "gb:1", GPU_B))
    wait_until(lambda: _gpus(worker) == {GPU_A: True, GPU_B: True}, 10, "both GPU slots to be taken")
    status = _status(worker)
    assert status["slots"]["busy"] == 0 and status["busy"] is False  # the pool is not theirs
    assert _run(worker, "diagnostic.echo", {"pool": 1}).status == 200
    first.join(10)
    second.join(10)
    assert [answer.status for answer in first_out + second_out] == [200, 200]
    assert time.monotonic() - began < 2.5  # together, not one after the other
    assert _slots_by_device(worker) == loaded  # made by their first jobs, the slots outlived them


def test_the_same_gpu_twice_is_busy_while_the_others_answer(worker: Worker) -> None:
    running, outcome = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 1.5}, "ga:2", GPU_A))
    wait_until(lambda: _gpus(worker)[GPU_A], 10, "GPU A's slot to be taken")
    again = _run(worker, "diagnostic.echo", {"again": 1}, gpu=GPU_A)
    assert (again.status, again.error_code, again.body["error"]["retryable"]) == (503, "worker_busy", True)
    assert GPU_A in again.body["error"]["message"]
    assert _run(worker, "diagnostic.echo", {"other": 1}, gpu=GPU_B).status == 200
    assert _run(worker, "diagnostic.echo", {"pool": 1}).status == 200
    running.join(10)
    assert outcome[0].status == 200


def test_each_slot_process_sees_its_own_gpu_and_no_secret(worker: Worker) -> None:
    slots = _slots_by_device(worker)
    assert set(slots) == {WORKERS_OWN, GPU_A, GPU_B}
    assert _environ(worker.process.pid)["MODELFORGE_ADMIN_TOKEN"] == ADMIN_TOKEN  # the worker has it
    allowed = {*SLOT_ENVIRONMENT, "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}
    for pid in slots.values():
        environ = _environ(pid)
        assert set(environ) <= allowed, sorted(set(environ) - allowed)
        assert ADMIN_TOKEN not in json.dumps(environ)


def test_a_killed_gpu_slot_comes_back_on_the_same_gpu(worker: Worker) -> None:
    victim = _slots_by_device(worker)[GPU_A]
    running, outcome = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 300}, "ga:3", GPU_A))
    wait_until(lambda: _gpus(worker)[GPU_A], 10, "GPU A's slot to be taken")
    other = _slots_by_device(worker)[GPU_B]
    os.kill(victim, signal.SIGKILL)  # an out-of-memory kill, say
    running.join(10)
    assert (outcome[0].status, outcome[0].error_code) == (500, "job_failed")
    assert "SIGKILL" in outcome[0].body["error"]["message"]
    wait_until(lambda: _slots_by_device(worker).get(GPU_A) not in (None, victim), 10, "a new process for GPU A")
    assert _slots_by_device(worker)[GPU_B] == other  # the other GPU's slot was not touched
    assert _run(worker, "diagnostic.echo", {"back": 1}, gpu=GPU_A).status == 200
    restarted = _slots_by_device(worker)[GPU_A]
    assert _run(worker, "diagnostic.echo", {"again": 1}, gpu=GPU_A).status == 200
    assert _slots_by_device(worker)[GPU_A] == restarted
    assert _gpus(worker) == {GPU_A: False, GPU_B: False}


def test_a_cancelled_gpu_job_restarts_its_slot_on_the_same_gpu(worker: Worker) -> None:
    before = _slots_by_device(worker)[GPU_B]
    running, outcome = _in_thread(lambda: _run(worker, "diagnostic.sleep", {"seconds": 300}, "gb:2", GPU_B))
    wait_until(lambda: _gpus(worker)[GPU_B], 10, "GPU B's slot to be taken")
    cancel = worker.client().cancel("gb:2")
    assert cancel.status == 200 and cancel.body["state"] == "ended"
    running.join(10)
    assert (outcome[0].status, outcome[0].error_code) == (409, "job_cancelled")
    wait_until(lambda: _slots_by_device(worker).get(GPU_B) not in (None, before), 10, "a new process for GPU B")
    assert _run(worker, "diagnostic.echo", {"back": 1}, gpu=GPU_B).status == 200


def test_a_gpu_slots_image_decoder_sees_no_gpu(worker: Worker) -> None:
    """The decoder runs under RLIMIT_AS, which breaks CUDA: it is started without the variable."""
    slot = _slots_by_device(worker)[GPU_A]
    hostile = {"image_base64": b64(hostile_progressive_jpeg())}
    running, outcome = _in_thread(lambda: _run(worker, "ocr", hostile, "ga:4", GPU_A))
    decoders: list[int] = []
    wait_until(
        lambda: bool(decoders.extend(children_running(slot, "modelforge_runtime_worker.decoder")) or decoders),
        10,
        "the decoder child to start",
    )
    environ = _environ(decoders[0])
    assert "CUDA_VISIBLE_DEVICES" not in environ and "MODELFORGE_ADMIN_TOKEN" not in environ
    running.join(JOB_TIMEOUT + 5)
    assert (outcome[0].status, outcome[0].error_code) == (422, "invalid_input")


def test_an_invalid_gpu_uuid_is_a_400_with_a_json_error(worker: Worker) -> None:
    for gpu_uuid in ("0", "GPU-short", "nvidia0", 3):
        body = json.dumps({"capability": "diagnostic.echo", "input": {}, "gpu_uuid": gpu_uuid}).encode()
        answer = worker.client().request("POST", "/v1/run", body)
        assert (answer.status, answer.error_code, answer.body["error"]["retryable"]) == (400, "invalid_request", False)
        assert "gpu_uuid must be" in answer.body["error"]["message"]
    assert _gpus(worker) == {GPU_A: False, GPU_B: False}


def test_the_gpu_slots_end_with_the_worker(root: Path) -> None:
    (root / "second").mkdir()
    worker = start_worker(root / "second.log", worker_env(root / "second"), timeout=120)
    try:
        assert worker.client().run("diagnostic.echo", {}, None, GPU_A).status == 200
        gpu_slot = _slots_by_device(worker)[GPU_A]
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(15) == 0
        wait_until(lambda: not alive(gpu_slot), 10, "the GPU slot's process to end")
    finally:
        worker.stop(signal.SIGKILL)
