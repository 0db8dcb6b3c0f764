"""The happy path through the API, over HTTP, against the in-process local stack."""

from __future__ import annotations

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory


def test_enroll_heartbeat_and_read_node_shows_it_online_with_inventory(cp: ControlPlane) -> None:
    minted = cp.mint(display_name="Rack 4 GPU", expires_in_seconds=300)
    assert minted["status"] == "pending" and minted["production_eligible"] is False
    identity = AgentIdentity()
    inventory = gpu_inventory(2)
    enrolled = cp.enroll(minted["token"], identity, accelerator_mode="nvidia", inventory=inventory)
    assert enrolled.status_code == 201, enrolled.text
    assert cp.node(identity.node_id)["status"] == "pending"

    beat = cp.heartbeat(identity, gpus=2)
    assert beat.status_code == 200, beat.text
    assert beat.json() == {
        "node_id": identity.node_id,
        "status": "online",
        "heartbeat_interval_seconds": 15,
        "work_waiting": False,
        # the local stack serves the push channel
        "features": ["node_fault", "slots", "gpu_health", "agent_instance", "push_channel"],
    }
    node = cp.node(identity.node_id)
    assert node["status"] == "online"
    assert node["display_name"] == "Rack 4 GPU"
    assert [gpu["uuid"] for gpu in node["inventory"]["gpus"]] == [gpu["uuid"] for gpu in inventory["gpus"]]
    assert len(node["telemetry"]["gpus"]) == 2
    assert node["credential"]["state"] == "active"

    enrollment = cp.admin("GET", f"/api/v1/admin/node-enrollments/{minted['enrollment_id']}").json()
    assert enrollment["status"] == "consumed" and enrollment["node_id"] == identity.node_id
    assert "token" not in enrollment
