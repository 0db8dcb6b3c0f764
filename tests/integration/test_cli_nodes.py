"""`modelforge nodes list|show|readiness|revoke-credential` as a subprocess against `modelforge local up`."""

from __future__ import annotations

import re

from tests.support.admin_cli import modelforge, modelforge_on_a_terminal
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory

UNKNOWN = "node_" + "0" * 32


def _gpu_node(cp: ControlPlane, name: str, gpus: int = 2) -> AgentIdentity:
    identity = AgentIdentity()
    minted = cp.mint(display_name=name)
    assert (
        cp.enroll(minted["token"], identity, accelerator_mode="nvidia", inventory=gpu_inventory(gpus)).status_code
        == 201
    )
    assert cp.heartbeat(identity, gpus=gpus).status_code == 200
    return identity


def _row(stdout: str, node_id: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if node_id in line)
    return re.split(r"\s{2,}", line.strip())


def test_list_prints_status_heartbeat_age_gpus_and_versions(remote: ControlPlane) -> None:
    online = _gpu_node(remote, "list gpu box")
    pending = remote.enrolled_node(display_name="list pending box")
    done = modelforge(remote, "nodes", "list")
    assert done.returncode == 0, done.stderr
    assert re.split(r"\s{2,}", done.stdout.splitlines()[0].strip()) == [
        "NAME", "NODE ID", "STATUS", "LAST HEARTBEAT", "GPUS", "AGENT", "PROTOCOL", "CHANNEL"
    ]  # fmt: skip
    name, node_id, status, age, gpus, agent, protocol, channel = _row(done.stdout, str(online.node_id))
    assert channel == "fallback"  # the test's node holds no channel connection
    assert (name, node_id, status, gpus, agent, protocol) == (
        "list gpu box",
        online.node_id,
        "online",
        "2",
        "1.3.0",
        "1",
    )
    assert re.fullmatch(r"\d+s", age)
    assert _row(done.stdout, str(pending.node_id))[2:4] == ["pending", "-"]


def test_list_filters_by_status_and_json_is_every_node_of_the_api(remote: ControlPlane) -> None:
    online = _gpu_node(remote, "filter online box", gpus=1)
    pending = remote.enrolled_node(display_name="filter pending box")
    only_pending = modelforge(remote, "nodes", "list", "--status", "pending")
    assert pending.node_id in only_pending.stdout and online.node_id not in only_pending.stdout
    listed = modelforge(remote, "nodes", "list", "--json").json()
    assert listed["next_token"] is None
    assert {node["node_id"] for node in listed["nodes"]} >= {node["node_id"] for node in remote.all_nodes()}
    assert (
        next(node for node in listed["nodes"] if node["node_id"] == online.node_id)["inventory"]["gpus"][0]["name"]
        == "NVIDIA H200"
    )
    filtered = modelforge(remote, "nodes", "list", "--status", "online", "--json").json()["nodes"]
    assert filtered and {node["status"] for node in filtered} == {"online"}
    bad = modelforge(remote, "nodes", "list", "--status", "sleeping")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_show_describes_one_node_and_json_is_the_apis(remote: ControlPlane) -> None:
    identity = _gpu_node(remote, "show box")
    done = modelforge(remote, "nodes", "show", str(identity.node_id))
    assert done.returncode == 0, done.stderr
    for pattern in (
        r"^name:\s+show box$",
        r"^status:\s+online$",
        r"^credential:\s+active",
        r"^accelerator:\s+nvidia$",
        r"^capabilities:\s+cuda, llm.generate$",
    ):
        assert re.search(pattern, done.stdout, re.M), pattern
    assert re.search(r"^GPU\s+NAME\s+MEMORY\s+UTIL\s+TEMP\s+POWER\s+UUID$", done.stdout, re.M)
    assert re.search(r"^1\s+NVIDIA H200\s+133.9 GiB\s+87.5%\s+64C\s+612.4W\s+GPU-", done.stdout, re.M)
    as_json = modelforge(remote, "nodes", "show", str(identity.node_id), "--json").json()
    expected = remote.node(str(identity.node_id))
    assert {key: value for key, value in as_json.items() if key != "status"} == {
        key: value for key, value in expected.items() if key != "status"
    }


def test_show_of_an_unknown_node_exits_1_with_the_apis_code_and_message(remote: ControlPlane) -> None:
    done = modelforge(remote, "nodes", "show", UNKNOWN)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (1, "", "modelforge: node_not_found: no such node")


def test_readiness_json_and_enrollment_ids_and_its_error_keeps_exit_2_with_a_message(remote: ControlPlane) -> None:
    minted = remote.mint()
    pending = modelforge(remote, "nodes", "readiness", minted["enrollment_id"], "--json")
    assert pending.returncode == 1 and pending.json()["ready"] is False and pending.json()["node_id"] is None
    identity = _gpu_node(remote, "ready box", gpus=1)
    ready = modelforge(remote, "nodes", "readiness", str(identity.node_id), "--json")
    assert ready.returncode == 0 and ready.json()["ready"] is True
    unknown = modelforge(remote, "nodes", "readiness", UNKNOWN)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "modelforge: readiness refused: node_not_found: no such node"


def test_revoke_credential_without_a_terminal_needs_yes(remote: ControlPlane) -> None:
    identity = _gpu_node(remote, "revoke box", gpus=1)
    refused = modelforge(remote, "nodes", "revoke-credential", str(identity.node_id))
    assert refused.returncode == 2 and "--yes" in refused.stderr and refused.stdout == ""
    assert remote.node(str(identity.node_id))["credential"]["state"] == "active"

    done = modelforge(remote, "nodes", "revoke-credential", str(identity.node_id), "--yes")
    assert done.returncode == 0, done.stderr
    assert "revoked" in done.stdout and "modelforge enrollments create" in done.stdout
    assert remote.node(str(identity.node_id))["credential"]["state"] == "revoked"
    beat = remote.heartbeat(identity, gpus=1)
    assert beat.status_code == 401 and beat.json()["error"]["code"] == "credential_revoked"
    assert _row(modelforge(remote, "nodes", "list").stdout, str(identity.node_id))[2] == "online,revoked"

    again = modelforge(remote, "nodes", "revoke-credential", str(identity.node_id), "--yes")
    assert again.returncode == 2 and again.stderr.startswith("modelforge: credential_already_revoked: ")
    unknown = modelforge(remote, "nodes", "revoke-credential", UNKNOWN, "--yes", "--json")
    assert unknown.returncode == 1 and "node_not_found" in unknown.stderr


def test_revoke_credential_on_a_terminal_asks_and_does_only_what_the_answer_says(remote: ControlPlane) -> None:
    identity = _gpu_node(remote, "prompted box", gpus=1)
    declined = modelforge_on_a_terminal(remote, "nodes", "revoke-credential", str(identity.node_id), answer="n")
    assert declined.returncode == 1, declined.stderr
    assert "prompted box" in declined.stderr and "[y/N]" in declined.stderr and "not revoked" in declined.stderr
    assert remote.node(str(identity.node_id))["credential"]["state"] == "active"
    accepted = modelforge_on_a_terminal(remote, "nodes", "revoke-credential", str(identity.node_id), answer="y")
    assert accepted.returncode == 0, accepted.stderr
    assert remote.node(str(identity.node_id))["credential"]["state"] == "revoked"


def test_delete_refuses_a_live_node_then_removes_it_once_revoked(remote: ControlPlane) -> None:
    identity = _gpu_node(remote, "delete box", gpus=1)
    node_id = str(identity.node_id)
    refused = modelforge(remote, "nodes", "delete", node_id)
    assert refused.returncode == 2 and "--yes" in refused.stderr and refused.stdout == ""
    live = modelforge(remote, "nodes", "delete", node_id, "--yes")
    assert live.returncode == 2 and live.stderr.startswith("modelforge: node_not_removable: the node is online")
    assert modelforge(remote, "nodes", "revoke-credential", node_id, "--yes").returncode == 0

    done = modelforge(remote, "nodes", "delete", node_id, "--yes")
    assert done.returncode == 0, done.stderr
    assert f"node {node_id} deleted (its credential was revoked)" in done.stdout
    assert modelforge(remote, "nodes", "show", node_id).returncode == 1
    beat = remote.heartbeat(identity, gpus=1)
    assert beat.status_code == 401 and beat.json()["error"]["code"] == "credential_invalid"
    gone = modelforge(remote, "nodes", "delete", node_id, "--yes", "--json")
    assert gone.returncode == 1 and "node_not_found" in gone.stderr


def test_delete_on_a_terminal_asks_and_does_only_what_the_answer_says(remote: ControlPlane) -> None:
    identity = _gpu_node(remote, "prompted delete box", gpus=1)
    node_id = str(identity.node_id)
    assert modelforge(remote, "nodes", "revoke-credential", node_id, "--yes").returncode == 0
    declined = modelforge_on_a_terminal(remote, "nodes", "delete", node_id, answer="n")
    assert declined.returncode == 1, declined.stderr
    assert "prompted delete box" in declined.stderr and "[y/N]" in declined.stderr and "not deleted" in declined.stderr
    assert remote.node(node_id)["node_id"] == node_id
    accepted = modelforge_on_a_terminal(remote, "nodes", "delete", node_id, answer="y")
    assert accepted.returncode == 0, accepted.stderr
    assert remote.admin("GET", f"/api/v1/admin/nodes/{node_id}").status_code == 404
