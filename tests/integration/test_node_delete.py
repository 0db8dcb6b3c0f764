"""DELETE /api/v1/admin/nodes/{node_id} through the Chalice app on the emulator: refusals with JSON
codes, everything of the node gone, its lease requeued and fenced, its credential refused."""

from __future__ import annotations

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.work_items import claim_until

UNKNOWN = "node_" + "0" * 32


def _twins(cp: ControlPlane) -> tuple[AgentIdentity, AgentIdentity]:
    """Two nodes reporting one GPU UUID (flagged duplicates), serving the echo capability."""
    shared = {**gpu_inventory(1), "capabilities": ["cpu", "diagnostic.echo"]}
    twins = (AgentIdentity(), AgentIdentity())
    for twin in twins:
        enrolled = cp.enroll(cp.mint()["token"], twin, accelerator_mode="nvidia", inventory=shared)
        assert enrolled.status_code == 201, enrolled.text
        assert cp.heartbeat(twin, gpus=1).status_code == 200
    return twins


def test_delete_refuses_unknown_and_live_nodes_with_json_codes(cp: ControlPlane) -> None:
    missing = cp.admin("DELETE", f"/api/v1/admin/nodes/{UNKNOWN}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "node_not_found"
    live = cp.enrolled_node()
    assert cp.heartbeat(live).status_code == 200
    refused = cp.admin("DELETE", f"/api/v1/admin/nodes/{live.node_id}")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "node_not_removable" and "online" in refused.json()["error"]["message"]
    pending = cp.enrolled_node()
    assert cp.admin("DELETE", f"/api/v1/admin/nodes/{pending.node_id}").json()["error"]["code"] == "node_not_removable"
    unauthenticated = cp.request("DELETE", f"/api/v1/admin/nodes/{live.node_id}")
    assert unauthenticated.status_code == 401
    assert cp.node(str(live.node_id))["status"] == "online"


def test_a_revoked_node_goes_with_everything_and_its_lease_is_requeued_and_fenced(cp: ControlPlane) -> None:
    ours, twin = _twins(cp)
    assert cp.node(str(twin.node_id))["duplicate_suspected"] == [ours.node_id]
    item = cp.submit_work("diagnostic.echo", {"n": "delete"}).json()
    claimed = claim_until(cp, ours, item["work_id"])
    enrollment_id = cp.node(str(ours.node_id))["enrollment_id"]
    assert cp.admin("POST", f"/api/v1/admin/nodes/{ours.node_id}/revoke-credential").status_code == 200

    deleted = cp.admin("DELETE", f"/api/v1/admin/nodes/{ours.node_id}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {
        "node_id": ours.node_id, "reason": "credential_revoked", "leases_released": 1, "deleted": True
    }  # fmt: skip
    assert cp.admin("GET", f"/api/v1/admin/nodes/{ours.node_id}").status_code == 404
    assert cp.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").status_code == 404
    assert cp.node(str(twin.node_id))["duplicate_suspected"] == []  # its flag went with it
    assert all(node["node_id"] != ours.node_id for node in cp.all_nodes())

    requeued = cp.work(item["work_id"])
    assert requeued["status"] == "queued" and requeued["epoch"] == claimed["epoch"]
    late = cp.lease_call(ours, item["work_id"], "complete", {"epoch": claimed["epoch"], "sha256": "0" * 64, "size": 2})
    # fenced by the epoch: the item moved on (and the node is unknown besides)
    assert late.status_code == 409 and late.json()["error"]["code"] == "lease_lost", late.text
    beat = cp.heartbeat(ours, gpus=1)
    assert beat.status_code == 401 and beat.json()["error"]["code"] == "credential_invalid"
    # the requeued item is the twin's to claim now
    assert claim_until(cp, twin, item["work_id"])["epoch"] == claimed["epoch"] + 1
