"""Overlapping sweeps and a sweep racing a heartbeat, on the fleet-wide items (the mass-outage hold
and the online-node counter): real threads, forced to read before either writes, several rounds.
The first write wins; the loser writes nothing, logs nothing, and overwrites nothing."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from chalicelib import instance
from chalicelib.domain import liveness
from chalicelib.domain.records import MASS_STALE_HOLD, ONLINE_NODES, ControlItem
from chalicelib.services import sweep
from chalicelib.stores.item_records import item_of
from chalicelib.stores.models import ControlModel

from tests.support.api import ControlPlane
from tests.support.snapshots import scan_table
from tests.support.stores import online_nodes, revision_of, stores

ROUNDS = 4
WRITERS = 3
HOLD_EVENTS = ("sweep.mass_stale_held", "sweep.mass_stale_released")
REPAIR_EVENT = "sweep.online_counter_repaired"


def _control_events(stack, types: tuple[str, ...]) -> dict[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    items = scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_OUTBOX_TABLE"])
    return {
        item["event_id"]["S"]: json.loads(item["payload"]["S"]) for item in items if item["event_type"]["S"] in types
    }


def _hold_active() -> bool:
    item = stores().control.get(MASS_STALE_HOLD)
    return bool(item and item.active)


def _in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = work(index)
        except BaseException as error:  # noqa: B036 - reported below, with the round
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    return results


def _sweeps_at_once(settings: Any, now: float) -> list[sweep.SweepReport]:
    return _in_threads(WRITERS, lambda index: sweep.run(stores(), settings, now + index / 10))


def _read_then_wait(monkeypatch, name: str, barrier: threading.Barrier) -> None:  # type: ignore[no-untyped-def]
    """Each thread's first read of ``name`` waits until every thread has read it."""
    fleet = stores().control
    original = fleet.get
    first = threading.local()

    def get(wanted: str) -> ControlItem | None:
        item = original(wanted)
        if wanted == name and not getattr(first, "done", False):
            first.done = True
            barrier.wait(timeout=30)
        return item

    monkeypatch.setattr(fleet, "get", get)


def test_overlapping_sweeps_write_the_mass_stale_hold_once_and_the_losers_change_nothing(stack, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings = dataclasses.replace(instance.get().settings, mass_stale_fraction=0.0)
    fake_late = [f"node_race{index:027x}" for index in range(sweep.MASS_STALE_MIN_NODES)]
    holding = threading.Event()

    def late_nodes(state: str, cutoff: float) -> list[str]:
        # a mass outage (ten nodes late, any fraction is too many) while holding; nobody late after
        return list(fake_late) if state == liveness.ONLINE and holding.is_set() else []

    assert not _hold_active()
    for round_ in range(ROUNDS):
        hold = round_ % 2 == 0  # hold, release, hold, release: the session ends released
        holding.set() if hold else holding.clear()
        before = stores().control.get(MASS_STALE_HOLD)
        known = _control_events(stack, HOLD_EVENTS)
        monkeypatch.setattr(stores().nodes, "late_nodes", late_nodes)
        _read_then_wait(monkeypatch, MASS_STALE_HOLD, threading.Barrier(WRITERS))
        reports = _sweeps_at_once(settings, time.time())
        monkeypatch.undo()

        new = {key: event for key, event in _control_events(stack, HOLD_EVENTS).items() if key not in known}
        assert [event["type"] for event in new.values()] == [HOLD_EVENTS[0] if hold else HOLD_EVENTS[1]], round_
        assert all(report.held == hold for report in reports), (round_, reports)
        # the stored hold is exactly the winner's write, one revision after the one everyone read
        (winner,) = new.values()
        (change,) = winner["changes"]
        after = stores().control.get(MASS_STALE_HOLD)
        assert after is not None and item_of(after, ControlModel).serialize() == change["item"], round_
        assert after.revision == revision_of(before) + 1
        assert _hold_active() == hold
    assert not _hold_active()


def _drift_counter(value: int) -> None:
    """What the repair exists for: a counter that drifted outside the log (e.g. an older deployment)."""
    ControlModel(ONLINE_NODES).update(actions=[ControlModel.count.set(value)])


def _sweep_that_must_repair(monkeypatch, online: int) -> Any:  # type: ignore[no-untyped-def]
    """Settings and an index that make the sweep repair the counter (more nodes late than it
    says are online) and never hold; the late ids name no node, so no transition is written."""
    fake_late = [f"node_repair{index:025x}" for index in range(max(online + 5, sweep.MASS_STALE_MIN_NODES))]
    monkeypatch.setattr(
        stores().nodes,
        "late_nodes",
        lambda state, cutoff: list(fake_late) if state == liveness.ONLINE else [],
    )
    return dataclasses.replace(instance.get().settings, mass_stale_fraction=1000.0)


def _repair_with_a_heartbeat_after_the_count(cp: ControlPlane, newcomer: Any, settings: Any, monkeypatch) -> list[Any]:  # type: ignore[no-untyped-def]
    """A sweep repairs the counter while ``newcomer`` comes online: after the sweep counted the
    index, before it writes the counter."""
    counted, beaten = threading.Event(), threading.Event()
    count_in_state = stores().nodes.count_in_state

    def count_then_let_a_heartbeat_in(state: str) -> int:
        found = count_in_state(state)
        counted.set()
        assert beaten.wait(timeout=30)
        return found

    def heartbeat() -> int:
        assert counted.wait(timeout=30)
        try:
            return cp.heartbeat(newcomer).status_code  # pending -> online: counter +1
        finally:
            beaten.set()

    monkeypatch.setattr(stores().nodes, "count_in_state", count_then_let_a_heartbeat_in)
    return _in_threads(2, lambda index: sweep.run(stores(), settings, time.time()) if index == 0 else heartbeat())


def test_a_counter_repair_racing_a_heartbeat_yields_and_the_heartbeat_is_counted(
    stack, cp: ControlPlane, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    for identity in (cp.enrolled_node(), cp.enrolled_node()):
        assert cp.heartbeat(identity).status_code == 200  # at least two online nodes
    for round_ in range(ROUNDS):
        newcomer = cp.enrolled_node()
        online = stores().nodes.count_in_state(liveness.ONLINE)
        _drift_counter(0)
        known = _control_events(stack, (REPAIR_EVENT,))
        settings = _sweep_that_must_repair(monkeypatch, online)
        statuses = _repair_with_a_heartbeat_after_the_count(cp, newcomer, settings, monkeypatch)
        monkeypatch.undo()

        assert statuses[1] == 200
        # the heartbeat's +1 survived: the repair, computed from an older count, wrote nothing
        assert online_nodes() == 1, round_
        assert not set(_control_events(stack, (REPAIR_EVENT,))) - set(known), round_
        # with nobody racing it, the next repair sets the counter to the index's count, logged
        assert sweep.repair_online_counter(stores(), time.time()) == online + 1
        assert online_nodes() == online + 1
        (repair,) = [event for key, event in _control_events(stack, (REPAIR_EVENT,)).items() if key not in known]
        assert repair["changes"][0]["set"]["count"] == {"N": str(online + 1)}


def test_overlapping_counter_repairs_write_once(stack, cp: ControlPlane, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    for round_ in range(ROUNDS):
        online = stores().nodes.count_in_state(liveness.ONLINE)
        _drift_counter(0)
        before = stores().control.get(ONLINE_NODES)
        known = _control_events(stack, (REPAIR_EVENT,))
        settings = _sweep_that_must_repair(monkeypatch, online)
        _read_then_wait(monkeypatch, ONLINE_NODES, threading.Barrier(WRITERS))
        _sweeps_at_once(settings, time.time())
        monkeypatch.undo()

        new = [event for key, event in _control_events(stack, (REPAIR_EVENT,)).items() if key not in known]
        assert len(new) == 1, round_
        after = stores().control.get(ONLINE_NODES)
        assert after is not None and after.count == online
        assert after.revision == revision_of(before) + 1
