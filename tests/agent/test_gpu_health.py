"""``gpu_health``: pure grading of each GPU by NVIDIA's recommended action, and ``HealthTracker``'s
memory across heartbeats (latched Xids, ``since``, the clock window, vanished GPUs, reports)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import jsonschema
import pytest
from modelforge_node_agent.gpu import (
    READ_FAILED,
    UNSUPPORTED,
    ClockEvents,
    GpuInfo,
    GpuLost,
    HealthFields,
    HealthSignals,
    NotRead,
)
from modelforge_node_agent.gpu_health import (
    APP_XID_HOLD_SECONDS,
    XID_TABLE,
    GpuHealth,
    HealthTracker,
    classify_xid,
    health_report,
    utc_second,
)
from modelforge_protocol.schemas import GPU_HEALTH, GPU_HEALTH_REPORT, MAX_GPU_REASONS

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
A = "GPU-5e1a0000-0000-4000-8000-000000000001"
B = "GPU-5e1a0000-0000-4000-8000-000000000002"
CALM = ClockEvents(False, False, False)


def signals(
    *,
    ecc: int | NotRead = 0,
    pending: bool | NotRead = False,
    failure: bool | NotRead = False,
    action: int | NotRead = 0,
    clocks: ClockEvents | NotRead = CALM,
    nvlink: tuple[bool, ...] | NotRead = UNSUPPORTED,
    mig: bool | NotRead = False,
) -> HealthSignals:
    return HealthSignals(HealthFields(ecc, pending, failure, action), clocks, nvlink, mig)


HEALTHY = signals()


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def grade_one(tracker: HealthTracker, read: HealthSignals | GpuLost, now: datetime = T0) -> GpuHealth:
    (health,) = tracker.grade([A], {A: read}, now)
    return health


def wire_reasons(health: GpuHealth) -> list[tuple[str, str, int | None]]:
    return [
        (reason.code, reason.action, reason.xid if reason.xid is not None else reason.value)
        for reason in health.reasons
    ]


def assert_valid(health: GpuHealth) -> None:
    jsonschema.validate(health.to_wire(), GPU_HEALTH)


# --- Xids ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 69])
def test_application_xid_is_recorded_and_gpu_stays_healthy(xid: int) -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, xid, T0)
    health = grade_one(tracker, HEALTHY)
    assert (health.state, wire_reasons(health), health.schedulable) == ("healthy", [("xid", "restart_app", xid)], True)
    assert_valid(health)


@pytest.mark.parametrize("xid", [48, 64, 74, 95, 109, 119, 120, 140])
def test_reset_xid_makes_gpu_unschedulable_with_reset_gpu(xid: int) -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, xid, T0)
    health = grade_one(tracker, HEALTHY)
    assert (health.state, wire_reasons(health), health.schedulable) == (
        "unschedulable",
        [("xid", "reset_gpu", xid)],
        False,
    )


def test_xid_79_makes_gpu_failed_with_reboot() -> None:
    assert (classify_xid(79).state, classify_xid(79).action) == ("failed", "reboot")


def test_unknown_xid_makes_gpu_degraded_with_action_unknown() -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, 94, T0)
    health = grade_one(tracker, HEALTHY)
    assert (health.state, wire_reasons(health), health.schedulable) == ("degraded", [("xid", "unknown", 94)], True)


def test_xid_table_holds_exactly_the_pinned_xids() -> None:
    assert sorted(XID_TABLE) == [13, 31, 43, 45, 48, 64, 68, 69, 74, 79, 95, 109, 119, 120, 140]


def test_xid_reason_is_latched_with_first_since_until_recheck() -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, 48, at(5))
    tracker.record_xid(A, 48, at(50))  # the same Xid again: same reason, same since
    for second in (60, 120, 3600 * 24):
        health = grade_one(tracker, HEALTHY, at(second))
        assert health.state == "unschedulable"
        assert health.reasons[0].since == "2026-12-02T10:00:05Z"
    repaired = tracker.recheck(A, HEALTHY, at(90_000))
    assert (repaired.state, repaired.reasons) == ("healthy", ())
    assert tracker.schedulable_uuids() == [A]


def test_recheck_keeps_a_still_broken_gpu_faulted() -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, 48, T0)
    grade_one(tracker, signals(pending=True))
    still_broken = tracker.recheck(A, signals(pending=True), at(60))
    assert (still_broken.state, wire_reasons(still_broken)) == (
        "unschedulable",
        [("row_remap_pending", "reset_gpu", None)],
    )
    assert tracker.recheck(A, GpuLost("GPU 0 is lost", 0), at(61)).state == "failed"


def test_application_xid_is_dropped_an_hour_after_its_last_occurrence() -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, 13, T0)
    tracker.record_xid(A, 13, at(600))
    assert grade_one(tracker, HEALTHY, at(600 + APP_XID_HOLD_SECONDS)).reasons[0].since == "2026-12-02T10:00:00Z"
    assert grade_one(tracker, HEALTHY, at(601 + APP_XID_HOLD_SECONDS)).reasons == ()


def test_hard_xid_is_not_dropped_by_time() -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, 79, T0)
    assert grade_one(tracker, HEALTHY, at(10 * APP_XID_HOLD_SECONDS)).state == "failed"


# --- GpuIsLost ------------------------------------------------------------------------------------


def test_gpu_lost_read_makes_gpu_failed_with_reboot_and_stays_until_recheck() -> None:
    tracker = HealthTracker()
    lost = grade_one(tracker, GpuLost("GPU 0 is lost", 0))
    assert (lost.state, wire_reasons(lost)) == ("failed", [("gpu_lost", "reboot", None)])
    assert grade_one(tracker, HEALTHY, at(30)).state == "failed"
    assert tracker.recheck(A, HEALTHY, at(60)).state == "healthy"


def test_mark_lost_from_the_event_thread_fails_only_that_gpu() -> None:
    tracker = HealthTracker()
    tracker.mark_lost(B, T0)
    graded = tracker.grade([A, B], {A: HEALTHY, B: HEALTHY}, at(1))
    assert [(gpu.uuid, gpu.state) for gpu in graded] == [(A, "healthy"), (B, "failed")]
    assert tracker.schedulable_uuids() == [A]


# --- fields ----------------------------------------------------------------------------------------


def test_volatile_uncorrected_ecc_makes_gpu_degraded_with_the_count() -> None:
    health = grade_one(HealthTracker(), signals(ecc=3))
    assert (health.state, wire_reasons(health)) == ("degraded", [("ecc_uncorrected_volatile", "restart_app", 3)])
    assert_valid(health)


def test_remap_pending_makes_gpu_unschedulable_with_reset_gpu() -> None:
    health = grade_one(HealthTracker(), signals(pending=True))
    assert (health.state, wire_reasons(health)) == ("unschedulable", [("row_remap_pending", "reset_gpu", None)])


def test_remap_failure_makes_gpu_failed_with_rma() -> None:
    health = grade_one(HealthTracker(), signals(failure=True))
    assert (health.state, wire_reasons(health)) == ("failed", [("row_remap_failure", "rma", None)])


@pytest.mark.parametrize(
    ("value", "state", "action"),
    [
        (0, "healthy", None),
        (1, "unschedulable", "reset_gpu"),
        (2, "failed", "reboot"),
        (3, "degraded", "drain_p2p"),
        (4, "unschedulable", "drain_and_reset"),
        (7, "degraded", "unknown"),
    ],
)
def test_recovery_action_value_grades_by_nvidia_action(value: int, state: str, action: str | None) -> None:
    health = grade_one(HealthTracker(), signals(action=value))
    assert health.state == state
    expected = [] if action is None else [("recovery_action", action, value)]
    assert wire_reasons(health) == expected
    assert_valid(health)


def test_field_reasons_clear_when_the_field_clears() -> None:
    tracker = HealthTracker()
    assert grade_one(tracker, signals(pending=True)).state == "unschedulable"
    assert grade_one(tracker, HEALTHY, at(30)).state == "healthy"


# --- unsupported and unreadable -------------------------------------------------------------------


def test_every_signal_not_supported_is_unknown_and_still_schedulable() -> None:
    tracker = HealthTracker()
    health = grade_one(tracker, HealthSignals.every(UNSUPPORTED))
    assert (health.state, wire_reasons(health)) == ("unknown", [("health_signals_not_supported", "none", None)])
    assert tracker.schedulable_uuids() == [A]
    assert_valid(health)


def test_partly_supported_gpu_is_graded_on_what_it_has() -> None:
    consumer = HealthSignals(HealthFields(UNSUPPORTED, UNSUPPORTED, UNSUPPORTED, 0), CALM, UNSUPPORTED, UNSUPPORTED)
    assert grade_one(HealthTracker(), consumer).state == "healthy"
    only_ecc = HealthSignals(HealthFields(2, UNSUPPORTED, UNSUPPORTED, UNSUPPORTED), UNSUPPORTED, UNSUPPORTED, False)
    assert grade_one(HealthTracker(), only_ecc).state == "degraded"


def test_unreadable_signal_is_unknown_never_invented() -> None:
    health = grade_one(HealthTracker(), signals(ecc=READ_FAILED, clocks=READ_FAILED))
    assert (health.state, wire_reasons(health)) == ("unknown", [("health_signal_unreadable", "unknown", 2)])
    assert health.schedulable


# --- clocks and NVLink ----------------------------------------------------------------------------


def test_hw_slowdown_degrades_only_in_three_of_the_last_five_readings() -> None:
    tracker = HealthTracker()
    slow = signals(clocks=ClockEvents(True, False, False))
    states = [grade_one(tracker, read, at(i)).state for i, read in enumerate([slow, HEALTHY, slow, HEALTHY, slow])]
    assert states == ["healthy"] * 4 + ["degraded"]
    assert wire_reasons(tracker.health()[0]) == [("hw_slowdown", "none", None)]
    later = [grade_one(tracker, read, at(10 + i)).state for i, read in enumerate([slow, HEALTHY, HEALTHY])]
    assert later == ["degraded", "degraded", "healthy"]  # 3 of 5, 3 of 5, then 2 of 5


def test_hw_or_sw_thermal_counts_as_thermal_slowdown() -> None:
    tracker = HealthTracker()
    reads = [ClockEvents(False, True, False), ClockEvents(False, False, True), ClockEvents(False, True, True)]
    for i, clocks in enumerate(reads):
        health = grade_one(tracker, signals(clocks=clocks), at(i))
    assert (health.state, wire_reasons(health)) == ("degraded", [("thermal_slowdown", "none", None)])
    assert health.reasons[0].since == utc_second(at(2))


def test_nvlink_link_that_was_up_and_is_down_degrades() -> None:
    tracker = HealthTracker()
    assert grade_one(tracker, signals(nvlink=(True, True, False))).state == "healthy"  # link 2 never up
    down = grade_one(tracker, signals(nvlink=(True, False, False)), at(5))
    assert (down.state, wire_reasons(down)) == ("degraded", [("nvlink_down", "unknown", 1)])
    assert grade_one(tracker, signals(nvlink=(True, True, False)), at(6)).state == "healthy"


# --- MIG, vanished GPUs ---------------------------------------------------------------------------


def test_mig_enabled_is_unknown_and_takes_no_slot() -> None:
    tracker = HealthTracker()
    graded = tracker.grade([A, B], {A: signals(mig=True), B: HEALTHY}, T0)
    assert (graded[0].state, wire_reasons(graded[0])) == ("unknown", [("mig_not_supported", "none", None)])
    assert graded[0].schedulable and not graded[0].takes_slot
    assert tracker.schedulable_uuids() == [B]


def test_vanished_uuid_is_failed_missing_with_reboot() -> None:
    tracker = HealthTracker()
    tracker.grade([A, B], {A: HEALTHY, B: HEALTHY}, T0)
    graded = tracker.grade([A], {A: HEALTHY}, at(30))
    assert [(gpu.uuid, gpu.state, wire_reasons(gpu)) for gpu in graded] == [
        (A, "healthy", []),
        (B, "failed", [("missing", "reboot", None)]),
    ]
    assert graded[1].reasons[0].since == utc_second(at(30))
    assert tracker.schedulable_uuids() == [A]


def test_uuid_from_the_last_inventory_that_is_absent_at_start_is_missing() -> None:
    tracker = HealthTracker(known_uuids=[A, B])
    graded = tracker.grade([GpuInfo(0, A, "H100", 80, "570", "12.8")], {A: HEALTHY}, T0)
    assert [gpu.state for gpu in graded] == ["healthy", "failed"]


def test_forget_accepts_a_gpu_set_without_the_vanished_uuid() -> None:
    tracker = HealthTracker(known_uuids=[A, B])
    tracker.forget(B)
    assert [gpu.uuid for gpu in tracker.grade([A], {A: HEALTHY}, T0)] == [A]


# --- reasons, since, reports ------------------------------------------------------------------------


def test_state_is_the_worst_reason_and_most_severe_reasons_come_first() -> None:
    tracker = HealthTracker()
    tracker.record_xid(A, 13, T0)
    health = grade_one(tracker, signals(ecc=1, pending=True, failure=True), at(1))
    assert health.state == "failed"
    assert [reason.code for reason in health.reasons] == [
        "row_remap_failure",
        "row_remap_pending",
        "ecc_uncorrected_volatile",
        "xid",
    ]


def test_at_most_eight_reasons_keeping_the_most_severe() -> None:
    tracker = HealthTracker()
    for xid in (13, 31, 43, 45, 68, 69, 94, 63, 48):
        tracker.record_xid(A, xid, T0)
    health = grade_one(tracker, HEALTHY)
    assert len(health.reasons) == MAX_GPU_REASONS
    assert health.reasons[0].xid == 48 and health.state == "unschedulable"
    assert_valid(health)


def test_since_stays_while_the_reason_persists_and_restarts_when_it_returns() -> None:
    tracker = HealthTracker()
    first = grade_one(tracker, signals(ecc=1), at(0))
    kept = grade_one(tracker, signals(ecc=2), at(30))  # the count changed; the reason did not
    assert first.reasons[0].since == kept.reasons[0].since == "2026-12-02T10:00:00Z"
    assert kept.reasons[0].value == 2
    grade_one(tracker, HEALTHY, at(60))
    assert grade_one(tracker, signals(ecc=2), at(90)).reasons[0].since == "2026-12-02T10:01:30Z"


def test_report_due_ignores_order_and_sees_a_change() -> None:
    tracker = HealthTracker()
    graded = tracker.grade([A, B], {A: HEALTHY, B: HEALTHY}, T0)
    assert tracker.report_due(graded)
    tracker.mark_sent(list(reversed(graded)))
    assert not tracker.report_due(tracker.grade([B, A], {A: HEALTHY, B: HEALTHY}, at(30)))
    assert tracker.report_due(tracker.grade([A, B], {A: HEALTHY, B: signals(pending=True)}, at(60)))


def test_health_report_validates_against_the_wire_schema() -> None:
    tracker = HealthTracker(known_uuids=[B])
    tracker.record_xid(A, 48, T0)
    graded = tracker.grade([A], {A: signals(ecc=2, action=7, mig=True)}, T0)
    report = health_report(graded)
    jsonschema.validate(report, GPU_HEALTH_REPORT)
    assert report["gpus"][0]["reasons"][0] == {
        "code": "xid",
        "action": "reset_gpu",
        "since": "2026-12-02T10:00:00Z",
        "xid": 48,
    }


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        utc_second(datetime(2026, 12, 2, 10, 0, 0))  # naive: the point of the test


def test_events_from_many_threads_while_grading_are_all_kept() -> None:
    tracker = HealthTracker()
    xids = [13, 31, 43, 45, 68, 69, 48, 79]

    def record(xid: int) -> None:
        for _ in range(200):
            tracker.record_xid(A, xid, T0)

    threads = [threading.Thread(target=record, args=(xid,)) for xid in xids]
    for thread in threads:
        thread.start()
    for i in range(50):
        grade_one(tracker, HEALTHY, at(i))
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(reason.xid or 0 for reason in grade_one(tracker, HEALTHY, at(60)).reasons) == sorted(xids)
