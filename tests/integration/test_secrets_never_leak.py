"""No admin token, enrollment token, node credential or idempotency key in any log line (at
DEBUG level), answer body or header, stored item of any table, state-log object, data-dir file or
CLI output, over a full run of a real `local up` process with a real CPU agent."""

from __future__ import annotations

import json
from pathlib import Path

from modelforge_local_stack import provision

from tests.conftest import ADMIN_TOKEN
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import cli_command, run_to_exit, start_local_up
from tests.support.snapshots import TABLE_VARS, bucket_objects, scan_table


def _secret_parts(secret: str) -> list[str]:
    """The secret and its random part alone (a leak of either is a leak)."""
    return [secret, secret.rsplit(".", 1)[-1]]


def _files_under(folder: Path) -> list[str]:
    return [path.read_text(errors="replace") for path in sorted(folder.rglob("*")) if path.is_file()]


def test_a_full_run_never_reveals_a_secret(tmp_path: Path) -> None:
    data_dir, agent_state = tmp_path / "data", tmp_path / "agent-state"
    # JSON: every field of every line is searched (the text format local up's agent uses by default says less)
    debug = {
        "MODELFORGE_LOG_LEVEL": "DEBUG",
        "MODELFORGE_AGENT_LOG_LEVEL": "DEBUG",
        "MODELFORGE_AGENT_LOG_FORMAT": "json",
    }
    bodies: list[str] = []
    secrets: list[str] = [ADMIN_TOKEN]
    with start_local_up(
        tmp_path / "local-up.log",
        "--data-dir", str(data_dir), "--with-cpu-agent", str(agent_state),
        env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN, "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "0.2", **debug},
    ) as running:  # fmt: skip
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)

        def record(response):  # type: ignore[no-untyped-def]
            bodies.append(response.text)
            bodies.append(json.dumps(dict(response.headers)))
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

        # the CPU agent's own secrets, read from its identity file once it has enrolled and heartbeats
        identity_file = agent_state / "identity.json"
        wait_until(
            lambda: identity_file.exists() and '"node_id": "node_' in identity_file.read_text(),
            30,
            "the CPU agent's identity file to name its node",
        )
        own = json.loads(identity_file.read_text())
        secrets += [own["credential"], own["idempotency_key"]]
        cli = run_to_exit(
            cli_command("nodes", "readiness", own["node_id"], "--api-url", running.api_url),
            {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN},
        )
        bodies += [cli.stdout, cli.stderr]

        stored = []
        names = provision.resource_names("modelforge")
        for variable in TABLE_VARS:  # every table, gpu_claims and control included
            stored.append(json.dumps(scan_table(running.emulator_url, names[variable])))
        log_objects = bucket_objects(running.emulator_url, names["MODELFORGE_STATE_LOG_BUCKET"])
        assert log_objects, "the state log should hold events by now"
        stored += [body.decode() for body in log_objects.values()]
    stored += _files_under(data_dir)  # the snapshot (and object bodies) kept across restarts
    assert stored[-1], "the data dir should hold the emulator's snapshot"
    output = running.output()
    assert "http_request" in output and '"level": "debug"' in output  # the DEBUG log was captured
    assert "heartbeat_sent" in output  # including the agent's own DEBUG lines
    for secret in secrets:
        for part in _secret_parts(secret):
            assert part not in output, "a secret appears in the process output"
            assert not any(part in body for body in bodies), "a secret appears in an answer body"
            assert not any(part in item for item in stored), "a secret appears in stored state"
