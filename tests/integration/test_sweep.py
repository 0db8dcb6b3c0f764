"""The scheduled sweep persists liveness transitions with guarded writes and logs each once."""

from __future__ import annotations

import json
import time

from chalicelib import runtime, sweep

from tests.support.api import ControlPlane
from tests.support.snapshots import bucket_objects


def _liveness_events(stack, node_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    stack.drain_state_log()
    events = [json.loads(body) for body in bucket_objects(stack.aws_endpoint_url, stack.names["MODELFORGE_STATE_LOG_BUCKET"]).values()]
    return sorted(
        (event for event in events if event["type"] == "node.liveness_changed" and event["subject"]["node_id"] == node_id),
        key=lambda event: event["event_id"],
    )


def test_sweep_marks_silent_nodes_stale_then_offline_and_a_heartbeat_brings_them_back(stack, cp: ControlPlane) -> None:
    settings = runtime.get().settings
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    now = time.time()

    sweep.run(settings, now + settings.stale_after_seconds + 1)
    sweep.run(settings, now + settings.stale_after_seconds + 2)  # nothing more to do for this node
    sweep.run(settings, now + settings.offline_after_seconds + 1)
    beat = cp.heartbeat(identity)
    assert beat.status_code == 200 and beat.json()["status"] == "online"

    transitions = [(event["subject"]["from"], event["subject"]["to"], event["subject"]["cause"]) for event in _liveness_events(stack, identity.node_id)]
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
    settings = runtime.get().settings
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    real_scan = sweep.node_store.scan_live_nodes

    def scan_then_heartbeat():  # type: ignore[no-untyped-def]
        nodes = [node for node in real_scan() if node.node_id == identity.node_id]
        assert cp.heartbeat(identity).status_code == 200  # moves last_heartbeat_at on
        return iter(nodes)

    monkeypatch.setattr(sweep.node_store, "scan_live_nodes", scan_then_heartbeat)
    report = sweep.run(settings, time.time() + settings.stale_after_seconds + 1)
    assert report.examined == 1 and report.skipped == 1 and report.transitioned == 0
    assert cp.node(identity.node_id)["status"] == "online"


def test_the_local_scheduler_event_runs_the_deployed_sweep_handler(stack) -> None:  # type: ignore[no-untyped-def]
    from modelforge_cli.scheduler import scheduled_event

    report = stack.app_module.liveness_sweep(scheduled_event(), None)
    assert set(report) == {"examined", "transitioned", "skipped"}
