"""Liveness with real processes: `modelforge local up` with stale=3 s, offline=6 s and a sweep every
second; a simulated node heartbeats, goes silent, is persisted stale then offline by the sweep
within one sweep interval of each threshold, and comes back online with its next heartbeat."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from tests.conftest import ADMIN_TOKEN
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import start_local_up
from tests.support.snapshots import state_log_objects

STALE, OFFLINE, SWEEP = 3, 6, 1
#: scheduling slack on a loaded 2-core machine, on top of one sweep interval
SLACK = 0.75


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _transitions(emulator_url: str, node_id: str) -> list[dict]:
    events = [json.loads(body) for body in state_log_objects(emulator_url, "modelforge-state-log").values()]
    found = [e for e in events if e["type"] == "node.liveness_changed" and e["subject"]["node_id"] == node_id]
    return sorted(found, key=lambda event: event["occurred_at"])


def test_silent_node_goes_stale_then_offline_within_one_sweep_interval_and_returns(tmp_path: Path) -> None:
    env = {
        "MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN,
        "MODELFORGE_NODE_STALE_AFTER_SECONDS": str(STALE),
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": str(OFFLINE),
        "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "1",
        "MODELFORGE_SWEEP_INTERVAL_SECONDS": str(SWEEP),
    }
    with start_local_up(tmp_path / "local-up.log", env=env) as plane:
        cp = ControlPlane(plane.api_url, ADMIN_TOKEN)
        identity = cp.enrolled_node()
        for _ in range(3):
            assert cp.heartbeat(identity).json()["heartbeat_interval_seconds"] == 1
            time.sleep(0.3)
        last_heartbeat = _epoch(cp.node(identity.node_id)["last_heartbeat_at"])

        def swept_offline():  # type: ignore[no-untyped-def]
            events = _transitions(plane.emulator_url, identity.node_id)
            return events if any(e["subject"]["to"] == "offline" for e in events) else None

        events = wait_until(swept_offline, OFFLINE + 15, "the sweep to log the node offline", interval=0.2)
        by_target = {(e["subject"]["from"], e["subject"]["to"]): e for e in events}
        stale_at = by_target[("online", "stale")]["occurred_at"] - last_heartbeat
        offline_at = by_target[("stale", "offline")]["occurred_at"] - last_heartbeat
        assert STALE <= stale_at <= STALE + SWEEP + SLACK, stale_at
        assert OFFLINE <= offline_at <= OFFLINE + SWEEP + SLACK, offline_at
        assert cp.node(identity.node_id)["status"] == "offline"

        back = cp.heartbeat(identity)
        assert back.status_code == 200 and back.json()["status"] == "online"
        final = wait_until(
            lambda: (t := _transitions(plane.emulator_url, identity.node_id)) and len(t) == 4 and t,
            10,
            "four liveness transitions logged",
            interval=0.2,
        )
        assert [(e["subject"]["from"], e["subject"]["to"], e["subject"]["cause"]) for e in final] == [
            ("pending", "online", "heartbeat"),
            ("online", "stale", "sweep"),
            ("stale", "offline", "sweep"),
            ("offline", "online", "heartbeat"),
        ]
        time.sleep(SWEEP * 2)  # a few more sweeps must not log anything again
        assert len(_transitions(plane.emulator_url, identity.node_id)) == 4
