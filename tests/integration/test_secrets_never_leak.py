"""No admin token, enrollment token, node credential or idempotency key in any log line,
answer body, stored item or state-log object, over a full run of a real process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ADMIN_TOKEN
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.processes import start_local_up
from tests.support.snapshots import bucket_objects, scan_table


def _secret_parts(secret: str) -> list[str]:
    """The secret and its random part alone (a leak of either is a leak)."""
    return [secret, secret.rsplit(".", 1)[-1]]


def test_a_full_run_never_reveals_a_secret(tmp_path: Path) -> None:
    running = start_local_up(tmp_path / "local-up.log", env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN})
    bodies: list[str] = []
    secrets: list[str] = [ADMIN_TOKEN]
    try:
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)

        def record(response):  # type: ignore[no-untyped-def]
            bodies.append(response.text)
            return response

        minted = [cp.mint(display_name=f"secret-test-{index}") for index in range(3)]
        secrets += [entry["token"] for entry in minted]
        agent, intruder = AgentIdentity(), AgentIdentity()
        secrets += [agent.credential, agent.idempotency_key, intruder.credential, intruder.idempotency_key]

        record(cp.enroll(minted[0]["token"], agent))
        record(cp.enroll(minted[0]["token"], agent))  # replay after a "lost" answer
        record(cp.enroll(minted[0]["token"], intruder))  # consumed token, other agent
        record(cp.admin("POST", f"/api/v1/admin/node-enrollments/{minted[1]['enrollment_id']}/revoke"))
        record(cp.enroll(minted[1]["token"], intruder))  # revoked token
        record(cp.enroll(minted[2]["token"][:-1] + "A", intruder))  # wrong secret part
        record(cp.enroll(minted[2]["token"], intruder, protocol_version=7))  # protocol refused
        record(cp.enroll(minted[2]["token"], intruder, hostname="bad host!"))  # schema refused
        record(cp.heartbeat(agent, gpus=2))
        intruder.node_id = agent.node_id
        record(cp.heartbeat(intruder))  # someone else's credential
        record(cp.request("POST", "/api/v1/agent/heartbeat", headers={"Authorization": agent.credential}, json={}))
        record(cp.admin("GET", "/api/v1/admin/nodes"))
        record(cp.admin("GET", "/api/v1/admin/node-enrollments"))
        record(cp.admin("GET", f"/api/v1/admin/nodes/{agent.node_id}"))
        record(cp.admin("POST", f"/api/v1/admin/nodes/{agent.node_id}/revoke-credential"))
        record(cp.heartbeat(agent))  # revoked
        record(cp.request("GET", "/api/v1/admin/nodes", headers={"X-ModelForge-Admin-Token": agent.credential}))

        stored = []
        names = {
            "MODELFORGE_ENROLLMENTS_TABLE": "modelforge-enrollments",
            "MODELFORGE_NODES_TABLE": "modelforge-nodes",
            "MODELFORGE_INVENTORIES_TABLE": "modelforge-inventories",
            "MODELFORGE_OUTBOX_TABLE": "modelforge-outbox",
        }
        for table in names.values():
            stored.append(json.dumps(scan_table(running.emulator_url, table)))
        log_objects = bucket_objects(running.emulator_url, "modelforge-state-log")
        assert log_objects, "the state log should hold events by now"
        stored += [body.decode() for body in log_objects.values()]
    finally:
        running.stop()
    output = running.output()
    assert "http_request" in output  # the log was captured
    for secret in secrets:
        for part in _secret_parts(secret):
            assert part not in output, "a secret appears in the process output"
            assert not any(part in body for body in bodies), "a secret appears in an answer body"
            assert not any(part in item for item in stored), "a secret appears in stored state"
