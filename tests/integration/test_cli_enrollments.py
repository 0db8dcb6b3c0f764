"""`modelforge enrollments create|list|show|revoke` as a subprocess against `modelforge local up`."""

from __future__ import annotations

import re
import signal
import sys
from datetime import datetime
from pathlib import Path

from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.deploy.node_host import ROOT
from tests.support.admin_cli import modelforge
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import LoggedProcess

UNKNOWN = "enr_" + "0" * 32


def _seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def test_create_prints_the_token_once_apart_from_the_nodes_settings_and_the_next_commands(remote: ControlPlane) -> None:
    done = modelforge(remote, "enrollments", "create", "--name", "rack 4 box", "--expires", "1h")
    assert done.returncode == 0, done.stderr
    token = re.search(r"^(mfe\.\S+)$", done.stdout, re.M)
    assert token is not None, done.stdout
    assert done.stdout.count(token.group(1)) == 1 and token.group(1) not in done.stderr
    enrollment_id = token.group(1).split(".")[1]
    settings = _env_block(done.stdout)
    assert token.group(1) not in settings and "ENROLLMENT_TOKEN" not in settings  # the .env is non-secret
    assert settings.splitlines() == [
        f"MODELFORGE_AGENT_CONTROL_PLANE_URL={remote.base_url}",
        "MODELFORGE_AGENT_HOSTNAME=rack_4_box",  # issue 21: not the container's id
        "MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia",
        "MODELFORGE_AGENT_TLS_VERIFY=true",
        "MODELFORGE_AGENT_STATE_VOLUME=/var/lib/modelforge/agent-state",
        "MODELFORGE_AGENT_IDENTITY_MODE=persisted",
        f"MODELFORGE_NODE_AGENT_IMAGE=modelforge-node-agent:{IMAGE_TAG_VERSION}",
        "MODELFORGE_AGENT_WORKER_URL=unix:///var/lib/modelforge/worker/worker.sock",
    ]
    assert "shown only now" in done.stdout
    for command in (
        "docker compose -f docker-compose.yml -f docker-compose.runtime-worker.yml up -d --no-build --pull never "
        "runtime-worker",
        "bash scripts/node-agent-start.sh .env",
        "bash scripts/recreate-node-agent.sh .env",
        "bash scripts/node-agent-start.sh --no-container .env",
        "bash scripts/recreate-node-agent.sh --no-container .env",
    ):
        assert f"\n{command}\n" in done.stdout
    # issue 21: no command leaves the token exported in the admin's shell
    assert "export MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in done.stdout and "read -rsp" not in done.stdout
    bare = _env_block(done.stdout, 1)
    assert "MODELFORGE_NODE_AGENT_IMAGE" not in bare and "MODELFORGE_AGENT_WORKER_URL" not in bare
    assert "MODELFORGE_AGENT_HOSTNAME=rack_4_box" in bare
    assert f"modelforge nodes readiness {enrollment_id}" in done.stdout
    shown = remote.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").json()
    assert shown["display_name"] == "rack 4 box" and shown["status"] == "pending"
    assert _seconds_between(shown["created_at"], shown["expires_at"]) == 3600
    # the token works exactly once
    assert remote.enroll(token.group(1), AgentIdentity()).status_code == 201


def test_create_json_is_the_apis_answer_and_expiry_takes_seconds_too(remote: ControlPlane) -> None:
    done = modelforge(remote, "enrollments", "create", "--expires", "90", "--json")
    assert done.returncode == 0, done.stderr
    minted = done.json()
    assert minted["token"].startswith(f"mfe.{minted['enrollment_id']}.") and minted["display_name"] == "GPU Node"
    assert _seconds_between(minted["created_at"], minted["expires_at"]) == 90
    default = modelforge(remote, "enrollments", "create", "--json").json()
    assert _seconds_between(default["created_at"], default["expires_at"]) == 900


def test_create_refuses_an_expiry_outside_the_apis_range_before_calling_it(remote: ControlPlane) -> None:
    for expiry in ("5s", "25h", "tomorrow"):
        done = modelforge(remote, "enrollments", "create", "--expires", expiry)
        assert done.returncode == 2 and "--expires" in done.stderr and done.stdout == ""


def test_list_and_show_print_tables_and_json(remote: ControlPlane) -> None:
    minted = remote.mint(display_name="listed box")
    listing = modelforge(remote, "enrollments", "list")
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "EXPIRES", "NODE"]
    row = next(line for line in rows if line.startswith(minted["enrollment_id"]))
    assert "listed box" in row and "pending" in row and re.search(r"in 1[45]m", row)
    as_json = modelforge(remote, "enrollments", "list", "--json").json()
    assert as_json["next_token"] is None
    assert minted["enrollment_id"] in {item["enrollment_id"] for item in as_json["enrollments"]}

    show = modelforge(remote, "enrollments", "show", minted["enrollment_id"])
    assert show.returncode == 0
    assert re.search(r"^status:\s+pending$", show.stdout, re.M) and "listed box" in show.stdout
    assert "mfe." not in show.stdout
    assert (
        modelforge(remote, "enrollments", "show", minted["enrollment_id"], "--json").json()
        == remote.admin("GET", f"/api/v1/admin/node-enrollments/{minted['enrollment_id']}").json()
    )


def test_show_of_an_unknown_enrollment_exits_1_with_the_apis_code_and_message(remote: ControlPlane) -> None:
    done = modelforge(remote, "enrollments", "show", UNKNOWN)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == "modelforge: enrollment_not_found: no such enrollment"


def test_list_follows_every_page(remote: ControlPlane) -> None:
    first_page = remote.admin("GET", "/api/v1/admin/node-enrollments", params={"limit": "100"}).json()
    for _ in range(0 if first_page["next_token"] else 101 - len(first_page["enrollments"])):
        remote.mint(display_name="page filler")
    expected = set()
    token = None
    while True:
        page = remote.admin(
            "GET", "/api/v1/admin/node-enrollments", params={"next_token": token} if token else {}
        ).json()
        expected |= {item["enrollment_id"] for item in page["enrollments"]}
        token = page["next_token"]
        if not token:
            break
    listed = modelforge(remote, "enrollments", "list", "--json").json()["enrollments"]
    assert len(listed) > 100 and {item["enrollment_id"] for item in listed} >= expected
    table = modelforge(remote, "enrollments", "list").stdout.splitlines()
    assert len(table) - 1 >= len(expected)


def test_revoke_an_unused_token_then_refusals_with_their_codes(remote: ControlPlane) -> None:
    minted = remote.mint()
    done = modelforge(remote, "enrollments", "revoke", minted["enrollment_id"])
    assert done.returncode == 0 and "revoked" in done.stdout, done.stderr
    assert remote.enroll(minted["token"], AgentIdentity()).status_code == 410
    again = modelforge(remote, "enrollments", "revoke", minted["enrollment_id"])
    assert again.returncode == 2 and again.stderr.startswith("modelforge: enrollment_revoked: ")
    unknown = modelforge(remote, "enrollments", "revoke", UNKNOWN)
    assert unknown.returncode == 1 and "enrollment_not_found" in unknown.stderr

    used = remote.mint()
    identity = AgentIdentity()
    assert remote.enroll(used["token"], identity).status_code == 201
    consumed = modelforge(remote, "enrollments", "revoke", used["enrollment_id"], "--json")
    assert consumed.returncode == 2 and consumed.stdout == ""
    assert (
        "enrollment_consumed" in consumed.stderr
        and f"modelforge nodes revoke-credential {identity.node_id}" in consumed.stderr
    )
    assert len(consumed.stderr.strip().splitlines()) == 1


def test_the_printed_next_command_starts_an_agent_that_becomes_ready(remote: ControlPlane, tmp_path: Path) -> None:
    """Issue 21: without containers, the printed command is scripts/node-agent-start.sh --no-container,
    run here from this checkout as printed, the token typed at its prompt (here: standard input)."""
    done = modelforge(remote, "enrollments", "create", "--name", "next step box", "--hostname", "next-step")
    token = re.search(r"^(mfe\.\S+)$", done.stdout, re.M)
    start = re.search(r"^bash scripts/node-agent-start.sh --no-container \.env$", done.stdout, re.M)
    assert token is not None and start is not None, done.stdout
    enrollment_id = re.search(r"modelforge nodes readiness (enr_\w+)", done.stdout).group(1)  # type: ignore[union-attr]
    # as on a CPU-only node, with its state volume here; the rest exactly as printed
    config = _env_block(done.stdout, 1).replace("ACCELERATOR_MODE=nvidia", "ACCELERATOR_MODE=cpu")
    config = re.sub(r"STATE_VOLUME=.*", f"STATE_VOLUME={tmp_path / 'state'}", config)
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / ".env").write_text(config + "\n")
    typed = tmp_path / "typed"
    typed.write_text(token.group(1) + "\n")
    venv_bin = str(Path(sys.executable).parent)
    command = ["bash", "-c", f"cd {ROOT} && exec {start.group(0).replace('.env', str(tmp_path / '.env'))} < {typed}"]
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    with LoggedProcess(command, tmp_path / "agent.log", env) as agent:
        wait_until(
            lambda: modelforge(remote, "nodes", "readiness", enrollment_id).returncode == 0,
            60,
            "the agent started as printed to be ready",
            interval=0.5,
            detail=agent.output,
        )
        assert token.group(1) not in agent.output()
        shown = remote.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").json()
        node = remote.admin("GET", f"/api/v1/admin/nodes/{shown['node_id']}").json()
        assert node["hostname"] == "next-step"
        assert agent.stop(signal.SIGTERM) == 143
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("modelforge-node-agent.")] == []


def _env_block(printed: str, number: int = 0) -> str:
    """The .env the output tells the admin to write on the node: with containers (0), without (1)."""
    blocks = re.findall(r"^cat > \.env <<'EOF'\n(.*?)\n^EOF$", printed, re.M | re.S)
    assert len(blocks) == 2, printed
    return str(blocks[number])
