"""The scheduled sweep: guarded transitions, each logged once; reads only late nodes; holds
everything on a mass outage and says so."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import pytest
from chalicelib import liveness, node_store, nodes, runtime, sweep
from chalicelib.auth import NodeCaller
from modelforge_protocol.credentials import sha256_hex

from tests.support.api import AgentIdentity, ControlPlane
from tests.support.snapshots import bucket_objects, scan_table


def _settings(**changes):  # type: ignore[no-untyped-def]
    return dataclasses.replace(runtime.get().settings, **changes)


def _liveness_events(stack, node_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    stack.drain_state_log()
    bodies = bucket_objects(stack.aws_endpoint_url, stack.names["MODELFORGE_STATE_LOG_BUCKET"]).values()
    events = [json.loads(body) for body in bodies]
    return [e for e in events if e["type"] == "node.liveness_changed" and e["subject"]["node_id"] == node_id]


def _beat_at(identity: AgentIdentity, cp: ControlPlane, when: float) -> None:
    """A heartbeat through the real service at a chosen server time."""
    caller = NodeCaller(node_id=identity.node_id, credential_sha256=sha256_hex(identity.credential))  # type: ignore[arg-type]
    nodes.heartbeat(runtime.get().settings, caller, cp.heartbeat_body(), when)


def test_sweep_marks_silent_nodes_stale_then_offline_and_a_heartbeat_brings_them_back(stack, cp: ControlPlane) -> None:
    settings = _settings(mass_stale_fraction=1.0)  # this test is about single transitions
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    now = time.time()
    sweep.run(settings, now + settings.stale_after_seconds + 1)
    sweep.run(settings, now + settings.stale_after_seconds + 2)  # nothing more to do for this node
    sweep.run(settings, now + settings.offline_after_seconds + 1)
    sweep.run(settings, now + settings.offline_after_seconds + 2)  # offline nodes leave the index
    beat = cp.heartbeat(identity)
    assert beat.status_code == 200 and beat.json()["status"] == "online"
    transitions = [(e["subject"]["from"], e["subject"]["to"], e["subject"]["cause"]) for e in _liveness_events(stack, identity.node_id)]
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

    def late_then_heartbeat(state, cutoff, shards):  # type: ignore[no-untyped-def]
        if state != liveness.ONLINE:
            return []
        _beat_at(identity, cp, later - 1)  # arrives after the sweep read the index
        return [identity.node_id]

    monkeypatch.setattr(sweep.node_store, "late_nodes", late_then_heartbeat)
    report = sweep.run(settings, later)
    assert report.stale_candidates == 1 and report.skipped == 1 and report.transitioned == 0
    assert node_store.get(identity.node_id).liveness == "online"  # type: ignore[union-attr]


def test_sweep_reads_only_late_nodes_not_the_whole_fleet(stack, cp: ControlPlane) -> None:
    settings = _settings(mass_stale_fraction=1.0)
    fleet = [cp.enrolled_node() for _ in range(6)]
    for identity in fleet:
        assert cp.heartbeat(identity).status_code == 200
    sweep.run(settings, time.time())  # settle whatever earlier tests left behind
    later = time.time() + settings.stale_after_seconds + 1
    for identity in fleet[2:]:
        _beat_at(identity, cp, later - 1)  # four fresh nodes, two silent ones
    nodes_table = scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_NODES_TABLE"])
    late = {
        item["node_id"]["S"]
        for item in nodes_table
        if item.get("liveness", {}).get("S") in ("online", "stale") and float(item["last_heartbeat_at"]["N"]) <= later - settings.stale_after_seconds
    }
    online_total = sum(1 for item in nodes_table if item.get("liveness", {}).get("S") == "online")
    report = sweep.run(settings, later)
    assert {fleet[0].node_id, fleet[1].node_id} <= late
    assert not {identity.node_id for identity in fleet[2:]} & late
    assert report.stale_candidates == len([n for n in late if n])  # the index found exactly the late ones
    assert report.items_read <= report.stale_candidates + report.offline_candidates + (online_total if report.stale_candidates >= 10 else 0)
    assert report.items_read < len(nodes_table)


def test_mass_stale_holds_transitions_says_so_in_reads_and_releases(stack, cp: ControlPlane, caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings(mass_stale_fraction=0.5)
    fleet = [cp.enrolled_node() for _ in range(12)]
    for identity in fleet:
        assert cp.heartbeat(identity).status_code == 200
    outage = time.time() + settings.stale_after_seconds + 5  # everyone silent: the control plane's fault
    with caplog.at_level(logging.WARNING, logger="modelforge.sweep"):
        first = sweep.run(settings, outage)
        second = sweep.run(settings, outage + 1)
    assert first.held and second.held and first.transitioned == 0
    assert [r.getMessage() for r in caplog.records].count("mass stale held: liveness transitions paused") == 1
    node = cp.node(fleet[0].node_id)
    assert node["liveness_hold"]["reason"] == "mass_stale_held"
    assert node_store.get(fleet[0].node_id).liveness == "online"  # type: ignore[union-attr]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modelforge.sweep"):
        released = sweep.run(settings, time.time())
    assert not released.held
    assert "mass stale released" in [r.getMessage() for r in caplog.records]
    assert cp.node(fleet[0].node_id)["liveness_hold"] is None


def test_sweep_does_not_hold_when_fewer_than_ten_nodes_go_stale(stack, cp: ControlPlane) -> None:
    settings = _settings(mass_stale_fraction=0.01)
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    sweep.run(settings, time.time())
    report = sweep.run(settings, time.time())
    assert report.stale_candidates < 10 and not report.held


def test_the_local_scheduler_event_runs_the_deployed_sweep_handler(stack) -> None:  # type: ignore[no-untyped-def]
    from modelforge_cli.scheduler import scheduled_event

    report = stack.app_module.liveness_sweep(scheduled_event(), None)
    assert {"items_read", "transitioned", "skipped", "held"} <= set(report)


def test_online_now_condition_refuses_work_for_a_node_that_is_not_online(stack, cp: ControlPlane) -> None:
    """The helper every future work claim must use: checked inside the write's own condition."""
    from chalicelib.models import NodeModel
    from pynamodb.exceptions import UpdateError

    settings = runtime.get().settings
    identity = cp.enrolled_node()
    pending = NodeModel(identity.node_id)
    with pytest.raises(UpdateError):  # never heartbeated: pending, not online
        pending.update(actions=[NodeModel.pending_work.set(1)], condition=node_store.online_now(time.time(), settings.stale_after_seconds))
    assert cp.heartbeat(identity).status_code == 200
    online = NodeModel(identity.node_id)
    online.update(actions=[NodeModel.pending_work.set(0)], condition=node_store.online_now(time.time(), settings.stale_after_seconds))
    silent_for = time.time() + settings.stale_after_seconds  # exactly at the threshold: stale
    with pytest.raises(UpdateError):
        online.update(actions=[NodeModel.pending_work.set(1)], condition=node_store.online_now(silent_for, settings.stale_after_seconds))


def test_online_counter_follows_transitions_so_the_guard_reads_one_item(stack, cp: ControlPlane) -> None:
    from chalicelib import control_store

    settings = _settings(mass_stale_fraction=1.0)
    sweep.run(settings, time.time())
    before = control_store.online_nodes() or 0
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200  # pending -> online
    assert control_store.online_nodes() == before + 1
    assert cp.heartbeat(identity).status_code == 200  # steady state: no change
    assert control_store.online_nodes() == before + 1
    late = time.time() + settings.stale_after_seconds + 1
    for other in [cp.enrolled_node() for _ in range(3)]:
        _beat_at(other, cp, late - 1)  # these stay online at `late`
    counted = control_store.online_nodes()
    report = sweep.run(settings, late)
    assert report.transitioned >= 1
    assert control_store.online_nodes() == counted - report.stale_candidates + report.skipped
