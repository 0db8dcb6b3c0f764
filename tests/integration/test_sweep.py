"""The scheduled sweep: guarded transitions, each logged once; reads only late nodes; holds
everything on a mass outage and says so."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time

import pytest
from chalicelib import instance
from chalicelib.domain import liveness
from chalicelib.domain import requests as typed
from chalicelib.domain.records import MASS_STALE_HOLD
from chalicelib.services import nodes, sweep
from chalicelib.services.auth import NodeCaller
from chalicelib.stores import node_store
from modelforge_protocol.credentials import sha256_hex

from tests.support.api import AgentIdentity, ControlPlane
from tests.support.snapshots import scan_table, state_log_objects
from tests.support.stores import online_nodes, stores


def _settings(**changes):  # type: ignore[no-untyped-def]
    return dataclasses.replace(instance.get().settings, **changes)


def _liveness_events(stack, node_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    stack.drain_state_log()
    bodies = state_log_objects(stack.aws_endpoint_url, stack.names["MODELFORGE_STATE_LOG_BUCKET"]).values()
    events = [json.loads(body) for body in bodies]
    return [e for e in events if e["type"] == "node.liveness_changed" and e["subject"]["node_id"] == node_id]


def _outbox_liveness_events(stack, node_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    """The node's liveness events in the outbox (written in the transition's own transaction)."""
    items = scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_OUTBOX_TABLE"])
    events = [json.loads(item["payload"]["S"]) for item in items if item["event_type"]["S"] == "node.liveness_changed"]
    return [e for e in events if e["subject"]["node_id"] == node_id]


_clocks = itertools.count(1)


def _past_clock() -> float:
    """A sweep clock older than any heartbeat except the ones a test places before it, so that the
    test's own nodes are the only late ones (each call is older than the previous one, so an
    earlier test's nodes are never late on a later test's clock)."""
    return time.time() - 100_000 * next(_clocks)


def _beat_at(identity: AgentIdentity, cp: ControlPlane, when: float) -> None:
    """A heartbeat through the real service at a chosen server time."""
    caller = NodeCaller(node_id=identity.node_id, credential_sha256=sha256_hex(identity.credential))  # type: ignore[arg-type]
    nodes.heartbeat(stores(), instance.get().settings, caller, typed.heartbeat(cp.heartbeat_body()), when)


def test_sweep_marks_silent_nodes_stale_then_offline_and_a_heartbeat_brings_them_back(stack, cp: ControlPlane) -> None:
    settings = _settings(mass_stale_fraction=1.0)  # this test is about single transitions
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    now = time.time()
    sweep.run(stores(), settings, now + settings.stale_after_seconds + 1)
    sweep.run(stores(), settings, now + settings.stale_after_seconds + 2)  # nothing more to do for this node
    sweep.run(stores(), settings, now + settings.offline_after_seconds + 1)
    sweep.run(stores(), settings, now + settings.offline_after_seconds + 2)  # offline nodes leave the index
    beat = cp.heartbeat(identity)
    assert beat.status_code == 200 and beat.json()["status"] == "online"
    transitions = [
        (e["subject"]["from"], e["subject"]["to"], e["subject"]["cause"])
        for e in _liveness_events(stack, identity.node_id)
    ]
    # each transition once (the sweep ran on a clock ahead of real time, so compare as a multiset)
    assert sorted(transitions) == sorted(
        [
            ("pending", "online", "heartbeat"),
            ("online", "stale", "sweep"),
            ("stale", "offline", "sweep"),
            ("offline", "online", "heartbeat"),
        ]
    )


def test_sweep_skips_a_node_whose_heartbeat_arrived_after_it_read(stack, cp: ControlPlane, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Load, decide, apply with a guard: a heartbeat between read and write wins."""
    settings = _settings(mass_stale_fraction=1.0)
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    later = time.time() + settings.stale_after_seconds + 1

    def late_then_heartbeat(state, cutoff):  # type: ignore[no-untyped-def]
        if state != liveness.ONLINE:
            return []
        _beat_at(identity, cp, later - 1)  # arrives after the sweep read the index
        return [identity.node_id]

    monkeypatch.setattr(stores().nodes, "late_nodes", late_then_heartbeat)
    counter = online_nodes()
    report = sweep.run(stores(), settings, later)
    assert report.stale_candidates == 1 and report.skipped == 1 and report.transitioned == 0
    assert stores().nodes.get(identity.node_id).liveness == "online"  # type: ignore[union-attr]
    # the failed guard wrote nothing: no event, and the online counter kept the node
    assert [e["subject"]["to"] for e in _outbox_liveness_events(stack, identity.node_id)] == ["online"]
    assert online_nodes() == counter


def test_sweep_leaves_a_stale_node_online_when_its_heartbeat_lands_between_read_and_write(
    stack, cp: ControlPlane, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """stale -> offline under a concurrent heartbeat: the heartbeat's transition to online stands."""
    settings = _settings(mass_stale_fraction=1.0)
    clock = _past_clock()
    identity = cp.enrolled_node()
    _beat_at(identity, cp, clock - settings.offline_after_seconds - 10)
    went_stale = sweep.run(stores(), settings, clock - settings.offline_after_seconds + settings.stale_after_seconds)
    assert went_stale.transitioned == 1 and stores().nodes.get(identity.node_id).liveness == "stale"  # type: ignore[union-attr]
    late_nodes = stores().nodes.late_nodes

    def late_then_heartbeat(state, cutoff):  # type: ignore[no-untyped-def]
        found = late_nodes(state, cutoff)
        if state == liveness.STALE:
            _beat_at(identity, cp, clock - 1)  # arrives after the sweep read the index
        return found

    monkeypatch.setattr(stores().nodes, "late_nodes", late_then_heartbeat)
    counter = online_nodes()
    report = sweep.run(stores(), settings, clock)
    monkeypatch.undo()
    assert report.offline_candidates == 1 and report.skipped == 1 and report.transitioned == 0
    assert stores().nodes.get(identity.node_id).liveness == "online"  # type: ignore[union-attr]
    # no stale -> offline event; the counter moved by the heartbeat's +1 only
    steps = [(e["subject"]["from"], e["subject"]["to"]) for e in _outbox_liveness_events(stack, identity.node_id)]
    assert sorted(steps) == sorted([("pending", "online"), ("online", "stale"), ("stale", "online")])
    assert online_nodes() == counter + 1  # type: ignore[operator]


def test_sweep_reads_only_late_nodes_not_the_whole_fleet(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    settings = _settings(mass_stale_fraction=1.0)
    clock = _past_clock()
    fleet = [cp.enrolled_node() for _ in range(6)]
    silent, fresh = fleet[:2], fleet[2:]
    for identity in silent:
        _beat_at(identity, cp, clock - settings.stale_after_seconds - 1)
    for identity in fresh:
        _beat_at(identity, cp, clock - 1)
    table_size = len(scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_NODES_TABLE"]))
    report = sweep.run(stores(), settings, clock)
    # the index gave the sweep the two silent nodes and nothing else: not the fresh ones, not the
    # rest of the table (every other node's heartbeat is later than this clock)
    assert dataclasses.astuple(report)[:6] == (2, 2, 0, 2, 0, False)
    assert table_size > len(fleet)
    assert [stores().nodes.get(i.node_id).liveness for i in fleet] == ["stale"] * 2 + ["online"] * 4  # type: ignore[union-attr]


def test_mass_stale_holds_transitions_says_so_in_reads_and_releases(
    stack, cp: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(mass_stale_fraction=0.5)
    fleet = [cp.enrolled_node() for _ in range(12)]
    for identity in fleet:
        assert cp.heartbeat(identity).status_code == 200
    outage = time.time() + settings.stale_after_seconds + 5  # everyone silent: the control plane's fault
    with caplog.at_level(logging.WARNING, logger="modelforge.sweep"):
        first = sweep.run(stores(), settings, outage)
        second = sweep.run(stores(), settings, outage + 1)
    assert first.held and second.held and first.transitioned == 0
    assert [r.getMessage() for r in caplog.records].count("mass stale held: liveness transitions paused") == 1
    node = cp.node(fleet[0].node_id)
    assert node["liveness_hold"]["reason"] == "mass_stale_held"
    assert stores().nodes.get(fleet[0].node_id).liveness == "online"  # type: ignore[union-attr]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modelforge.sweep"):
        released = sweep.run(stores(), settings, time.time())
    assert not released.held
    assert "mass stale released" in [r.getMessage() for r in caplog.records]
    assert cp.node(fleet[0].node_id)["liveness_hold"] is None


def _late_fleet(cp: ControlPlane, size: int, clock: float, stale_after: int) -> list[AgentIdentity]:
    fleet = [cp.enrolled_node() for _ in range(size)]
    for identity in fleet:
        _beat_at(identity, cp, clock - stale_after - 1)
    return fleet


def test_sweep_does_not_hold_when_fewer_than_ten_nodes_go_stale(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    """Nine late nodes are applied even when any fraction is too many; ten are held."""
    settings = _settings(mass_stale_fraction=0.0)  # every late node is "too many" to the fraction
    clock = _past_clock()
    nine = _late_fleet(cp, sweep.MASS_STALE_MIN_NODES - 1, clock, settings.stale_after_seconds)
    report = sweep.run(stores(), settings, clock)
    assert (report.stale_candidates, report.transitioned, report.held) == (9, 9, False)
    assert {stores().nodes.get(i.node_id).liveness for i in nine} == {"stale"}  # type: ignore[union-attr]
    assert not _hold_active()

    clock = _past_clock()
    ten = _late_fleet(cp, sweep.MASS_STALE_MIN_NODES, clock, settings.stale_after_seconds)
    held = sweep.run(stores(), settings, clock)
    assert (held.stale_candidates, held.transitioned, held.held) == (10, 0, True)
    assert {stores().nodes.get(i.node_id).liveness for i in ten} == {"online"}  # type: ignore[union-attr]
    released = sweep.run(stores(), _settings(mass_stale_fraction=1.0), clock)
    assert (released.transitioned, released.held) == (10, False) and not _hold_active()


def _hold_active() -> bool:
    hold = stores().control.get(MASS_STALE_HOLD)
    return bool(hold and hold.active)


def test_the_local_scheduler_event_runs_the_deployed_sweep_handler(stack, cp: ControlPlane, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from modelforge_local_stack.scheduler import scheduled_event

    settings = instance.get().settings
    clock = _past_clock()
    (identity,) = _late_fleet(cp, 1, clock, settings.stale_after_seconds)
    monkeypatch.setattr(stack.app_module, "_now", lambda: clock)  # the handler's clock
    report = stack.app_module.liveness_sweep(scheduled_event(), None)
    # the handler ran the sweep (the late node moved) and answered with its whole report
    assert report == {
        "items_read": 1,
        "stale_candidates": 1,
        "offline_candidates": 0,
        "transitioned": 1,
        "skipped": 0,
        "held": False,
        "leases_expired": 0,  # no lease expires before this (past) clock
        "leases_released": 0,
        "nodes_removed": 0,  # MODELFORGE_NODE_RETENTION_DAYS is unset: never
    }
    assert stores().nodes.get(identity.node_id).liveness == "stale"  # type: ignore[union-attr]


def test_heartbeat_after_condition_refuses_work_for_a_node_that_is_not_online(stack, cp: ControlPlane) -> None:
    """The condition every work claim carries: checked inside the write's own condition."""
    from chalicelib.stores.models import NodeModel
    from pynamodb.exceptions import UpdateError

    settings = instance.get().settings
    identity = cp.enrolled_node()
    unchanged = [NodeModel.hostname.set(stores().nodes.get(identity.node_id).hostname)]  # type: ignore[union-attr]
    pending = NodeModel(identity.node_id)
    with pytest.raises(UpdateError):  # never heartbeated: pending, not online
        pending.update(
            actions=unchanged,
            condition=node_store.heartbeat_after(time.time() - settings.stale_after_seconds),
        )
    assert cp.heartbeat(identity).status_code == 200
    online = NodeModel(identity.node_id)
    online.update(actions=unchanged, condition=node_store.heartbeat_after(time.time() - settings.stale_after_seconds))
    silent_for = time.time() + settings.stale_after_seconds  # exactly at the threshold: stale
    with pytest.raises(UpdateError):
        online.update(
            actions=unchanged, condition=node_store.heartbeat_after(silent_for - settings.stale_after_seconds)
        )


def test_online_counter_follows_transitions_so_the_guard_reads_one_item(stack, cp: ControlPlane) -> None:
    settings = _settings(mass_stale_fraction=1.0)
    sweep.run(stores(), settings, time.time())
    before = online_nodes() or 0
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200  # pending -> online
    assert online_nodes() == before + 1
    assert cp.heartbeat(identity).status_code == 200  # steady state: no change
    assert online_nodes() == before + 1
    late = time.time() + settings.stale_after_seconds + 1
    for other in [cp.enrolled_node() for _ in range(3)]:
        _beat_at(other, cp, late - 1)  # these stay online at `late`
    counted = online_nodes()
    report = sweep.run(stores(), settings, late)
    assert report.transitioned >= 1
    assert online_nodes() == counted - report.stale_candidates + report.skipped
