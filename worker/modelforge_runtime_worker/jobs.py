"""One job per slot at a time, each bounded in time, and each stoppable by the id its caller gave it.

``slots`` slots (``MODELFORGE_WORKER_SLOTS``); a job takes a free one, or is refused
``WorkerBusy``. A slot is taken when a job starts and given back by the job's own thread when the
job has really ended, not when its caller stopped waiting: a job past its deadline is aborted
(``Cancel``) and its caller gets ``JobTimedOut`` at once, and its slot stays taken until the
aborted run has unwound, so two jobs never share a slot. Where the job runs is the ``execute``
given: in this process (tests), or in the slot's own process, which the abort kills
(``slots.SlotProcesses.execute``: the worker's way).

Two pools of slots, never mixed. The pool of ``slots`` (``MODELFORGE_WORKER_SLOTS``), numbered
0..slots-1, takes every job that names no GPU, as it always has. A job that names a GPU by its
UUID (``gpu_uuid``) runs only in that GPU's own slot, keyed by the UUID: made on its first job,
kept after, one job at a time (a second job for it is ``WorkerBusy``, whatever the pool does), and
at most ``max_gpu_slots`` of them (a job for one more GPU is ``GpuSlotsFull``).

A cancel (``cancel(job_id)``) aborts the running job of that id the same way; its caller gets
``Cancelled`` once the job has unwound (at its deadline at the latest), so the answer of a
cancelled run means the worker is free. A cancel that finds no job of that id remembers the id
(the last ``REMEMBERED_CANCELS``): a run that arrives with it afterwards is refused at once, so a
cancel that overtakes its own run still stops it. The errors are the worker's own
(``errors.py``); the HTTP layer gives them their status codes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol.work import MAX_WORKER_SLOTS, WORKER_CANCEL_STATES

from .capabilities import Capability
from .errors import Cancelled, GpuSlotsFull, JobFailed, JobTimedOut, RunError, ShuttingDown, WorkerBusy
from .ocr import Cancel, JobCancelled

log = logging.getLogger("modelforge.worker")

ENDED, ENDING, NOT_RUNNING = WORKER_CANCEL_STATES
#: How many ids of cancels that found no running job are remembered.
REMEMBERED_CANCELS = 64


#: A slot: a number in the pool, or the UUID of the GPU whose own slot it is.
SlotKey = int | str
#: Runs a job: (slot, capability, input, abort switch) -> result.
Execute = Callable[[SlotKey, Capability, dict[str, Any], Cancel], dict[str, Any]]


def in_this_process(slot: SlotKey, capability: Capability, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
    return capability.run(payload, cancel)


@dataclass
class _Running:
    job: int
    job_id: str | None
    capability: str
    slot: SlotKey
    cancel: Cancel = field(default_factory=Cancel)
    ended: threading.Event = field(default_factory=threading.Event)
    #: set by ``cancel``: the caller asked for the stop, its run answers ``Cancelled``
    cancelled: bool = False


class JobRunner:
    def __init__(
        self,
        timeout_seconds: float,
        slots: int = 1,
        execute: Execute = in_this_process,
        max_gpu_slots: int = MAX_WORKER_SLOTS,
    ) -> None:
        if slots < 1:
            raise ValueError("a worker has at least one slot")
        self.timeout_seconds = timeout_seconds
        self.slots = slots
        self.max_gpu_slots = max_gpu_slots
        self._execute = execute
        self._guard = threading.Condition()
        #: slot -> the job running in it
        self._running: dict[SlotKey, _Running] = {}
        #: the GPUs that have a slot, in the order of their first job
        self._gpus: list[str] = []
        self._stopping = False
        self._sequence = 0
        self._cancelled_early: OrderedDict[str, None] = OrderedDict()

    def run(
        self, capability: Capability, payload: dict[str, Any], job_id: str | None = None, gpu_uuid: str | None = None
    ) -> dict[str, Any]:
        """``capability``'s result for ``payload``, or a ``RunError``; in the slot of the GPU
        ``gpu_uuid`` when given, else in the pool."""
        running = self._begin(capability, job_id, gpu_uuid)
        outcome: dict[str, Any] = {}
        started = time.monotonic()

        def work() -> None:
            try:
                outcome["result"] = self._execute(running.slot, capability, payload, running.cancel)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting request
                outcome["error"] = error
            finally:
                self._release(running)
                if running.cancel.is_set():
                    log.info(
                        "aborted job ended",
                        extra={
                            "event": "job_aborted",
                            "job": running.job,
                            "job_id": running.job_id,
                            "capability": capability.name,
                            "cancelled": running.cancelled,
                            "duration_ms": _ms(started),
                        },
                    )

        log.debug(
            "job started",
            extra={
                "event": "job_started",
                "job": running.job,
                "job_id": job_id,
                "capability": capability.name,
                "slot": running.slot,
            },
        )
        try:
            threading.Thread(target=work, name=f"job-{running.job}", daemon=True).start()
        except BaseException:
            self._release(running)
            raise
        if not running.ended.wait(self.timeout_seconds):
            running.cancel.set()
            if running.cancelled:
                raise Cancelled("the job was cancelled; it is still unwinding (the worker stays busy until it has)")
            log.warning(
                f"job exceeded {self.timeout_seconds:g} s and is being aborted",
                extra={"event": "job_timeout", "job": running.job, "capability": capability.name},
            )
            raise JobTimedOut(f"the job ran over {self.timeout_seconds:g} s and was aborted")
        return _answer(running, capability, outcome)

    def _begin(self, capability: Capability, job_id: str | None, gpu_uuid: str | None) -> _Running:
        with self._guard:
            if job_id is not None and job_id in self._cancelled_early:
                del self._cancelled_early[job_id]
                raise Cancelled(f"job {job_id} was cancelled before it started")
            free = self._free_slot(gpu_uuid)
            if self._stopping:
                raise ShuttingDown("the worker is stopping")
            if gpu_uuid is not None and gpu_uuid not in self._gpus:
                self._gpus.append(gpu_uuid)
            self._sequence += 1
            running = self._running[free] = _Running(self._sequence, job_id, capability.name, free)
            return running

    def _free_slot(self, gpu_uuid: str | None) -> SlotKey:
        """The slot a job takes (under the guard): a free one of the pool, or the GPU's own."""
        if gpu_uuid is not None:
            if gpu_uuid in self._running:
                raise WorkerBusy(f"the slot of GPU {gpu_uuid} is running a job; retry when it is done")
            if gpu_uuid not in self._gpus and len(self._gpus) >= self.max_gpu_slots:
                raise GpuSlotsFull(
                    f"this worker already has slots for {self.max_gpu_slots} GPUs, the most it keeps;"
                    f" {gpu_uuid} gets none until the worker restarts"
                )
            return gpu_uuid
        free = next((slot for slot in range(self.slots) if slot not in self._running), None)
        if free is None:
            what = "another job is running" if self.slots == 1 else f"all {self.slots} slots are running jobs"
            raise WorkerBusy(f"{what}; retry when one is done")
        return free

    def _release(self, running: _Running) -> None:
        with self._guard:
            if self._running.get(running.slot) is running:
                del self._running[running.slot]
            self._guard.notify_all()
        running.ended.set()

    def cancel(self, job_id: str, wait_seconds: float) -> str:
        """Abort the running job ``job_id`` and wait up to ``wait_seconds`` for it to unwind:
        ``ended`` (its slot is free), ``ending``, or ``not_running`` (the id is remembered)."""
        with self._guard:
            running = next((job for job in self._running.values() if job.job_id == job_id), None)
            if running is None:
                self._cancelled_early[job_id] = None
                while len(self._cancelled_early) > REMEMBERED_CANCELS:
                    self._cancelled_early.popitem(last=False)
                return NOT_RUNNING
            running.cancelled = True
            running.cancel.set()
        log.info(
            f"job {job_id} cancelled",
            extra={"event": "job_cancelled", "job": running.job, "job_id": job_id, "capability": running.capability},
        )
        return ENDED if running.ended.wait(wait_seconds) else ENDING

    def stop(self, grace_seconds: float) -> bool:
        """Refuse new jobs, abort the running ones, and wait up to ``grace_seconds`` for them to end."""
        with self._guard:
            self._stopping = True
            for running in self._running.values():
                running.cancel.set()
            return self._guard.wait_for(lambda: not self._running, grace_seconds)

    @property
    def busy(self) -> bool:
        """Every slot of the pool is running a job (a run without a GPU now would be refused
        ``WorkerBusy``)."""
        return self.slots_busy >= self.slots

    @property
    def slots_busy(self) -> int:
        """The pool's slots running a job (GPU slots not counted)."""
        with self._guard:
            return sum(1 for slot in self._running if isinstance(slot, int))

    @property
    def gpu_slots(self) -> list[dict[str, Any]]:
        """``[{"uuid", "busy"}]``: each GPU slot there is, in the order of its first job."""
        with self._guard:
            return [{"uuid": uuid, "busy": uuid in self._running} for uuid in self._gpus]


def _answer(running: _Running, capability: Capability, outcome: dict[str, Any]) -> dict[str, Any]:
    """The ended job's result, or the error its caller gets."""
    if running.cancelled:
        raise Cancelled(f"job {running.job_id} was cancelled")
    error = outcome.get("error")
    if isinstance(error, RunError):
        raise error
    if isinstance(error, JobCancelled):
        raise ShuttingDown("the job was aborted: the worker is stopping")
    if error is not None:
        log.error(
            "job failed",
            exc_info=error,
            extra={"event": "job_failed", "job": running.job, "capability": capability.name},
        )
        raise JobFailed(f"{capability.name} failed ({type(error).__name__})")
    return outcome["result"]  # type: ignore[no-any-return]


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)
