"""Two agents on one identity, over real HTTP against the in-process control plane: the real agent
code, twice, on one state volume (a cloned disk). Heartbeats from both in turn flag the node in
readiness and the node view; the same identity restarted (one agent after the other) does not."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from modelforge_node_agent.agent import Agent

from tests.agent.fake_control_plane import RecordingStop, in_process_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until


class BeatsUntil:
    """A stop signal on real time: each wait sleeps a little, until ``event`` is set."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(min(seconds, 0.05))

    def is_set(self) -> bool:
        return self.event.is_set()


def _env(cp: ControlPlane, token: str, state: Path) -> dict[str, str]:
    return {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": cp.base_url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": token,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state),
        "MODELFORGE_AGENT_HOSTNAME": "cloned",
        "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "0.1",
    }


def _enrolled(cp: ControlPlane, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    minted = cp.mint(display_name="cloned")
    state = tmp_path / "state"
    agent, _ = in_process_agent(_env(cp, minted["token"], state), stop=RecordingStop(limit=1), jitter=0.0)
    agent.run()
    return minted, state


def _node_id(cp: ControlPlane, enrollment_id: str) -> str:
    (node,) = [node for node in cp.all_nodes() if node["enrollment_id"] == enrollment_id]
    return str(node["node_id"])


def _identity_check(cp: ControlPlane, node_id: str) -> dict[str, Any]:
    response = cp.admin("GET", f"/api/v1/admin/nodes/{node_id}/readiness")
    assert response.status_code == 200
    return next(check for check in response.json()["checks"] if check["name"] == "identity_unique")


def _running(agent: Agent) -> threading.Thread:
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return thread


def _agent(cp: ControlPlane, token: str, state: Path, stop: BeatsUntil) -> Agent:
    agent, _ = in_process_agent(_env(cp, token, state), stop=stop, clock=time.monotonic, jitter=0.0)
    return agent


def test_two_agents_on_one_identity_are_flagged_in_readiness_and_the_node_view(
    cp: ControlPlane, tmp_path: Path
) -> None:
    minted, state = _enrolled(cp, tmp_path)
    clone = tmp_path / "clone"
    shutil.copytree(state, clone)  # the cloned disk: the same identity file
    node_id = _node_id(cp, minted["enrollment_id"])
    stop = BeatsUntil()
    first, second = _agent(cp, minted["token"], state, stop), _agent(cp, minted["token"], clone, stop)
    assert first.instance_id != second.instance_id
    threads = [_running(first), _running(second)]
    try:
        wait_until(lambda: cp.node(node_id)["duplicate_agent_instances_at"], 20, "the duplicate-instance flag")
        check = _identity_check(cp, node_id)
        assert check["ok"] is False and "two agent processes" in check["detail"]
    finally:
        stop.event.set()
        for thread in threads:
            thread.join(timeout=10)


def test_the_same_identity_restarted_is_not_two_agents(cp: ControlPlane, tmp_path: Path) -> None:
    minted, state = _enrolled(cp, tmp_path)
    node_id = _node_id(cp, minted["enrollment_id"])
    for _ in range(2):  # one agent, stopped, then the next: each heartbeats several times
        stop = BeatsUntil()
        agent = _agent(cp, minted["token"], state, stop)
        thread = _running(agent)
        wait_until(lambda agent=agent: agent.heartbeats_sent >= 4, 20, "four heartbeats")
        stop.event.set()
        thread.join(timeout=10)
    assert cp.node(node_id)["duplicate_agent_instances_at"] is None
    assert _identity_check(cp, node_id)["ok"] is True
