"""The claim loop: the work thread, and the publishing thread's side of it.

- the publishing thread (``agent.Agent``) calls ``observe`` once per heartbeat and ``hint`` when a
  heartbeat answer says ``work_waiting`` (or a channel says ``wake``); ``renew_now(work_id)`` (a
  channel's ``cancel``) makes the running job of that work renew its lease at once, so a 409
  ``work_cancelled`` stops it on the worker within about a second rather than at the next interval;
- one work thread per slot of the worker (its status's ``slots.total``; 1 for a worker without the
  ``slots`` feature): each waits for a hint, then drains: claims, runs the job (``job.Job``),
  claims again at once, until the claim answers 204 (nothing claimable); then it waits for the
  next hint. So the node claims only while it has a free slot, one claim per slot, and each job
  keeps its own lease. A node whose worker is not ready ignores hints: idle nodes never send a
  claim. After a retryable failure it stops claiming until the worker's status was polled again.

A fatal answer on the work thread (a redirect, a refused credential) or a bug is handed to the
publishing thread (``fatal``), which stops the agent with the exit code it would give for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from modelforge_protocol.work import WORKER_FEATURE_GPU_SLOTS

from ..control_plane import WORK_CLAIM, ControlPlaneClient
from ..failures import CONTROL_PLANE_FAILURES, Kind, classify
from ..gpu_watch import GpuWatch
from ..identity import Identity
from ..worker_client import WorkerClient, WorkerStatus
from .claimed import Lease, default_renew_interval
from .job import Job, Station
from .run import RunCall
from .signals import Signals
from .timing import Timing
from .transfers import PresignedObjects
from .worker_view import WorkerView

log = logging.getLogger("modelforge.agent")

#: The claim refusal of a node whose heartbeat has not brought it online yet.
NOT_ONLINE = "node_not_online"
#: A work thread's slot: a GPU's UUID when jobs run per GPU, else the worker slot's number.
Slot = int | str

#: How often the work thread looks at the stop signal and the lease while the worker runs.
POLL_SECONDS = 0.05


class WorkRunner:
    def __init__(
        self,
        client: ControlPlaneClient,
        worker: WorkerClient,
        objects: PresignedObjects,
        *,
        renew_interval: Callable[[float], float] = default_renew_interval,
        poll_seconds: float = POLL_SECONDS,
        timing: Timing | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._client = client
        self._signals = Signals(stop)
        self._view = WorkerView(worker)
        self._station = Station(
            client,
            worker,
            objects,
            self._view,
            self._signals,
            timing or Timing(),
            renew_interval,
            poll_seconds,
            self._gpu_faults,
        )
        #: per-GPU health and the GPUs that may take work (None: slots are the worker's alone)
        self._gpus: GpuWatch | None = None
        #: slot -> its work thread; a slot is a GPU's UUID when jobs run per GPU, else its number
        self._threads: dict[Slot, threading.Thread] = {}
        self._guard = threading.Lock()
        #: slot -> the job it runs, and the run it stopped waiting for (its lease was lost)
        self._current: dict[Slot, Job] = {}
        self._abandoned: dict[Slot, RunCall] = {}
        self._identity: Identity | None = None
        #: how each job ended, in order (``succeeded``, ``failed``, ``lease_lost``, ...)
        self.outcomes: list[str] = []

    # --- the publishing thread's side ----------------------------------------------------------

    @property
    def view(self) -> WorkerStatus | None:
        return self._view.current

    @property
    def fatal(self) -> BaseException | None:
        """The first fatal failure on the work thread; the publishing thread raises it."""
        return self._signals.fatal

    def observe(self) -> WorkerStatus:
        """Poll the worker's status (once per heartbeat), log it when it changed, keep it; a
        worker with more slots gets a work thread for each."""
        view = self._view.observe()
        self._start_threads()
        return view

    def use_gpus(self, gpus: GpuWatch) -> None:
        """Run jobs per GPU (one slot each, ``CUDA_VISIBLE_DEVICES`` on the worker) where the worker
        lists ``gpu_slots``; take no new work on a drained node either way."""
        self._gpus = gpus

    def _per_gpu(self) -> bool:
        view = self._view.current
        return (
            self._gpus is not None
            and self._gpus.has_gpus
            and view is not None
            and WORKER_FEATURE_GPU_SLOTS in view.features
        )

    def _gpu_faults(self) -> set[str]:
        return self._gpus.hard_faulted() if self._gpus is not None else set()

    def slot_ids(self) -> list[Slot]:
        """The slots that may take a job now: each usable GPU's, or the worker's numbered slots;
        none while the node is drained."""
        if self._gpus is not None and self._gpus.drained:
            return []
        if self._per_gpu():
            assert self._gpus is not None
            return list(self._gpus.usable_gpus())
        return list(range(self._worker_slots()))

    def _worker_slots(self) -> int:
        view = self._view.current
        return max(1, view.slots) if view is not None else 1

    @property
    def slots(self) -> int:
        """The node's slots: one per GPU that has one (jobs per GPU), else the worker's, as last
        polled (1 until it was)."""
        if self._per_gpu():
            assert self._gpus is not None
            return max(1, len(self._gpus.slot_gpus()))
        return self._worker_slots()

    @property
    def busy_slots(self) -> int:
        with self._guard:
            return len(self._current)

    def slot_report(self) -> dict[str, int]:
        """The heartbeat's ``slots``: the node's slots, those running a job, and those that may
        take work now (on usable GPUs, and none while drained)."""
        total = self.slots
        return {"total": total, "busy": min(self.busy_slots, total), "schedulable": min(len(self.slot_ids()), total)}

    def hint(self) -> None:
        """A heartbeat answer said ``work_waiting``: drain, if the worker can take work."""
        if self._view.claimable:
            self._signals.hinted.set()

    def advertised(self, features: frozenset[str]) -> None:
        """What the control plane's last answer listed in ``features`` (fail requests carry
        ``node_fault`` only where it is listed)."""
        self._signals.features = features

    def renew_now(self, work_id: str) -> None:
        """A hint that ``work_id`` may have been cancelled: if this node runs it, its lease is
        renewed at once (only that renewal's 409 stops the job); otherwise nothing happens."""
        with self._guard:
            job = next((job for job in self._current.values() if job.work_id == work_id), None)
        if job is not None:
            job.renew_now()
        else:
            log.debug("renew_now for work not running here", extra={"event": "work_renew_now_ignored"})

    def start(self, identity: Identity, wake: Callable[[], None] | None = None) -> None:
        if self._identity is not None:
            return
        self._identity = identity
        self._signals.wake_with(wake)
        self._start_threads()

    def replan(self) -> None:
        """What may take work changed (a GPU's health, a drain): start a thread for each new slot
        (one whose slot went away ends after its job: ``_drain``), and claim if work waits."""
        self._start_threads()

    def _start_threads(self) -> None:
        """A work thread for each slot that may take work (one whose slot went ends after its job:
        ``_drain``)."""
        if self._identity is None or self._signals.stopping():
            return
        with self._guard:
            for slot in self.slot_ids():
                if slot not in self._threads:
                    name = f"modelforge-work-{slot if isinstance(slot, int) else slot[:12]}"
                    thread = threading.Thread(target=self._loop, args=(slot,), name=name, daemon=True)
                    self._threads[slot] = thread
                    thread.start()

    def close(self, grace_seconds: float = 1.0) -> None:
        """Stop: running jobs are failed (retryable) if that can be said quickly; never blocks
        longer than ``grace_seconds``."""
        self._signals.close()
        with self._guard:
            threads = list(self._threads.values())
        deadline = time.monotonic() + grace_seconds
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # --- the work threads ----------------------------------------------------------------------

    def _loop(self, slot: Slot) -> None:
        try:
            while slot in self.slot_ids():
                self._signals.hinted.wait()
                if self._signals.stopping():
                    return
                self._drain(slot)
        except Exception as error:  # noqa: BLE001 - a bug: stop the agent (exit 1) rather than stop working silently
            self._signals.halt(error)
        finally:
            with self._guard:
                if self._threads.get(slot) is threading.current_thread():
                    del self._threads[slot]

    def _drain(self, slot: Slot) -> None:
        identity = self._identity
        assert identity is not None
        while not self._signals.stopping():
            if slot not in self.slot_ids():  # fewer slots now (a GPU faulted or was drained): this one ends
                return
            if not self._view.claimable:
                self._signals.hinted.clear()
                return
            if not self._worker_free(slot):
                return
            self._signals.hinted.clear()  # a hint that comes while this claim runs means another drain
            lease = self._claim(identity)
            if lease is None:
                return
            job = Job(self._station, lease, identity, slot if isinstance(slot, str) else None)
            with self._guard:
                self._current[slot] = job
            try:
                keep_draining = job.run()
            finally:
                with self._guard:
                    del self._current[slot]
            with self._guard:
                if job.abandoned is not None:
                    self._abandoned[slot] = job.abandoned
                assert job.outcome is not None  # every job ends in one ``work_finished``
                self.outcomes.append(job.outcome)
            if not keep_draining:
                return

    def _worker_free(self, slot: Slot) -> bool:
        """Wait for a run this slot stopped waiting for (its lease was lost) to end on the worker."""
        with self._guard:
            call = self._abandoned.get(slot)
        if call is None:
            return True
        if not call.done.is_set():
            log.info(
                "waiting for the worker to finish a run whose lease was lost",
                extra={"event": "work_waiting_for_worker"},
            )
            timing = self._station.timing
            while not timing.wait(call.done, self._station.poll_seconds):
                if self._signals.stopping():
                    return False
        with self._guard:
            self._abandoned.pop(slot, None)
        return True

    def _claim(self, identity: Identity) -> Lease | None:
        try:
            answer = self._client.claim(identity)
        except CONTROL_PLANE_FAILURES as error:
            failure = classify(error)
            if failure.kind is Kind.TRANSIENT:
                log.warning(
                    f"{failure.code} on POST {WORK_CLAIM}; claiming again after the next hint",
                    extra={"event": "work_claim_failed", "error": failure.code, "status": failure.status},
                )
            elif not self._signals.take(failure):
                # not online yet: a claim raced the node's first heartbeat (each slot's thread once);
                # the heartbeat brings it online and says so, so this is no warning
                level = logging.DEBUG if failure.code == NOT_ONLINE else logging.WARNING
                log.log(
                    level,
                    f"HTTP {failure.status} {failure.code} on POST {WORK_CLAIM}; claiming again after the next hint",
                    extra={"event": "work_claim_refused", "code": failure.code, "status": failure.status},
                )
            return None
        if answer is None:
            log.debug("no claimable work", extra={"event": "work_drained"})
            return None
        lease = Lease.from_claim(answer)
        log.info(
            f"claimed {lease.work_id} ({lease.capability}, epoch {lease.epoch}, lease {lease.lease_seconds}s)",
            extra={"event": "work_claimed", **lease.fields(), "lease_seconds": lease.lease_seconds},
        )
        return lease
