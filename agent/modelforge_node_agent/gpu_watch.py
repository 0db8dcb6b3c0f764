"""The agent's side of per-GPU health: what each heartbeat reports, and which GPUs take work.

One ``GpuWatch`` per agent. It owns the ``HealthTracker`` (``gpu_health.py``) and, on a GPU node,
the Xid event thread (``gpu_events.py``):

- **Each heartbeat** (to a control plane that lists ``gpu_health``): the host's ``boot_id``, and the
  GPUs' grades when they changed since the last report the control plane accepted (always on this
  process's first, and after a re-check). The read of every GPU's signals is time-bounded like the
  telemetry's; a read that does not answer in time keeps the last grades (nothing is invented).
- **Each answer**: ``drained`` (claim nothing new), ``blocked_gpus`` (GPUs the control plane keeps
  from work: a latched fault, or an admin's drain) and ``recheck_gpus`` (an admin cleared a latched
  fault: re-check that GPU from a fresh read before it takes work again).
- **The work loop** asks ``usable_gpus`` for the GPUs that may take a job now (one slot each):
  schedulable by the agent's own grade (healthy, degraded or unknown, not MIG), not blocked, and
  the node not drained. ``slot_gpus`` are every GPU that has a slot at all.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from modelforge_protocol.schemas import BOOT_ID_PATTERN, FEATURE_GPU_HEALTH

from .bounded_call import BoundedCall, NoAnswer
from .gpu import (
    GpuHealthProbe,
    GpuInfo,
    GpuLost,
    HealthSignals,
    NvmlUnavailable,
    present_health_signals,
    read_all_health_signals,
)
from .gpu_events import XidEventThread
from .gpu_health import GpuHealth, HealthTracker, health_report

log = logging.getLogger("modelforge.agent")

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    """The kernel's boot id (None where there is none, or it is not one: never invented)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if re.fullmatch(BOOT_ID_PATTERN, text) else None


def utc_now() -> datetime:
    return datetime.now(UTC)


class GpuWatch:
    """Per-GPU health for the heartbeat, and the GPUs that take work (none on a CPU node)."""

    def __init__(
        self,
        probe: GpuHealthProbe | None,
        gpus: list[GpuInfo],
        timeout_seconds: float,
        *,
        boot_id: str | None = None,
        wall: Callable[[], datetime] = utc_now,
    ) -> None:
        self._probe = probe if gpus else None
        self._gpus = list(gpus)
        self._timeout = timeout_seconds
        self._wall = wall
        self.boot_id = boot_id
        self._tracker = HealthTracker(known_uuids=[gpu.uuid for gpu in gpus])
        self._lock = threading.Lock()
        self._drained = False
        self._blocked: dict[str, str] = {}
        #: the grades the last heartbeat sent (accepted once its answer came)
        self._in_flight: list[GpuHealth] | None = None
        self._events = (
            XidEventThread(self._probe, self._tracker, lambda: self._gpus, wall) if self._probe is not None else None
        )
        if self._probe is not None:
            self._tracker.grade(self._gpus, {}, wall())  # every GPU is known to take a slot from the start

    @property
    def has_gpus(self) -> bool:
        return self._probe is not None

    def start(self) -> None:
        if self._events is not None:
            self._events.start()

    def close(self) -> None:
        if self._events is not None:
            self._events.stop()

    # --- the heartbeat ------------------------------------------------------------------------

    def heartbeat_part(self, features: frozenset[str]) -> dict[str, Any]:
        """``boot_id`` and, when changed, ``gpu_health``: only to a control plane listing ``gpu_health``."""
        if FEATURE_GPU_HEALTH not in features:
            return {}
        part: dict[str, Any] = {"boot_id": self.boot_id} if self.boot_id else {}
        if self._probe is None:
            return part
        graded = self._grade()
        if self._tracker.report_due(graded):
            part["gpu_health"] = health_report(graded)
            self._in_flight = graded
        return part

    def _read(self, work: Callable[[], Any], what: str) -> Any:
        try:
            return BoundedCall(work).start(f"nvml-{what}").result(self._timeout)
        except NoAnswer:
            log.warning(
                f"NVML did not answer the GPU {what} read within {self._timeout:g}s; keeping the last grades",
                extra={"event": "gpu_health_read_timeout"},
            )
            return None

    def _grade(self) -> list[GpuHealth]:
        assert self._probe is not None
        probe = self._probe
        read: tuple[list[str], Mapping[str, HealthSignals | GpuLost]] | None
        try:
            read = self._read(lambda: present_health_signals(probe, self._gpus), "health")
        except NvmlUnavailable as error:
            log.warning(f"cannot read GPU health: {error}", extra={"event": "gpu_health_unreadable"})
            read = None
        if read is None:
            return self._tracker.health()
        present, signals = read
        return self._tracker.grade(present, signals, self._wall())

    def answered(self, answer: dict[str, Any]) -> bool:
        """Take the heartbeat answer's GPU part; True when what may take work changed."""
        if self._in_flight is not None:
            self._tracker.mark_sent(self._in_flight)
            self._in_flight = None
        before = self.usable_gpus()
        with self._lock:
            self._drained = answer.get("drained") is True
            self._blocked = {
                entry["uuid"]: entry["reason"]
                for entry in answer.get("blocked_gpus") or []
                if isinstance(entry, dict) and "uuid" in entry
            }
        for uuid in answer.get("recheck_gpus") or []:
            self._recheck(uuid)
        return self.usable_gpus() != before

    def _recheck(self, uuid: str) -> None:
        """An admin cleared the GPU's latched fault: grade it again from a fresh read; the next
        heartbeat reports the result (a GPU still broken is latched again by the control plane)."""
        gpu = next((gpu for gpu in self._gpus if gpu.uuid == uuid), None)
        if gpu is None or self._probe is None:
            return
        probe = self._probe
        signals = self._read(lambda: read_all_health_signals(probe, [gpu])[gpu.uuid], "re-check")
        if signals is None:
            return
        health = self._tracker.recheck(uuid, signals, self._wall())
        self._tracker.mark_sent([])  # the re-check's result is always reported
        log.info(
            f"GPU {uuid} re-checked after its fault was cleared: {health.state}",
            extra={"event": "gpu_rechecked", "gpu_uuid": uuid, "state": health.state},
        )

    # --- the work loop ------------------------------------------------------------------------

    @property
    def drained(self) -> bool:
        with self._lock:
            return self._drained

    def slot_gpus(self) -> list[str]:
        """Every GPU that has a slot: present at start and not in MIG mode (MIG instances are not
        slots yet), in inventory order."""
        mig = {gpu.uuid for gpu in self._tracker.health() if gpu.mig}
        return [gpu.uuid for gpu in self._gpus if gpu.uuid not in mig]

    def usable_gpus(self) -> list[str]:
        """The GPUs that may take a job now, in inventory order."""
        with self._lock:
            if self._drained:
                return []
            blocked = set(self._blocked)
        schedulable = set(self._tracker.schedulable_uuids())
        return [uuid for uuid in self.slot_gpus() if uuid in schedulable and uuid not in blocked]

    def hard_faulted(self) -> set[str]:
        """GPUs that are unschedulable or failed now, by the last grade or by an Xid the event
        thread saw since (a job on one is the node's failure, not the item's)."""
        graded = {gpu.uuid for gpu in self._tracker.health() if gpu.state in ("unschedulable", "failed")}
        return graded | self._tracker.hard_latched()
