"""Per-GPU health over the wire: an agent's report latches a hard fault, `modelforge nodes clear-gpu`
asks for a re-check, `drain`/`undrain` stop and resume claims (the claim transaction refuses a
drained node), `accept-gpus` forgets a removed GPU; each as a subprocess or HTTP call against
`modelforge local up`."""

from __future__ import annotations

import re
import secrets
from typing import Any

from tests.support.admin_cli import modelforge
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory

BOOT = "0b0b0b0b-0000-4000-8000-00000000a001"


def _gpu_node(cp: ControlPlane, name: str, gpus: int = 2) -> tuple[AgentIdentity, list[str]]:
    identity, serial = AgentIdentity(), secrets.token_hex(4)
    inventory = {**gpu_inventory(gpus), "capabilities": ["cuda", "diagnostic.echo"]}
    inventory["gpus"] = [
        {**gpu, "uuid": f"GPU-{serial}-0000-4000-8000-00000000000{index}"}
        for index, gpu in enumerate(inventory["gpus"])
    ]
    enrolled = cp.enroll(cp.mint(display_name=name)["token"], identity, accelerator_mode="nvidia", inventory=inventory)
    assert enrolled.status_code == 201, enrolled.text
    return identity, [gpu["uuid"] for gpu in inventory["gpus"]]


def _grade(uuid: str, state: str = "healthy", code: str | None = None, action: str = "none") -> dict[str, Any]:
    reasons = [] if code is None else [{"code": code, "action": action, "since": "2026-12-02T10:00:00Z"}]
    return {"uuid": uuid, "state": state, "reasons": reasons}


def _beat(cp: ControlPlane, identity: AgentIdentity, grades: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"boot_id": BOOT}
    if grades is not None:
        extra["gpu_health"] = {"gpus": grades}
    answer = cp.heartbeat(identity, gpus=len(grades or [None, None]), **extra)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert "gpu_health" in body["features"]
    return body


def _health(cp: ControlPlane, identity: AgentIdentity) -> dict[str, dict[str, Any]]:
    return {gpu["uuid"]: gpu for gpu in cp.node(str(identity.node_id))["gpu_health"]}


def test_a_latched_fault_survives_a_restart_and_clear_gpu_rechecks_it(remote: ControlPlane) -> None:
    identity, (faulty, healthy) = _gpu_node(remote, "latch box")
    answer = _beat(remote, identity, [_grade(faulty, "unschedulable", "xid_48", "reset_gpu"), _grade(healthy)])
    assert answer["blocked_gpus"] == [{"uuid": faulty, "reason": "latched"}] and answer["drained"] is False
    # the agent restarts on the same boot and forgets the Xid: the latch holds
    answer = _beat(remote, identity, [_grade(faulty), _grade(healthy)])
    assert answer["blocked_gpus"] == [{"uuid": faulty, "reason": "latched"}]

    shown = modelforge(remote, "nodes", "show", str(identity.node_id))
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith(faulty) and "unschedulable" in line)
    assert re.split(r"\s{2,}", row.strip()) == [faulty, "unschedulable", "no", "latched", "xid_48: reset_gpu"]

    done = modelforge(remote, "nodes", "clear-gpu", str(identity.node_id), faulty)
    assert done.returncode == 0, done.stderr
    assert f"fault of GPU {faulty} cleared" in done.stdout and "re-check pending" in done.stdout
    again = modelforge(remote, "nodes", "clear-gpu", str(identity.node_id), faulty)
    assert again.returncode == 2 and "gpu_fault_not_latched" in again.stderr

    answer = _beat(remote, identity)  # the next heartbeat asks the agent to re-check
    assert answer["recheck_gpus"] == [faulty] and answer["blocked_gpus"] == []
    answer = _beat(remote, identity, [_grade(faulty), _grade(healthy)])  # its fresh check passed
    assert "recheck_gpus" not in answer and answer["blocked_gpus"] == []
    assert _health(remote, identity)[faulty]["schedulable"] is True
    # nothing blocks the node now: its heartbeats carry no GPU part at all
    assert "blocked_gpus" not in _beat(remote, identity)


def test_drain_stops_claims_in_the_transaction_and_undrain_resumes_them(remote: ControlPlane) -> None:
    identity, (first, _second) = _gpu_node(remote, "drain box")
    _beat(remote, identity, [_grade(first), _grade(_second)])
    node_id = str(identity.node_id)
    drained = modelforge(remote, "nodes", "drain", node_id)
    assert drained.returncode == 0, drained.stderr
    assert f"node {node_id} drained" in drained.stdout
    answer = _beat(remote, identity)
    assert answer["drained"] is True and answer["work_waiting"] is False
    submitted = remote.submit_work("diagnostic.echo", {"hello": "drain"})
    assert submitted.status_code == 201, submitted.text
    assert remote.claim(identity).status_code == 204  # a drained node gets nothing
    assert remote.node(node_id)["drained"] is True
    listed = modelforge(remote, "nodes", "list")
    row = next(line for line in listed.stdout.splitlines() if node_id in line)
    assert "online,drained" in row

    assert modelforge(remote, "nodes", "undrain", node_id).returncode == 0
    claimed = remote.claim(identity)
    assert claimed.status_code == 200, claimed.text

    one = modelforge(remote, "nodes", "drain", node_id, "--gpu", first, "--json")
    assert one.returncode == 0, one.stderr
    assert {gpu["uuid"]: gpu["drained"] for gpu in one.json()["gpu_health"]}[first] is True
    assert _beat(remote, identity)["blocked_gpus"] == [{"uuid": first, "reason": "drained"}]
    bad = modelforge(remote, "nodes", "drain", node_id, "--gpu", "gpu0")
    assert bad.returncode == 2 and "--gpu must be a GPU UUID" in bad.stderr


def test_a_removed_gpu_is_missing_until_accept_gpus(remote: ControlPlane) -> None:
    identity, (kept, removed) = _gpu_node(remote, "missing box")
    _beat(remote, identity, [_grade(kept), _grade(removed)])
    smaller = {**gpu_inventory(1), "capabilities": ["cuda", "diagnostic.echo"]}
    smaller["gpus"][0]["uuid"] = kept
    replaced = remote.request(
        "POST",
        "/api/v1/agent/inventory",
        headers=identity.headers(),
        json={"protocol_version": 1, "inventory": smaller},
    )
    assert replaced.status_code == 200, replaced.text
    gone = _health(remote, identity)[removed]
    assert (gone["state"], gone["missing"], gone["reasons"][0]["code"]) == ("failed", True, "missing")
    readiness = modelforge(remote, "nodes", "readiness", str(identity.node_id))
    assert readiness.returncode == 1 and f"accept-gpus {identity.node_id}" in readiness.stdout

    accepted = modelforge(remote, "nodes", "accept-gpus", str(identity.node_id))
    assert accepted.returncode == 0, accepted.stderr
    assert list(_health(remote, identity)) == [kept]


def test_admin_gpu_routes_refuse_unknown_nodes_and_gpus_with_json_errors(remote: ControlPlane) -> None:
    identity, (first, _second) = _gpu_node(remote, "refusal box")
    node_id = str(identity.node_id)
    unknown_gpu = "GPU-ffffffff-0000-4000-8000-000000000000"
    for method_path, body, status, code in (
        (f"/api/v1/admin/nodes/{node_id}/gpus/{unknown_gpu}/clear", {}, 404, "gpu_not_found"),
        (f"/api/v1/admin/nodes/{node_id}/gpus/{first}/clear", {}, 409, "gpu_fault_not_latched"),
        (f"/api/v1/admin/nodes/node_{'0' * 32}/drain", {}, 404, "node_not_found"),
        (f"/api/v1/admin/nodes/{node_id}/drain", {"gpu_uuid": unknown_gpu}, 404, "gpu_not_found"),
        (f"/api/v1/admin/nodes/{node_id}/drain", {"gpu_uuid": "0"}, 400, "invalid_request"),
        (f"/api/v1/admin/nodes/{node_id}/undrain", {"node": True}, 400, "invalid_request"),
        (f"/api/v1/admin/nodes/{node_id}/accept-gpus", {"all": True}, 400, "invalid_request"),
    ):
        answer = remote.admin("POST", method_path, json=body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), method_path
    assert remote.node(node_id)["drained"] is False


def test_claims_stop_at_the_slots_the_node_may_use_and_a_finish_frees_one(remote: ControlPlane) -> None:
    """The claim-time check: the node's busy slots are counted by the transactions that take and
    end leases, never by its heartbeat, and a claim beyond its schedulable slots gets nothing."""
    identity = remote.worker_node(("cpu", "diagnostic.echo"))
    slots = {"total": 2, "busy": 0, "schedulable": 1}  # one of its two slots may take work
    assert remote.heartbeat(identity, slots=slots).status_code == 200
    # two items to claim (the session's stack may hold other tests' queued echo items too)
    for n in range(2):
        assert remote.submit_work("diagnostic.echo", {"n": n}).status_code == 201
    claimed = remote.claim(identity)
    assert claimed.status_code == 200, claimed.text
    held = claimed.json()
    # the heartbeat says nothing is busy: the count is the transactions', not the heartbeat's
    assert remote.heartbeat(identity, slots=slots).status_code == 200
    assert remote.claim(identity).status_code == 204
    failed = remote.lease_call(
        identity, held["work_id"], "fail", {"epoch": held["epoch"], "reason": "x", "retryable": False}
    )
    assert failed.status_code == 200, failed.text
    again = remote.claim(identity)
    assert again.status_code == 200, again.text
    assert again.json()["work_id"] != held["work_id"]
