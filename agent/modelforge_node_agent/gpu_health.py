"""Per-GPU health: grade each GPU by NVIDIA's recommended action (issue 20, DESIGN.md decision 19).

Pure: no NVML, no clock. Signals come in (``gpu.HealthSignals``, or the ``GpuLost`` a read raised),
Xid events come in, and ``now`` comes in; ``GpuHealth`` records (wire shape ``schemas.GPU_HEALTH``)
come out. A GPU's state is the worst of its reasons: failed > unschedulable > degraded > unknown >
healthy. ``unknown`` (signals not supported, or not decided) is schedulable, like healthy and degraded.

Decisions, and why:

- **Xids** are classified by ``XID_TABLE``, pinned below with its source. Events are one-off, so an
  Xid reason is latched in ``HealthTracker`` until ``recheck`` (the control plane cleared the GPU
  after repair). Application Xids (``restart_app``) leave the GPU healthy; they are recorded for an
  hour after their last occurrence (``APP_XID_HOLD_SECONDS``) and then dropped, because no admin
  clears a healthy GPU and they would otherwise stay in every report.
- **Volatile uncorrected ECC > 0 is degraded, action ``restart_app``.** The counter counts since the
  driver loaded; an uncorrected error that was contained killed only the process that touched the
  memory (the catalogue's action for a contained ECC error, Xid 94, is RESTART_APP). What needs a
  reset or RMA is graded by the row-remap and recovery-action fields themselves, so the count alone
  only warns: schedulable, but visible.
- **Clock slowdowns** (HW slowdown; HW or SW thermal) are degraded only when seen in at least
  ``CLOCK_WINDOW_NEEDED`` (3) of the last ``CLOCK_WINDOW`` (5) readings, so one hot sample does not
  flap the report. Their action is ``none``: the GPU computes correctly, only slower.
- **NVLink**: a link seen active earlier and now inactive is degraded, action ``unknown`` (the
  catalogue names no action for a link state; the recovery-action field says drain_p2p when the
  driver wants one). A PCIe GPU (no links) has nothing to grade.
- **Not supported is unknown, never unhealthy**: a GPU whose every signal (the four fields, clock
  reasons, NVLink) is unsupported is ``unknown`` with ``health_signals_not_supported``, action
  ``none``; a partly supported GPU is graded on what it has. A read that failed for another reason
  is ``unknown`` too (``health_signal_unreadable``, action ``unknown``): nothing is invented.
- **MIG enabled** is ``unknown`` with ``mig_not_supported``; ``GpuHealth.takes_slot`` is False.
- **A vanished UUID** is ``failed`` with ``missing``, action ``reboot``: in service, a GPU vanishes
  when it falls off the bus, whose catalogue action (Xid 79) is a node reboot. A GPU removed on
  purpose is accepted by an admin on the control plane, and ``forget`` drops it here.
- **``since``** is when a reason was first seen, kept while the reason persists (a reason is the
  same while its code and Xid are). At most ``MAX_GPU_REASONS`` per GPU: the most severe are kept.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from modelforge_protocol.schemas import MAX_GPU_REASONS, SCHEDULABLE_GPU_STATES

from .gpu import ClockEvents, GpuInfo, GpuLost, HealthFields, HealthSignals, NotRead

HEALTHY, UNKNOWN, DEGRADED, UNSCHEDULABLE, FAILED = "healthy", "unknown", "degraded", "unschedulable", "failed"
#: Worst last: a GPU's state is the highest of its reasons'.
SEVERITY: Final = {HEALTHY: 0, UNKNOWN: 1, DEGRADED: 2, UNSCHEDULABLE: 3, FAILED: 4}

# --- the Xid table -----------------------------------------------------------------------------------

#: Source of the table: NVIDIA's Xid catalogue for Ampere and newer GPUs, "Resolution Bucket
#: (Immediate Action)" column, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
#: (the page carries no version number; revision used: the page as published in 2025, r570-era
#: drivers, as pinned by issue 20). Only the Xids listed below are classified; every other critical
#: Xid (94, 63, 92, ... included) grades ``degraded`` with action ``unknown`` until it is added here.
XID_CATALOGUE: Final = "NVIDIA Xid catalogue (docs.nvidia.com/deploy/xid-errors), Ampere+ immediate actions, 2025"
XID_TABLE: Final[Mapping[int, tuple[str, str]]] = {
    # RESTART_APP: the application's own fault; the GPU stays schedulable
    13: (HEALTHY, "restart_app"),  # graphics engine exception
    31: (HEALTHY, "restart_app"),  # GPU memory page fault
    43: (HEALTHY, "restart_app"),  # GPU stopped processing (reset channel verification error)
    45: (HEALTHY, "restart_app"),  # preemptive cleanup, due to previous errors
    68: (HEALTHY, "restart_app"),  # NVDEC0 exception
    69: (HEALTHY, "restart_app"),  # graphics engine class error
    # RESET_GPU
    48: (UNSCHEDULABLE, "reset_gpu"),  # double-bit ECC error
    64: (UNSCHEDULABLE, "reset_gpu"),  # ECC page retirement or row remapper recording failure
    74: (UNSCHEDULABLE, "reset_gpu"),  # NVLink error
    95: (UNSCHEDULABLE, "reset_gpu"),  # uncontained ECC error
    109: (UNSCHEDULABLE, "reset_gpu"),  # context switch timeout
    119: (UNSCHEDULABLE, "reset_gpu"),  # GSP RPC timeout
    120: (UNSCHEDULABLE, "reset_gpu"),  # GSP error
    140: (UNSCHEDULABLE, "reset_gpu"),  # unrecovered ECC error
    # RESTART_BM (node reboot)
    79: (FAILED, "reboot"),  # GPU has fallen off the bus
}

#: Recovery-action field values (nvmlGpuRecoveryAction_t) -> (state, action).
RECOVERY_ACTIONS: Final[Mapping[int, tuple[str, str] | None]] = {
    0: None,  # NVML_GPU_RECOVERY_ACTION_NONE
    1: (UNSCHEDULABLE, "reset_gpu"),  # GPU_RESET
    2: (FAILED, "reboot"),  # NODE_REBOOT
    3: (DEGRADED, "drain_p2p"),  # DRAIN_P2P
    4: (UNSCHEDULABLE, "drain_and_reset"),  # DRAIN_AND_RESET
}

CLOCK_WINDOW: Final = 5
CLOCK_WINDOW_NEEDED: Final = 3
APP_XID_HOLD_SECONDS: Final = 3600.0


@dataclass(frozen=True)
class Finding:
    """A reason before its ``since`` is known: what one signal or event says about a GPU."""

    code: str
    action: str
    state: str
    xid: int | None = None
    value: int | None = None

    @property
    def key(self) -> tuple[str, int | None]:
        """A reason is the same reason while its code and Xid are (its value may change)."""
        return (self.code, self.xid)


@dataclass(frozen=True)
class GpuReason:
    """One reason on the wire (``schemas.GPU_REASON``); ``state`` is what it makes the GPU, kept
    here to order reasons and never sent."""

    code: str
    action: str
    since: str
    state: str
    xid: int | None = None
    value: int | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"code": self.code, "action": self.action, "since": self.since}
        if self.xid is not None:
            wire["xid"] = self.xid
        if self.value is not None:
            wire["value"] = self.value
        return wire


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's graded health (``schemas.GPU_HEALTH``); ``mig`` is not sent (it only withholds the slot)."""

    uuid: str
    state: str
    reasons: tuple[GpuReason, ...] = ()
    mig: bool = False

    @property
    def schedulable(self) -> bool:
        return self.state in SCHEDULABLE_GPU_STATES

    @property
    def takes_slot(self) -> bool:
        """Schedulable and not in MIG mode (MIG instances are not slots yet)."""
        return self.schedulable and not self.mig

    def to_wire(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "state": self.state, "reasons": [reason.to_wire() for reason in self.reasons]}


def health_report(gpus: Iterable[GpuHealth]) -> dict[str, Any]:
    """The heartbeat's ``gpu_health`` (``schemas.GPU_HEALTH_REPORT``), GPUs in UUID order."""
    return {"gpus": [gpu.to_wire() for gpu in sorted(gpus, key=lambda gpu: gpu.uuid)]}


def utc_second(now: datetime) -> str:
    """``now`` as the wire's UTC second (2026-12-02T10:00:00Z); a naive time is refused."""
    if now.tzinfo is None:
        raise ValueError("health times must be timezone-aware")
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- grading: signals to findings -------------------------------------------------------------------


def classify_xid(xid: int) -> Finding:
    """An Xid by ``XID_TABLE``; one not in the table is degraded with action ``unknown``."""
    state, action = XID_TABLE.get(xid, (DEGRADED, "unknown"))
    return Finding("xid", action, state, xid=xid)


GPU_LOST: Final = Finding("gpu_lost", "reboot", FAILED)
MISSING: Final = Finding("missing", "reboot", FAILED)
MIG_NOT_SUPPORTED: Final = Finding("mig_not_supported", "none", UNKNOWN)
NOT_SUPPORTED: Final = Finding("health_signals_not_supported", "none", UNKNOWN)


def recovery_action_finding(value: int) -> Finding | None:
    """The recovery-action field: 0 is nothing; a value NVML may add later is degraded, ``unknown``."""
    if value not in RECOVERY_ACTIONS:
        return Finding("recovery_action", "unknown", DEGRADED, value=value)
    graded = RECOVERY_ACTIONS[value]
    return None if graded is None else Finding("recovery_action", graded[1], graded[0], value=value)


def field_findings(fields: HealthFields) -> list[Finding]:
    """ECC, row remapping and the recovery action; an unread field says nothing here."""
    found: list[Finding] = []
    ecc = fields.ecc_uncorrected_volatile
    if not isinstance(ecc, NotRead) and ecc > 0:
        found.append(Finding("ecc_uncorrected_volatile", "restart_app", DEGRADED, value=ecc))
    if fields.remap_pending is True:
        found.append(Finding("row_remap_pending", "reset_gpu", UNSCHEDULABLE))
    if fields.remap_failure is True:
        found.append(Finding("row_remap_failure", "rma", FAILED))
    if not isinstance(fields.recovery_action, NotRead):
        recovery = recovery_action_finding(fields.recovery_action)
        if recovery is not None:
            found.append(recovery)
    return found


def unread_findings(signals: HealthSignals) -> list[Finding]:
    """Unknown, never unhealthy: every signal unsupported, or some that could not be read."""
    values: list[object] = [*_field_values(signals.fields), signals.clocks, signals.nvlink]
    unread = [value for value in values if isinstance(value, NotRead)]
    if len(unread) == len(values) and all(value is NotRead.UNSUPPORTED for value in unread):
        return [NOT_SUPPORTED]
    failed = sum(1 for value in unread if value is NotRead.FAILED)
    return [Finding("health_signal_unreadable", "unknown", UNKNOWN, value=failed)] if failed else []


def _field_values(fields: HealthFields) -> list[object]:
    return [fields.ecc_uncorrected_volatile, fields.remap_pending, fields.remap_failure, fields.recovery_action]


def windowed_clock_findings(window: Sequence[ClockEvents]) -> list[Finding]:
    """Slowdowns seen in at least ``CLOCK_WINDOW_NEEDED`` of the last ``CLOCK_WINDOW`` readings."""
    recent = list(window)[-CLOCK_WINDOW:]
    found = []
    if sum(1 for sample in recent if sample.hw_slowdown) >= CLOCK_WINDOW_NEEDED:
        found.append(Finding("hw_slowdown", "none", DEGRADED))
    if sum(1 for sample in recent if sample.hw_thermal or sample.sw_thermal) >= CLOCK_WINDOW_NEEDED:
        found.append(Finding("thermal_slowdown", "none", DEGRADED))
    return found


def nvlink_findings(links: tuple[bool, ...], seen_up: set[int]) -> list[Finding]:
    """Links seen active before and inactive (or absent) now; ``value`` is how many."""
    down = sum(1 for link in seen_up if link >= len(links) or not links[link])
    return [Finding("nvlink_down", "unknown", DEGRADED, value=down)] if down else []


def worst_state(reasons: Iterable[GpuReason]) -> str:
    return max((reason.state for reason in reasons), key=SEVERITY.__getitem__, default=HEALTHY)


# --- the tracker ------------------------------------------------------------------------------------


@dataclass
class _Latched:
    finding: Finding
    since: datetime
    last_seen: datetime


@dataclass
class _GpuMemory:
    """What the tracker remembers of one GPU between heartbeats."""

    latched: dict[tuple[str, int | None], _Latched] = field(default_factory=dict)
    since: dict[tuple[str, int | None], datetime] = field(default_factory=dict)
    clocks: deque[ClockEvents] = field(default_factory=lambda: deque(maxlen=CLOCK_WINDOW))
    links_seen_up: set[int] = field(default_factory=set)


def _canonical(gpus: Iterable[GpuHealth]) -> frozenset[tuple[str, str, bool, frozenset[GpuReason]]]:
    """Equality that ignores nothing but order."""
    return frozenset((gpu.uuid, gpu.state, gpu.mig, frozenset(gpu.reasons)) for gpu in gpus)


class HealthTracker:
    """Per-GPU health across heartbeats. Thread-safe: the event thread calls ``record_xid`` and
    ``mark_lost`` while the heartbeat loop calls ``grade``.

    ``known_uuids`` seeds the GPU set (e.g. the last inventory sent), so a GPU that vanished
    before this process started is reported ``missing`` too.
    """

    def __init__(self, known_uuids: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, None] = dict.fromkeys(known_uuids)
        self._memory: dict[str, _GpuMemory] = {}
        self._last: dict[str, GpuHealth] = {}
        self._sent: frozenset[tuple[str, str, bool, frozenset[GpuReason]]] | None = None

    # --- events (any thread) ---

    def record_xid(self, uuid: str, xid: int, now: datetime) -> None:
        """Latch an Xid on ``uuid`` (``since`` is its first occurrence) until ``recheck``."""
        self._latch(uuid, classify_xid(xid), now)

    def mark_lost(self, uuid: str, now: datetime) -> None:
        """The GPU answered GpuIsLost: failed, reboot, latched until ``recheck``."""
        self._latch(uuid, GPU_LOST, now)

    def _latch(self, uuid: str, finding: Finding, now: datetime) -> None:
        with self._lock:
            latched = self._memory_of(uuid).latched
            held = latched.get(finding.key)
            if held is None:
                latched[finding.key] = _Latched(finding, now, now)
            else:
                held.last_seen = now

    # --- once per heartbeat ---

    def grade(
        self,
        devices: Iterable[GpuInfo | str],
        signals_by_uuid: Mapping[str, HealthSignals | GpuLost],
        now: datetime,
    ) -> list[GpuHealth]:
        """Grade every GPU present now (``devices``, and any GPU with signals) and every known GPU
        that vanished. Returns the GPUs in UUID order; ``report_due`` says whether to send them.
        """
        present = [device if isinstance(device, str) else device.uuid for device in devices]
        present += [uuid for uuid in signals_by_uuid if uuid not in present]
        with self._lock:
            self._known.update(dict.fromkeys(present))
            graded = [self._grade_one(uuid, signals_by_uuid.get(uuid), uuid in present, now) for uuid in self._known]
            graded.sort(key=lambda gpu: gpu.uuid)
            self._last = {gpu.uuid: gpu for gpu in graded}
            return graded

    def recheck(self, uuid: str, signals: HealthSignals | GpuLost, now: datetime) -> GpuHealth:
        """After repair (the control plane cleared the GPU): drop its latched Xid and lost reasons,
        and grade it again from ``signals``, a fresh read. A GPU still broken stays faulted.
        """
        with self._lock:
            self._memory_of(uuid).latched.clear()
            self._known[uuid] = None
            health = self._grade_one(uuid, signals, True, now)
            self._last[uuid] = health
            return health

    def forget(self, uuid: str) -> None:
        """An admin accepted the GPU set without ``uuid``: stop reporting it missing."""
        with self._lock:
            self._known.pop(uuid, None)
            self._memory.pop(uuid, None)
            self._last.pop(uuid, None)

    # --- what the caller reads ---

    def health(self) -> list[GpuHealth]:
        with self._lock:
            return sorted(self._last.values(), key=lambda gpu: gpu.uuid)

    def hard_latched(self) -> set[str]:
        """GPUs with a latched event (an Xid, GpuIsLost) that makes them unschedulable or failed,
        as of the event: what the work loop checks while a job runs on one, without waiting for
        the next heartbeat's grade."""
        with self._lock:
            return {
                uuid
                for uuid, memory in self._memory.items()
                if any(held.finding.state in ("unschedulable", "failed") for held in memory.latched.values())
            }

    def schedulable_uuids(self) -> list[str]:
        """GPUs that take a slot now: schedulable states, MIG-enabled GPUs excluded."""
        with self._lock:
            return sorted(uuid for uuid, gpu in self._last.items() if gpu.takes_slot)

    def report_due(self, gpus: Iterable[GpuHealth]) -> bool:
        """True when ``gpus`` differ (order aside) from the last report ``mark_sent`` recorded."""
        with self._lock:
            return _canonical(gpus) != self._sent

    def mark_sent(self, gpus: Iterable[GpuHealth]) -> None:
        """The control plane accepted a report of ``gpus``."""
        with self._lock:
            self._sent = _canonical(gpus)

    # --- inside the lock ---

    def _memory_of(self, uuid: str) -> _GpuMemory:
        return self._memory.setdefault(uuid, _GpuMemory())

    def _grade_one(self, uuid: str, signals: HealthSignals | GpuLost | None, present: bool, now: datetime) -> GpuHealth:
        memory = self._memory_of(uuid)
        self._expire_app_xids(memory, now)
        if isinstance(signals, GpuLost):
            memory.latched.setdefault(GPU_LOST.key, _Latched(GPU_LOST, now, now))
        found = [held.finding for held in memory.latched.values()]
        if not present:
            found.append(MISSING)
        elif isinstance(signals, HealthSignals):
            found += self._signal_findings(memory, signals)
        reasons = self._reasons(memory, found, now)
        mig = isinstance(signals, HealthSignals) and signals.mig_enabled is True
        return GpuHealth(uuid=uuid, state=worst_state(reasons), reasons=reasons, mig=mig)

    @staticmethod
    def _signal_findings(memory: _GpuMemory, signals: HealthSignals) -> list[Finding]:
        found = field_findings(signals.fields) + unread_findings(signals)
        if isinstance(signals.clocks, ClockEvents):
            memory.clocks.append(signals.clocks)
        found += windowed_clock_findings(memory.clocks)
        if not isinstance(signals.nvlink, NotRead):
            found += nvlink_findings(signals.nvlink, memory.links_seen_up)
            memory.links_seen_up.update(link for link, up in enumerate(signals.nvlink) if up)
        if signals.mig_enabled is True:
            found.append(MIG_NOT_SUPPORTED)
        return found

    @staticmethod
    def _expire_app_xids(memory: _GpuMemory, now: datetime) -> None:
        for key, held in list(memory.latched.items()):
            recorded_only = held.finding.state == HEALTHY
            if recorded_only and (now - held.last_seen).total_seconds() > APP_XID_HOLD_SECONDS:
                del memory.latched[key]

    @staticmethod
    def _reasons(memory: _GpuMemory, found: list[Finding], now: datetime) -> tuple[GpuReason, ...]:
        """Give each finding its ``since`` (latched: first event; others: first heartbeat it was
        seen in a row), and keep the ``MAX_GPU_REASONS`` most severe."""
        since: dict[tuple[str, int | None], datetime] = {}
        reasons = []
        for finding in {finding.key: finding for finding in found}.values():
            held = memory.latched.get(finding.key)
            first = held.since if held is not None else memory.since.get(finding.key, now)
            since[finding.key] = first
            reasons.append(
                GpuReason(finding.code, finding.action, utc_second(first), finding.state, finding.xid, finding.value)
            )
        memory.since = since
        reasons.sort(key=lambda reason: (-SEVERITY[reason.state], reason.since, reason.code, reason.xid or 0))
        return tuple(reasons[:MAX_GPU_REASONS])
