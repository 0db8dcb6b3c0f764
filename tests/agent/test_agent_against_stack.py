"""The real agent code over real HTTP against the in-process control plane, stopped after
each pass by a fake stop signal so a hundred restarts take seconds, not minutes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelforge_node_agent.agent import Agent
from modelforge_node_agent.config import load_config
from modelforge_node_agent.control_plane import ENROLL, ControlPlaneClient
from modelforge_node_agent.failures import TransientFailure
from modelforge_node_agent.identity import StateVolume
from modelforge_node_agent.transport import base_url, build_session

from tests.agent.fake_control_plane import RecordingStop, in_process_agent
from tests.support.api import ControlPlane


def _agent(cp: ControlPlane, token: str, state_dir: Path, client: Any = None) -> Agent:
    settings = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": cp.base_url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": token,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state_dir),
        "MODELFORGE_AGENT_HOSTNAME": "restarter",
    }
    agent, _ = in_process_agent(settings, stop=RecordingStop(limit=1), client=client, jitter=0.0)
    return agent


def _nodes_of(cp: ControlPlane, enrollment_id: str) -> list[dict]:
    return [node for node in cp.all_nodes() if node["enrollment_id"] == enrollment_id]


def test_a_hundred_restarts_produce_one_node(cp: ControlPlane, tmp_path: Path) -> None:
    minted = cp.mint(display_name="restarter")
    for _ in range(100):
        _agent(cp, minted["token"], tmp_path / "state").run()
    nodes = _nodes_of(cp, minted["enrollment_id"])
    assert len(nodes) == 1 and nodes[0]["status"] == "online"
    assert nodes[0]["credential"]["state"] == "active"


class LosesFirstEnrollAnswer(ControlPlaneClient):
    """The enroll request reaches the control plane, but its answer is lost on the way back."""

    lost = False

    def post(self, path: str, body: dict[str, Any], identity: Any = None) -> dict[str, Any]:
        answer = super().post(path, body, identity)
        if path == ENROLL and not self.lost:
            self.lost = True
            raise TransientFailure("ReadTimeout", "POST", path)
        return answer


def test_a_lost_enroll_answer_followed_by_a_retry_ends_with_one_node(cp: ControlPlane, tmp_path: Path) -> None:
    minted = cp.mint(display_name="lost answer")
    config = load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": cp.base_url,
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": minted["token"],
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
        }
    )
    client = LosesFirstEnrollAnswer(build_session(config), base_url(config), 10)
    agent = _agent(cp, minted["token"], tmp_path / "state", client)
    agent._stop = RecordingStop(limit=2)  # type: ignore[attr-defined]  # one backoff wait, then one heartbeat wait
    agent.run()
    assert client.lost
    nodes = _nodes_of(cp, minted["enrollment_id"])
    assert len(nodes) == 1 and nodes[0]["status"] == "online"


def test_a_crash_between_persisting_and_enrolling_reuses_the_persisted_credential(
    cp: ControlPlane, tmp_path: Path
) -> None:
    minted = cp.mint(display_name="crash before enroll")
    state = StateVolume(tmp_path / "state")
    state.prepare()
    from modelforge_node_agent.identity import new_identity

    pending = new_identity(cp.base_url)
    state.save(pending)  # what a crashed first start left behind
    _agent(cp, minted["token"], tmp_path / "state").run()
    identity = state.load()
    assert identity is not None and identity.credential == pending.credential and identity.enrolled
