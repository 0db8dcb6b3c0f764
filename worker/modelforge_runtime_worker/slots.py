"""Job slots as processes: every job runs in its slot's own process, which can be killed.

``MODELFORGE_WORKER_SLOTS`` slots; each is one ``slot_process`` child that loads the capabilities
once (its models from files it verified itself) and runs one job at a time. The worker's side of a
slot (``SlotProcess``) hands a job over as a frame and waits for the answer while watching the
job's abort switch (``ocr.Cancel``, set at the job's deadline, on a cancel, or on a stop): when it
is set, the slot's process is killed (SIGTERM, then SIGKILL after ``KILL_GRACE_SECONDS``), the job
ends as aborted, and a new process is started for the slot at once. So a job that Pillow or
onnxruntime will not let go of (a hostile image, a hung kernel) holds its slot no longer than its
deadline plus the kill, and a crash or a kill in one slot never touches another.

A slot whose process died while it ran a job (a crash, an out-of-memory kill) answers that job
``job_failed`` and starts again. The first job a restarting slot gets waits for it to be ready
(within the job's deadline).

**GPU slots.** Besides the pool of ``MODELFORGE_WORKER_SLOTS`` slots, started with the worker, a
job may name a GPU by its UUID (``gpu_uuid``): it runs in that GPU's own slot, whose process is
started with ``CUDA_VISIBLE_DEVICES=<the UUID>`` and so sees that GPU only (as CUDA's device 0).
The slot is made on the GPU's first job (the job waits for it to load its models, within its
deadline), kept after, and killed and started again like the pool's slots, on the same GPU.

**The environment of a slot's process** is built, never inherited whole (``slot_environment``):
what it needs to start the interpreter and load its libraries, and ``CUDA_VISIBLE_DEVICES``. Its
settings come in its start frame, so no secret the worker's own environment may hold (an admin
token, cloud credentials) reaches a process that handles untrusted input.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from modelforge_protocol.child_processes import PROCESS_ENVIRONMENT
from modelforge_protocol.work import MAX_WORKER_SLOTS

from .capabilities import Capability
from .child_process import signal_name
from .errors import (
    CapabilityUnavailable,
    GpuSlotsFull,
    InvalidInput,
    InvalidRequest,
    JobFailed,
    RunError,
    ShuttingDown,
    UnknownCapability,
)
from .jobs import SlotKey
from .ocr import Cancel, JobCancelled
from .slot_frames import FrameError, read_frame, write_frame

log = logging.getLogger("modelforge.worker.slots")

#: How long a slot's process has to end after SIGTERM before it gets SIGKILL.
KILL_GRACE_SECONDS = 1.0
#: How long a new slot process may take to check its artifacts and load its models.
READY_SECONDS = 300.0
#: How often a waiting job looks at its abort switch.
POLL_SECONDS = 0.05
#: What a slot's process keeps of the worker's environment: what every child process keeps (what
#: finds the interpreter, its packages and the CUDA libraries, the locale, a home and a temporary
#: folder) and CUDA's own cache and loading settings. Nothing else.
SLOT_ENVIRONMENT = (*PROCESS_ENVIRONMENT, "CUDA_CACHE_PATH", "CUDA_MODULE_LOADING")
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: What the pool's slots also keep, to see the GPUs the worker sees, as they always have.
_POOL_ENVIRONMENT = (CUDA_VISIBLE_DEVICES, "CUDA_DEVICE_ORDER")
_ERRORS: dict[str, type[RunError]] = {
    InvalidInput.code: InvalidInput,
    InvalidRequest.code: InvalidRequest,
    UnknownCapability.code: UnknownCapability,
    JobFailed.code: JobFailed,
}


def threads_per_slot(slots: int, cores: int) -> int | None:
    """onnxruntime's intra-op threads for each slot: one slot keeps onnxruntime's default (every
    core); more slots share the cores, at least one each. Measured on 2 cores (``bench/ocr.py
    --slots 2``): 2 slots of 1 thread read 6.19 images/s, 1 slot of every core 3.90, and 2 slots that
    each used every core 3.65 (their threads fought over the cores)."""
    if slots <= 1:
        return None
    return max(1, cores // slots)


def slot_environment(gpu_uuid: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a slot's process: ``SLOT_ENVIRONMENT`` from the worker's (``environ``),
    and for the slot of a GPU ``CUDA_VISIBLE_DEVICES=<its UUID>``; a slot of the pool keeps the
    worker's own ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, if set."""
    environ = os.environ if environ is None else environ
    if gpu_uuid is None:
        kept = (*SLOT_ENVIRONMENT, *_POOL_ENVIRONMENT)
        return {name: environ[name] for name in kept if name in environ}
    env = {name: environ[name] for name in SLOT_ENVIRONMENT if name in environ}
    # The UUID, never an index: CUDA numbers the devices fastest first (its CUDA_DEVICE_ORDER
    # default), NVML and nvidia-smi by PCI bus id, so wherever the two orders differ (mixed GPUs,
    # some MIG layouts) CUDA's device N is another GPU than NVML's N. A UUID names one GPU in both.
    env[CUDA_VISIBLE_DEVICES] = gpu_uuid
    return env


class _Spawner:
    """Starts the slot processes, all from one thread that lives as long as the worker.

    A slot's process dies with its parent (``child_process.die_with_parent``: ``PR_SET_PDEATHSIG``),
    and Linux sends that signal when the *thread* that forked the child ends, not the process. A
    slot restarted by a job's thread (after a kill, or on its first job) would be killed again the
    moment that job's thread ended, and every later job would have to start it anew. Forked from
    this thread, which never ends before the worker does, a slot's process lives until it is
    killed or the worker ends."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[list[str], dict[str, Any], queue.Queue[Any]]] = queue.Queue()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def popen(self, command: list[str], **options: Any) -> subprocess.Popen[bytes]:
        with self._guard:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="slot-spawner", daemon=True)
                self._thread.start()
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._requests.put((command, options, reply))
        started = reply.get()
        if isinstance(started, BaseException):
            raise started
        return started  # type: ignore[no-any-return]

    def _serve(self) -> None:
        while True:
            command, options, reply = self._requests.get()
            try:
                reply.put(subprocess.Popen(command, **options))  # noqa: S603 - our own interpreter and module, no shell
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                reply.put(error)


_SPAWNER = _Spawner()


class SlotDown(Exception):
    """The slot's process did not become ready (it exited, or took longer than ``READY_SECONDS``)."""


class Described:
    """A capability as a slot process described it: what ``GET /v1/status`` lists and what the
    worker checks before a run. It runs only in a slot (``SlotProcesses.execute``)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.name: str = entry["name"]
        self.model: str = entry["model"]
        self.model_sha256: str | None = entry["model_sha256"]
        self.device: str = entry["device"]
        self.available: bool = entry["available"]
        self.reason: str | None = entry["reason"]

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        raise JobFailed(f"{self.name} runs only in a slot process")


class SlotProcess:
    """The worker's side of one slot's process: ``key`` is its number in the pool, or the UUID of
    its GPU, which decides the environment of its process (``slot_environment``)."""

    def __init__(self, key: SlotKey, start: dict[str, Any], ready_seconds: float = READY_SECONDS) -> None:
        self.key = key
        self._start = start
        self._ready_seconds = ready_seconds
        self._env = slot_environment(key if isinstance(key, str) else None)
        self._guard = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ready = threading.Event()
        self._stopping = False
        #: the capabilities the process said it runs (set when it is ready)
        self.capabilities: list[dict[str, Any]] | None = None

    # --- the process ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start a new process for the slot (its readiness comes later: ``wait_ready``)."""
        with self._guard:
            if self._stopping:
                return
            self._ready.clear()
            answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
            process = _SPAWNER.popen(
                [sys.executable, "-m", "modelforge_runtime_worker.slot_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self._env,
            )
            self._process, self._answers = process, answers
        assert process.stdin is not None and process.stdout is not None
        threading.Thread(
            target=self._read, args=(process, answers), name=f"slot-{self.key}-reader", daemon=True
        ).start()
        try:
            write_frame(process.stdin, {"type": "start", **self._start})
        except (OSError, FrameError):
            return  # it died at once: the reader says so
        log.debug("slot process started", extra={"event": "slot_started", "slot": self.key, "pid": process.pid})

    def _read(self, process: subprocess.Popen[bytes], answers: queue.Queue[dict[str, Any] | None]) -> None:
        assert process.stdout is not None
        try:
            first = read_frame(process.stdout)
            if first.get("type") == "ready" and isinstance(first.get("capabilities"), list):
                self.capabilities = first["capabilities"]
                self._ready.set()
            while True:
                answers.put(read_frame(process.stdout))
        except (FrameError, OSError, ValueError):
            # the process ended, or was killed and its pipe closed (ValueError: read of a closed
            # file), or broke the protocol (its job then fails and the slot starts again)
            answers.put(None)
        except Exception:  # noqa: BLE001 - a reader thread must never die silently
            log.exception("slot reader failed", extra={"event": "slot_reader_failed", "slot": self.key})
            answers.put(None)

    def wait_ready(self, seconds: float, cancel: Cancel | None = None) -> None:
        """Wait until the slot's process is ready; SlotDown if it ended or took too long, or
        JobCancelled if ``cancel`` was set meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._ready.wait(POLL_SECONDS):
            process = self._process
            if cancel is not None and cancel.is_set():
                raise JobCancelled()
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise SlotDown(f"slot {self.key}'s process ended before it was ready (exit {code})")
            if time.monotonic() > deadline:
                raise SlotDown(f"slot {self.key}'s process was not ready after {seconds:g} s")

    def restart(self) -> None:
        """Kill the slot's process and start a new one."""
        self.kill()
        self.start()

    def kill(self) -> None:
        """SIGTERM, then SIGKILL after ``KILL_GRACE_SECONDS``; reaped."""
        with self._guard:
            process, self._process = self._process, None
            self._ready.clear()
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(KILL_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def stop(self) -> None:
        """No more restarts; the process is ended."""
        with self._guard:
            self._stopping = True
        self.kill()

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    # --- one job ----------------------------------------------------------------------------------

    def run(self, capability: str, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        """Run one job in the slot's process. When ``cancel`` is set first, the process is killed
        (and a new one started) and JobCancelled raised."""
        idle = self._process
        if idle is None or idle.poll() is not None:  # it died while idle: a new one takes this job
            self.restart()
        try:
            self.wait_ready(self._ready_seconds, cancel)
        except SlotDown as down:
            self.restart()
            raise JobFailed(f"{capability} could not run: {down} (the slot is starting again)") from None
        process, answers = self._process, self._answers
        if process is None or process.stdin is None:
            raise JobFailed(f"{capability} could not run: slot {self.key} has no process")
        try:
            write_frame(process.stdin, {"type": "run", "capability": capability, "input": payload})
        except (OSError, FrameError):
            self.restart()
            raise JobFailed(f"{capability} could not run: slot {self.key}'s process went away") from None
        while True:
            try:
                frame = answers.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if cancel.is_set():
                    self.restart()
                    raise JobCancelled() from None
                continue
            if frame is None:
                try:
                    code = process.wait(KILL_GRACE_SECONDS)
                except subprocess.TimeoutExpired:  # alive, but its answer was not a frame
                    self.restart()
                    raise JobFailed(f"{capability} failed: its slot process broke the frame protocol") from None
                self.restart()
                how = f"signal {signal_name(-code)}" if code < 0 else f"exit {code}"
                log.error(
                    f"slot {self.key}'s process ended while it ran a job ({how})",
                    extra={"event": "slot_crashed", "slot": self.key, "capability": capability},
                )
                raise JobFailed(f"{capability} failed: its process ended while it ran ({how})")
            return _result(frame, capability)


def _result(frame: dict[str, Any], capability: str) -> dict[str, Any]:
    if frame.get("type") == "done" and isinstance(frame.get("result"), dict):
        return frame["result"]  # type: ignore[no-any-return]
    if frame.get("type") == "error":
        code, message = str(frame.get("code")), str(frame.get("message"))
        if code in ("capability_unavailable", "artifact_quarantined"):
            raise CapabilityUnavailable(message, code)
        raise _ERRORS.get(code, JobFailed)(message)
    raise JobFailed(f"{capability} failed: its slot answered a malformed frame")


class SlotProcesses:
    """All the worker's slots: the pool's (``slots``) and the GPUs' (``gpu_slots``, made on each
    GPU's first job, at most ``max_gpu_slots``). ``execute`` is what ``jobs.JobRunner`` calls to run
    a job in one."""

    def __init__(
        self,
        count: int,
        start: dict[str, Any],
        ready_seconds: float = READY_SECONDS,
        max_gpu_slots: int = MAX_WORKER_SLOTS,
    ) -> None:
        self.slots = [SlotProcess(index, start, ready_seconds) for index in range(count)]
        #: GPU UUID -> its slot
        self.gpu_slots: dict[str, SlotProcess] = {}
        self._start = start
        self._ready_seconds = ready_seconds
        self._max_gpu_slots = max_gpu_slots
        self._guard = threading.Lock()
        self._stopping = False

    def start(self) -> list[Described]:
        """Start every slot and wait until all are ready; the capabilities they run (SlotDown if a
        slot did not come up)."""
        for slot in self.slots:
            slot.start()
        for slot in self.slots:
            slot.wait_ready(self._ready_seconds)
        assert self.slots[0].capabilities is not None
        return [Described(entry) for entry in self.slots[0].capabilities]

    def execute(self, slot: SlotKey, capability: Capability, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        process = self.gpu_slot(slot) if isinstance(slot, str) else self.slots[slot]
        return process.run(capability.name, payload, cancel)

    def gpu_slot(self, gpu_uuid: str) -> SlotProcess:
        """The slot of the GPU ``gpu_uuid``, made and started on its first job (``JobRunner`` bounds
        how many there are first; this bound is the backstop)."""
        with self._guard:
            if self._stopping:
                raise ShuttingDown("the worker is stopping")
            slot = self.gpu_slots.get(gpu_uuid)
            if slot is None:
                if len(self.gpu_slots) >= self._max_gpu_slots:
                    raise GpuSlotsFull(f"this worker already has slots for {self._max_gpu_slots} GPUs")
                slot = self.gpu_slots[gpu_uuid] = SlotProcess(gpu_uuid, self._start, self._ready_seconds)
                slot.start()
                log.info(
                    f"slot for GPU {gpu_uuid} started",
                    extra={"event": "gpu_slot_created", "gpu_uuid": gpu_uuid, "pid": slot.pid},
                )
            return slot

    def stop(self) -> None:
        with self._guard:
            self._stopping = True
            every = [*self.slots, *self.gpu_slots.values()]
        for slot in every:
            slot.stop()
