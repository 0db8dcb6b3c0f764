"""Simulated nodes over HTTP: a `modelforge local up` without --allow-simulated-nodes refuses an
inventory that says ``"simulated": true`` on enroll and on inventory (403 simulated_node_refused,
nothing written, the token still usable); one started with the flag accepts it, and the node view
says ``simulated``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from tests.conftest import ADMIN_TOKEN
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.processes import start_local_up

REFUSAL = {
    "code": "simulated_node_refused",
    "message": "the control plane does not accept simulated nodes",
    "next_step": "set MODELFORGE_ALLOW_SIMULATED_NODES=true on a development control plane, "
    "or run the agent without MODELFORGE_AGENT_NVML_SIMULATION",
}


def _simulated(gpus: int = 4) -> dict[str, Any]:
    return {**gpu_inventory(gpus), "simulated": True}


def _inventory(cp: ControlPlane, identity: AgentIdentity, inventory: dict[str, Any]) -> requests.Response:
    return cp.request(
        "POST",
        "/api/v1/agent/inventory",
        headers=identity.headers(),
        json={"protocol_version": 1, "inventory": inventory},
    )


def _enrollment_status(cp: ControlPlane, enrollment_id: str) -> str:
    response = cp.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}")
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


def test_a_control_plane_without_the_flag_refuses_simulated_nodes_and_writes_nothing(remote: ControlPlane) -> None:
    minted = remote.mint(display_name="Simulated")
    nodes_before = {node["node_id"] for node in remote.all_nodes()}
    identity = AgentIdentity()
    refused = remote.enroll(minted["token"], identity, accelerator_mode="nvidia", inventory=_simulated())
    assert refused.status_code == 403, refused.text
    assert refused.json() == {"error": REFUSAL}
    assert _enrollment_status(remote, minted["enrollment_id"]) == "pending"
    assert {node["node_id"] for node in remote.all_nodes()} == nodes_before

    # the token is still usable: the same host enrolls without its simulation
    enrolled = remote.enroll(minted["token"], identity, accelerator_mode="nvidia", inventory=gpu_inventory(2))
    assert enrolled.status_code == 201, enrolled.text
    node_id = str(identity.node_id)
    before = remote.node(node_id)
    assert before["simulated"] is False

    refused = _inventory(remote, identity, _simulated())
    assert refused.status_code == 403, refused.text
    assert refused.json() == {"error": REFUSAL}
    after = remote.node(node_id)
    assert after["simulated"] is False and after["inventory"] == before["inventory"]


def test_local_up_with_the_flag_accepts_a_simulated_node_and_its_view_says_so(tmp_path: Path) -> None:
    args = ("--allow-simulated-nodes", "--channel-port", "0")
    with start_local_up(tmp_path / "local-up.log", *args, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        assert "simulated nodes accepted (MODELFORGE_ALLOW_SIMULATED_NODES=true)" in running.output()
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)
        identity = AgentIdentity()
        inventory = _simulated()
        enrolled = cp.enroll(
            cp.mint(display_name="Simulated")["token"], identity, accelerator_mode="nvidia", inventory=inventory
        )
        assert enrolled.status_code == 201, enrolled.text
        node = cp.node(str(identity.node_id))
        assert node["simulated"] is True and node["inventory"]["simulated"] is True
        assert [gpu["uuid"] for gpu in node["inventory"]["gpus"]] == [gpu["uuid"] for gpu in inventory["gpus"]]

        replaced = _inventory(cp, identity, _simulated(8))
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["inventory"]["simulated"] is True
        assert len(cp.node(str(identity.node_id))["inventory"]["gpus"]) == 8
