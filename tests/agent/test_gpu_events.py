"""``XidEventThread``: a real thread on a scripted probe. Events reach the tracker, a wait error
re-probes and marks only the GPU that answers GpuIsLost, unsupported GPUs are logged once, and
``stop`` joins within its bound. No test sleeps for a state: each polls with a deadline."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from modelforge_node_agent.gpu import (
    UNSUPPORTED,
    ClockEvents,
    GpuInfo,
    GpuLost,
    GpuTelemetry,
    HealthFields,
    NotRead,
    XidEvent,
    XidEventsFailed,
    XidRegistration,
)
from modelforge_node_agent.gpu_events import XidEventThread
from modelforge_node_agent.gpu_health import HealthTracker
from modelforge_node_agent.nvml_simulation import ScriptedProbe

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
UUIDS = [f"GPU-5e1a0000-0000-4000-8000-00000000000{n}" for n in range(1, 4)]
GPUS = [GpuInfo(i, uuid, "NVIDIA H100 80GB HBM3", 80, "570.124.06", "12.8") for i, uuid in enumerate(UUIDS)]
FAST = (0.01, 0.02)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.005)


class EventProbe:
    """Scripted registrations and waits; ``lost`` GPUs raise GpuLost on every health read."""

    def __init__(self, waits: list[XidEvent | Exception], registrations: list[XidRegistration | Exception]) -> None:
        self.waits, self.registrations = waits, registrations
        self.lost: set[int] = set()
        self.register_calls = 0
        self.health_reads: list[int] = []
        self._idle = threading.Event()

    def init(self) -> None: ...

    def devices(self) -> list[GpuInfo]:
        return list(GPUS)

    def telemetry(self, index: int) -> GpuTelemetry:
        raise NotImplementedError

    def shutdown(self) -> None: ...

    def device_uuids(self) -> list[str]:
        return [gpu.uuid for gpu in GPUS if gpu.index not in self.lost]

    def health_fields(self, index: int) -> HealthFields:
        self.health_reads.append(index)
        if index in self.lost:
            raise GpuLost(f"GPU {index} is lost", index)
        return HealthFields(0, False, False, 0)

    def clock_events(self, index: int) -> ClockEvents | NotRead:
        return ClockEvents(False, False, False)

    def nvlink_states(self, index: int) -> tuple[bool, ...] | NotRead:
        return UNSUPPORTED

    def mig_enabled(self, index: int) -> bool | NotRead:
        return False

    def register_xid_events(self) -> XidRegistration:
        self.register_calls += 1
        outcome = self.registrations.pop(0) if len(self.registrations) > 1 else self.registrations[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        if self.waits:
            answer = self.waits.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        self._idle.wait(timeout_ms / 1000)  # a timeout, as NVML's
        return None


def start(probe: EventProbe | ScriptedProbe, tracker: HealthTracker, wait_ms: int = 20) -> XidEventThread:
    thread = XidEventThread(probe, tracker, lambda: GPUS, lambda: T0, wait_ms=wait_ms, backoff_seconds=FAST)
    thread.start()
    return thread


def state_of(tracker: HealthTracker, uuid: str) -> str:
    graded = tracker.grade([gpu.uuid for gpu in GPUS], {}, T0)
    return next(gpu.state for gpu in graded if gpu.uuid == uuid)


def test_xid_events_reach_the_tracker() -> None:
    tracker = HealthTracker()
    probe = EventProbe([XidEvent(UUIDS[1], 48), XidEvent(UUIDS[0], 13)], [XidRegistration(registered=tuple(UUIDS))])
    thread = start(probe, tracker)
    try:
        wait_until(lambda: state_of(tracker, UUIDS[1]) == "unschedulable")
        assert state_of(tracker, UUIDS[0]) == "healthy"
    finally:
        assert thread.stop()


def test_wait_error_reprobes_and_marks_only_the_lost_gpu() -> None:
    tracker = HealthTracker()
    probe = EventProbe([XidEventsFailed("nvmlEventSetWait: Unknown Error")], [XidRegistration(registered=tuple(UUIDS))])
    probe.lost = {2}
    thread = start(probe, tracker)
    try:
        wait_until(lambda: probe.register_calls >= 2)  # registered again after the backoff
        assert sorted(set(probe.health_reads)) == [0, 1, 2]  # every GPU was re-probed
        assert [state_of(tracker, uuid) for uuid in UUIDS] == ["healthy", "healthy", "failed"]
    finally:
        assert thread.stop()


def test_registration_failure_reprobes_then_retries_until_events_flow() -> None:
    tracker = HealthTracker()
    registrations: list[XidRegistration | Exception] = [
        XidEventsFailed("cannot create the NVML event set"),
        XidRegistration(registered=tuple(UUIDS)),
    ]
    probe = EventProbe([XidEvent(UUIDS[0], 79)], registrations)
    thread = start(probe, tracker)
    try:
        wait_until(lambda: state_of(tracker, UUIDS[0]) == "failed")
        assert probe.register_calls == 2 and probe.health_reads
    finally:
        assert thread.stop()


def test_gpu_without_event_support_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="modelforge.agent")
    tracker = HealthTracker()
    registration = XidRegistration(registered=tuple(UUIDS[:2]), unsupported=(UUIDS[2],))
    failures: list[XidEvent | Exception] = [XidEventsFailed("wait failed"), XidEventsFailed("wait failed")]
    probe = EventProbe(failures, [registration])
    thread = start(probe, tracker)
    try:
        wait_until(lambda: probe.register_calls >= 3)
    finally:
        assert thread.stop()
    noted = [record for record in caplog.records if getattr(record, "event", None) == "xid_events_unsupported"]
    assert len(noted) == 1
    assert state_of(tracker, UUIDS[2]) == "healthy"  # no events is not unhealthy


def test_gpus_lost_at_registration_are_marked_failed_by_uuid_or_index() -> None:
    tracker = HealthTracker()
    registration = XidRegistration(registered=(UUIDS[0],), lost=(UUIDS[1],), lost_indexes=(2,))
    thread = start(EventProbe([], [registration]), tracker)
    try:
        wait_until(lambda: state_of(tracker, UUIDS[2]) == "failed")
        assert [state_of(tracker, uuid) for uuid in UUIDS] == ["healthy", "failed", "failed"]
    finally:
        assert thread.stop()


def test_stop_joins_within_one_wait_and_a_margin() -> None:
    thread = start(EventProbe([], [XidRegistration(registered=tuple(UUIDS))]), HealthTracker(), wait_ms=200)
    wait_until(lambda: thread.alive)
    started = time.monotonic()
    assert thread.stop()
    assert time.monotonic() - started < 2.0 and not thread.alive


def test_stop_before_start_returns_true() -> None:
    thread = XidEventThread(EventProbe([], [XidRegistration()]), HealthTracker(), lambda: GPUS, lambda: T0)
    assert thread.stop()


def test_xid_appended_to_a_simulation_scenario_reaches_the_tracker(tmp_path: Path) -> None:
    path = tmp_path / "scenario.json"
    gpus = [
        {
            "uuid": uuid,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 85520809984,
            "telemetry": {
                "utilization_percent": 0,
                "memory_used_bytes": 0,
                "temperature_celsius": 30,
                "power_watts": 70,
            },
        }
        for uuid in UUIDS
    ]
    document = {"driver_version": "570.124.06", "cuda_version": "12.8", "gpus": gpus, "xid_events": []}
    path.write_text(json.dumps(document))
    probe = ScriptedProbe(path)
    probe.init()
    tracker = HealthTracker()
    thread = start(probe, tracker)
    try:
        document["xid_events"] = [{"uuid": UUIDS[2], "xid": 48}]
        path.write_text(json.dumps(document))
        wait_until(lambda: state_of(tracker, UUIDS[2]) == "unschedulable")
    finally:
        assert thread.stop()
