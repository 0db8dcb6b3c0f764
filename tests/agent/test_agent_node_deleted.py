"""An agent whose node an admin deleted (offline meanwhile): its next heartbeat is refused (401
credential_invalid) and it exits 4, as for a revoked credential (NODE_AGENT.md, exit codes)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.agent_process import agent_env, start_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import start_local_up

pytestmark = [pytest.mark.timeout(180)]


def test_an_agent_whose_offline_node_was_deleted_exits_4(tmp_path: Path) -> None:
    env = {
        "MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN,
        "MODELFORGE_NODE_STALE_AFTER_SECONDS": "2",
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "3",
        "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "1",
        "MODELFORGE_SWEEP_INTERVAL_SECONDS": "1",
    }
    with start_local_up(tmp_path / "local-up.log", env=env) as plane:
        cp = ControlPlane(plane.api_url, ADMIN_TOKEN)
        minted = cp.mint(display_name="to be deleted")
        agent = start_agent(tmp_path / "agent.log", agent_env(plane.api_url, minted["token"], tmp_path / "state"))
        try:
            node_id = agent.wait_for(r'"event": "enrolled".*?"node_id": "(node_\w+)"').group(1)
            wait_until(lambda: cp.node(node_id)["status"] == "online", 60, "the node online")
            refused = cp.admin("DELETE", f"/api/v1/admin/nodes/{node_id}")
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "node_not_removable"

            agent.process.send_signal(signal.SIGSTOP)  # silent until the node is offline
            try:
                wait_until(lambda: cp.node(node_id)["status"] == "offline", 30, "the node offline", interval=0.2)
                deleted = cp.admin("DELETE", f"/api/v1/admin/nodes/{node_id}")
                assert deleted.status_code == 200, deleted.text
                assert deleted.json()["reason"] == "offline"
            finally:
                agent.process.send_signal(signal.SIGCONT)
            assert agent.wait_exit(timeout=60) == 4
        finally:
            agent.stop()
    assert "credential_invalid" in agent.output()
