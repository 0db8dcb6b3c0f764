"""The one thread that owns the NVML event set and feeds critical Xids to ``HealthTracker``.

NVML delivers Xids as events (``nvmlDeviceRegisterEvents`` + ``nvmlEventSetWait``), not as a value to
read each heartbeat, so a daemon thread waits on them with a bounded wait (``wait_ms``, 1 s by
default) and checks its stop flag between waits; ``stop`` joins it with a bound.

A failed wait (or registration) never fails every GPU blindly: the thread re-probes, reading each
GPU's health signals, and marks only the GPUs that answer GpuIsLost as lost; then, after a backoff
(1, 2, 4, 8, 16 s, interrupted by ``stop``), it registers again. A GPU that does not support Xid
events is logged once and keeps its other signals.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from .gpu import GpuError, GpuHealthProbe, GpuInfo, GpuLost, XidRegistration, read_health_signals
from .gpu_health import HealthTracker

log = logging.getLogger("modelforge.agent")

DEFAULT_WAIT_MS = 1000
DEFAULT_BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0, 16.0)
#: How long ``stop`` waits beyond one bounded wait for the thread to end.
STOP_MARGIN_SECONDS = 2.0


class XidEventThread:
    """Registers for Xid events and hands each one to ``tracker``; ``wall`` gives each event's time.

    ``gpus`` returns the GPUs to re-probe (index and UUID, e.g. the inventory). ``reprobe``, when
    given, replaces the built-in re-probe (which marks only lost GPUs).
    """

    def __init__(
        self,
        probe: GpuHealthProbe,
        tracker: HealthTracker,
        gpus: Callable[[], Sequence[GpuInfo]],
        wall: Callable[[], datetime],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        backoff_seconds: Sequence[float] = DEFAULT_BACKOFF_SECONDS,
        reprobe: Callable[[], None] | None = None,
    ) -> None:
        if wait_ms <= 0 or not backoff_seconds:
            raise ValueError("wait_ms must be positive and backoff_seconds not empty")
        self._probe, self._tracker, self._gpus, self._wall = probe, tracker, gpus, wall
        self._wait_ms, self._backoff = wait_ms, tuple(backoff_seconds)
        self._reprobe = reprobe or self.reprobe_lost
        self._stop = threading.Event()
        self._noted_unsupported: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="modelforge-xid-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_seconds: float | None = None) -> bool:
        """Ask the thread to end and join it, at most one wait plus a margin; True when it ended."""
        self._stop.set()
        if self._thread.ident is None:
            return True
        bound = timeout_seconds if timeout_seconds is not None else self._wait_ms / 1000 + STOP_MARGIN_SECONDS
        self._thread.join(bound)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def reprobe_lost(self) -> None:
        """Read every GPU's signals; mark lost only those that answer GpuIsLost."""
        for gpu in self._gpus():
            try:
                read_health_signals(self._probe, gpu.index)
            except GpuLost:
                log.warning("gpu lost", extra={"event": "gpu_lost", "gpu_uuid": gpu.uuid, "gpu_index": gpu.index})
                self._tracker.mark_lost(gpu.uuid, self._wall())
            except GpuError:
                continue  # not lost; its heartbeat read grades it

    # --- the thread ---

    def _run(self) -> None:
        failures = 0
        registered = False
        while not self._stop.is_set():
            try:
                if not registered:
                    self._note(self._probe.register_xid_events())
                    registered = True
                event = self._probe.wait_xid(self._wait_ms)
            except Exception as error:  # XidEventsFailed, or anything else: re-probe, never fail all
                delay = self._backoff[min(failures, len(self._backoff) - 1)]
                log.warning(
                    "xid events failed; re-probing",
                    extra={"event": "xid_events_failed", "error": str(error), "retry_in_seconds": delay},
                )
                self._safe_reprobe()
                registered = False
                self._stop.wait(delay)
                failures += 1
                continue
            failures = 0
            if event is not None:
                log.warning("gpu xid", extra={"event": "gpu_xid", "gpu_uuid": event.uuid, "xid": event.xid})
                self._tracker.record_xid(event.uuid, event.xid, self._wall())

    def _safe_reprobe(self) -> None:
        try:
            self._reprobe()
        except Exception as error:  # the thread outlives a failed re-probe; the next wait tries again
            log.warning("re-probe failed", extra={"event": "gpu_reprobe_failed", "error": str(error)})

    def _note(self, registration: XidRegistration) -> None:
        for uuid in registration.unsupported:
            if uuid not in self._noted_unsupported:
                self._noted_unsupported.add(uuid)
                log.info("gpu has no xid events", extra={"event": "xid_events_unsupported", "gpu_uuid": uuid})
        for uuid in registration.failed:
            log.warning("xid event registration failed", extra={"event": "xid_register_failed", "gpu_uuid": uuid})
        lost = list(registration.lost)
        if registration.lost_indexes:  # lost before its UUID could be read: named by the inventory
            by_index = {gpu.index: gpu.uuid for gpu in self._gpus()}
            lost += [by_index[index] for index in registration.lost_indexes if index in by_index]
        for uuid in lost:
            log.warning("gpu lost", extra={"event": "gpu_lost", "gpu_uuid": uuid})
            self._tracker.mark_lost(uuid, self._wall())
