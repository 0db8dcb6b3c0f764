"""Readiness of the exact node an enrollment produced, with a next step for every failure."""

from __future__ import annotations

import dataclasses
import time

from chalicelib import instance
from chalicelib.api import views
from chalicelib.domain import requests as typed
from chalicelib.services import nodes, readiness
from chalicelib.services.auth import NodeCaller
from modelforge_protocol.credentials import sha256_hex

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.stores import stores


def _checks(answer: dict) -> dict[str, dict]:
    return {check["name"]: check for check in answer["checks"]}


def _readiness(cp: ControlPlane, target: str) -> dict:
    response = cp.admin("GET", f"/api/v1/admin/nodes/{target}/readiness")
    assert response.status_code == 200, response.text
    return response.json()


def test_readiness_of_a_healthy_cpu_node_is_ready_with_every_check_named(cp: ControlPlane) -> None:
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    answer = _readiness(cp, identity.node_id)
    assert answer["ready"] is True
    assert list(_checks(answer)) == [
        "connection",
        "inventory_age",
        "protocol_compatibility",
        "agent_health",
        "telemetry_age",
        "identity_unique",
        "worker",
        "push_channel",
        "gpu_health",
    ]
    assert all(check["ok"] and check["next_step"] is None for check in answer["checks"])
    # the test's node opens no channel: in fallback, and ready all the same
    assert _checks(answer)["push_channel"]["detail"].startswith("fallback: ")
    assert "stale after 60s" in _checks(answer)["connection"]["detail"]


def test_readiness_of_a_node_that_only_connected_is_not_ready(cp: ControlPlane) -> None:
    identity = cp.enrolled_node()  # enrolled, no heartbeat yet
    answer = _readiness(cp, identity.node_id)
    assert answer["ready"] is False
    failed = {name for name, check in _checks(answer).items() if not check["ok"]}
    assert {"connection", "agent_health", "telemetry_age"} <= failed
    assert all(check["next_step"] for check in answer["checks"] if not check["ok"])


def test_readiness_of_a_pending_enrollment_says_the_node_has_not_appeared(cp: ControlPlane) -> None:
    minted = cp.mint()
    answer = _readiness(cp, minted["enrollment_id"])
    assert answer["ready"] is False and answer["node_id"] is None
    assert "no node has enrolled" in answer["checks"][0]["detail"]


def test_readiness_by_enrollment_id_follows_to_the_node_it_produced(cp: ControlPlane) -> None:
    minted = cp.mint()
    identity = AgentIdentity()
    assert cp.enroll(minted["token"], identity).status_code == 201
    assert _readiness(cp, minted["enrollment_id"])["node_id"] == identity.node_id


def test_readiness_of_an_unknown_node_is_404(cp: ControlPlane) -> None:
    response = cp.admin("GET", "/api/v1/admin/nodes/node_" + "0" * 32 + "/readiness")
    assert response.status_code == 404 and response.json()["error"]["code"] == "node_not_found"


def test_readiness_nvidia_node_without_gpus_or_with_unhealthy_agent_is_not_ready(cp: ControlPlane) -> None:
    gpu_node = AgentIdentity()
    assert (
        cp.enroll(cp.mint()["token"], gpu_node, accelerator_mode="nvidia", inventory=gpu_inventory(2)).status_code
        == 201
    )
    assert cp.heartbeat(gpu_node, gpus=1, health={"status": "degraded", "detail": "fan"}).status_code == 200
    checks = _checks(_readiness(cp, gpu_node.node_id))
    assert not checks["agent_health"]["ok"] and "degraded" in checks["agent_health"]["detail"]
    assert not checks["telemetry_age"]["ok"] and "1 of 2" in checks["telemetry_age"]["detail"]
    assert checks["inventory_age"]["ok"]
    # an nvidia node that reports no GPU at all is not ready either
    gpu_less = AgentIdentity()
    empty = {**gpu_inventory(0), "capabilities": []}
    assert cp.enroll(cp.mint()["token"], gpu_less, accelerator_mode="nvidia", inventory=empty).status_code == 201
    assert cp.heartbeat(gpu_less, gpus=0).status_code == 200
    answer = _readiness(cp, gpu_less.node_id)
    assert answer["ready"] is False
    assert not _checks(answer)["telemetry_age"]["ok"] and "0 of 0" in _checks(answer)["telemetry_age"]["detail"]


def test_readiness_stale_inventory_names_the_inventory_call_in_its_next_step(cp: ControlPlane) -> None:
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    settings = dataclasses.replace(instance.get().settings, readiness_inventory_max_age_seconds=10)
    later = time.time() + 11
    answer = views.readiness(readiness.check(stores(), settings, identity.node_id, later), later)
    inventory = _checks(answer)["inventory_age"]
    assert not inventory["ok"] and "older than 10s" in inventory["detail"]
    assert "ConnectError on POST /api/v1/agent/inventory" in inventory["next_step"]


def test_duplicate_gpu_uuids_flag_both_nodes_and_fail_identity_unique(stack, cp: ControlPlane) -> None:
    shared = gpu_inventory(2)
    first, second = AgentIdentity(), AgentIdentity()
    assert cp.enroll(cp.mint()["token"], first, accelerator_mode="nvidia", inventory=shared).status_code == 201
    assert cp.heartbeat(first, gpus=2).status_code == 200
    assert cp.enroll(cp.mint()["token"], second, accelerator_mode="nvidia", inventory=shared).status_code == 201
    assert cp.node(first.node_id)["duplicate_suspected"] == [second.node_id]
    assert cp.node(second.node_id)["duplicate_suspected"] == [first.node_id]
    check = _checks(_readiness(cp, second.node_id))["identity_unique"]
    assert not check["ok"] and first.node_id in check["detail"]
    assert "state volume durable" in check["next_step"] and "revoke-credential" in check["next_step"]
    stack.drain_state_log()

    # once the duplicate's identity is revoked, it no longer counts
    assert cp.admin("POST", f"/api/v1/admin/nodes/{first.node_id}/revoke-credential").status_code == 200
    assert _checks(_readiness(cp, second.node_id))["identity_unique"]["ok"]


def test_inventory_without_the_shared_gpu_clears_the_flag(cp: ControlPlane) -> None:
    shared = gpu_inventory(1)
    first, second = AgentIdentity(), AgentIdentity()
    assert cp.enroll(cp.mint()["token"], first, accelerator_mode="nvidia", inventory=shared).status_code == 201
    assert cp.enroll(cp.mint()["token"], second, accelerator_mode="nvidia", inventory=shared).status_code == 201
    assert cp.node(second.node_id)["duplicate_suspected"] == [first.node_id]
    other = {**shared, "gpus": [{**shared["gpus"][0], "uuid": "GPU-ffffffff-0000-1111-2222-333333333333"}]}
    response = cp.request(
        "POST", "/api/v1/agent/inventory", headers=second.headers(), json={"protocol_version": 1, "inventory": other}
    )
    assert response.status_code == 200, response.text
    assert cp.node(second.node_id)["duplicate_suspected"] == []


def test_an_offline_node_is_not_a_duplicate(cp: ControlPlane) -> None:
    shared = gpu_inventory(1)
    old = AgentIdentity()
    assert cp.enroll(cp.mint()["token"], old, accelerator_mode="nvidia", inventory=shared).status_code == 201
    caller = NodeCaller(node_id=old.node_id, credential_sha256=sha256_hex(old.credential))  # type: ignore[arg-type]
    settings = instance.get().settings
    nodes.heartbeat(
        stores(),
        settings,
        caller,
        typed.heartbeat(cp.heartbeat_body(gpus=1)),
        time.time() - settings.offline_after_seconds - 5,
    )
    new = AgentIdentity()
    assert cp.enroll(cp.mint()["token"], new, accelerator_mode="nvidia", inventory=shared).status_code == 201
    assert cp.node(new.node_id)["duplicate_suspected"] == []


def _cli(target: str, api_url: str, admin_token: str):  # type: ignore[no-untyped-def]
    from tests.support.processes import cli_command, run_to_exit

    return run_to_exit(
        cli_command("nodes", "readiness", target, "--api-url", api_url), {"MODELFORGE_ADMIN_TOKEN": admin_token}
    )


def test_readiness_command_prints_a_table_and_exits_0_only_when_ready(cp: ControlPlane) -> None:
    identity = cp.enrolled_node()
    not_ready = _cli(identity.node_id, cp.base_url, cp.admin_token)
    assert not_ready.returncode == 1
    assert "ready       NO" in not_ready.stdout and "next: " in not_ready.stdout
    assert cp.heartbeat(identity).status_code == 200
    ready = _cli(identity.node_id, cp.base_url, cp.admin_token)
    assert ready.returncode == 0, ready.stdout
    for name in (
        "connection",
        "inventory_age",
        "protocol_compatibility",
        "agent_health",
        "telemetry_age",
        "identity_unique",
        "worker",
    ):
        assert name in ready.stdout
    unknown = _cli("node_" + "0" * 32, cp.base_url, cp.admin_token)
    assert unknown.returncode == 2 and "node_not_found" in unknown.stderr


def test_a_quarantined_worker_artifact_fails_the_worker_check_and_the_api_says_why(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    identity = cp.worker_node(("cpu", "diagnostic.echo"))
    worker = {
        "status": "degraded",
        "detail": "1 capability unavailable",
        "unavailable": [{"name": "ocr", "reason": "artifact_quarantined"}],
    }
    beat = cp.heartbeat(identity, health={"status": "degraded", "detail": "runtime worker degraded", "worker": worker})
    assert beat.status_code == 200, beat.text
    check = _checks(_readiness(cp, identity.node_id))["worker"]
    assert check["ok"] is False and "ocr (artifact_quarantined)" in check["detail"]
    assert "MODELFORGE_WORKER_QUARANTINE_ROOT" in check["next_step"]
    assert cp.node(identity.node_id)["health"]["worker"]["unavailable"] == worker["unavailable"]
    healthy = cp.heartbeat(identity, health={"status": "ok", "worker": {"status": "ok"}})
    assert healthy.status_code == 200
    assert _checks(_readiness(cp, identity.node_id))["worker"]["ok"] is True
