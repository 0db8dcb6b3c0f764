"""scripts/recreate-node-agent.sh against a fake docker: it refuses while the state volume holds
no identity (looked for with the agent's image, read-only, no network), and otherwise recreates
the container from an env file without any token, keeping the state volume; its temporary file
goes on success, failure and signal as the start script's does."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from modelforge_node_agent.identity import IDENTITY_FILE, StateVolume, new_identity
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.deploy.node_host import RECREATE, ROOT, NodeHost, new_token
from tests.support import fake_docker
from tests.support.polling import wait_until

UP = ["up", "-d", "--force-recreate", "--no-build", "--pull", "never", "node-agent"]


@pytest.fixture()
def node(tmp_path: Path) -> NodeHost:
    return NodeHost(tmp_path)


def _identity(node: NodeHost, node_id: str | None) -> None:
    """identity.json as the agent writes it: with ``node_id`` None before it calls enroll, the
    node's ID once the control plane answered."""
    state = StateVolume(node.state_dir)
    identity = new_identity("https://cp.node-test.internal:8000")
    state.save(identity)
    if node_id is not None:
        state.enrolled_as(identity, node_id)


def _enrolled(node: NodeHost) -> None:
    _identity(node, "node_" + secrets.token_hex(16))


def _compose_env_file(call: dict) -> tuple[str, dict]:
    path = call["env"]["MODELFORGE_AGENT_ENV_FILE"]
    return path, call["env_files"][path]


def _probe(node: NodeHost) -> subprocess.CompletedProcess[str]:
    """The identity probe the script gave `docker run`, run again here on the state directory."""
    argv = node.call("run")["argv"]
    code, args = argv[argv.index("-c") + 1], argv[argv.index("-c") + 2 :]
    assert args == [f"/state/{IDENTITY_FILE}"]
    return subprocess.run(
        [sys.executable, "-c", code, str(node.state_dir / IDENTITY_FILE)], capture_output=True, text=True, timeout=30
    )


def _refused_before_compose(node: NodeHost, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 3, result.stderr
    assert "Nothing was recreated" in result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect", "run"]
    assert list(node.tmp_dir.iterdir()) == []


def test_recreate_script_without_identity_refuses_before_compose(node: NodeHost) -> None:
    result = node.run(RECREATE, str(node.write_env_file()))
    assert result.returncode == 3
    assert f"holds no identity ({IDENTITY_FILE}) yet: the enrollment has not been consumed" in result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect", "run"]
    run = node.call("run")["argv"]
    assert run[:5] == ["run", "--rm", "--network", "none", "--read-only"]
    assert f'type=bind,"source={node.state_dir}",target=/state,readonly' in run
    assert run[run.index("-c") - 2 :][:2] == [f"modelforge-node-agent:{IMAGE_TAG_VERSION}", "python3"]
    assert _probe(node).returncode == 3  # the real probe agrees: no identity file
    assert list(node.tmp_dir.iterdir()) == []


def test_recreate_script_identity_written_before_enroll_refused(node: NodeHost) -> None:
    """The agent persists its identity with node_id null before it calls enroll: that file alone
    must not let the token go."""
    _identity(node, None)
    assert json.loads((node.state_dir / IDENTITY_FILE).read_text())["node_id"] is None
    result = node.run(RECREATE, str(node.write_env_file()))
    _refused_before_compose(node, result)
    assert f"{node.state_dir / IDENTITY_FILE} has no node ID yet: the enrollment has not been consumed" in result.stderr
    assert "enrolled as node_" in result.stderr and "logs node-agent" in result.stderr  # what to wait for
    assert _probe(node).returncode == 4


@pytest.mark.parametrize(
    "content",
    [b"\x00garbage{", b"", b'["node_id", "node_x"]', b'{"node_id": ""}', b'{"node_id": 7}'],
    ids=["garbage", "empty", "list", "empty-id", "number-id"],
)
def test_recreate_script_identity_not_an_enrolled_json_object_refused(node: NodeHost, content: bytes) -> None:
    (node.state_dir / IDENTITY_FILE).write_bytes(content)
    result = node.run(RECREATE, str(node.write_env_file()))
    _refused_before_compose(node, result)
    assert "not a JSON object" in result.stderr or "has no node ID yet" in result.stderr


def test_recreate_script_identity_unreadable_refused_with_the_reason(node: NodeHost) -> None:
    (node.state_dir / IDENTITY_FILE).mkdir()  # a folder where the file should be: read fails (EISDIR)
    result = node.run(RECREATE, str(node.write_env_file()))
    _refused_before_compose(node, result)
    assert "cannot read" in result.stderr and "Is a directory" in result.stderr
    assert "could not be read by the agent's user" in result.stderr


def test_recreate_script_identity_symbolic_link_refused(node: NodeHost) -> None:
    _enrolled(node)
    real = node.root / "elsewhere.json"
    (node.state_dir / IDENTITY_FILE).rename(real)
    (node.state_dir / IDENTITY_FILE).symlink_to(real)  # the agent does not follow it: neither does the check
    result = node.run(RECREATE, str(node.write_env_file()))
    _refused_before_compose(node, result)
    assert "cannot open" in result.stderr


def test_recreate_script_with_identity_force_recreates_without_token(node: NodeHost) -> None:
    _enrolled(node)
    result = node.run(RECREATE, str(node.write_env_file()))
    assert result.returncode == 0, result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect", "run", "compose-up", "compose-ps", "inspect"]
    assert _probe(node).returncode == 0
    assert json.loads((node.state_dir / IDENTITY_FILE).read_text())["node_id"].startswith("node_")
    up = node.call("compose-up")
    path, env = _compose_env_file(up)
    assert up["argv"][-len(UP) :] == UP
    assert up["argv"][:5] == [
        "compose",
        "-f",
        str(ROOT / "docker-compose.yml"),
        "-f",
        str(ROOT / "docker-compose.node-agent.yml"),
    ]
    assert env["mode"] == 0o600
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in env["text"]
    assert f"MODELFORGE_AGENT_STATE_VOLUME={node.state_dir}" in env["text"].splitlines()
    assert not Path(path).exists()
    assert list(node.tmp_dir.iterdir()) == []


def test_recreate_script_env_file_token_line_left_out_and_not_repeated(node: NodeHost) -> None:
    _enrolled(node)
    token = new_token()
    result = node.run(RECREATE, str(node.write_env_file(f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={token}")))
    assert result.returncode == 0, result.stderr
    assert "holds MODELFORGE_AGENT_ENROLLMENT_TOKEN: left out of the new container" in result.stderr
    _, env = _compose_env_file(node.call("compose-up"))
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in env["text"]
    assert node.leaks(token, result.stdout, result.stderr) == [str(node.work_dir / ".env")]  # the operator's own file


def test_recreate_script_default_env_file_is_dot_env(node: NodeHost) -> None:
    _enrolled(node)
    node.write_env_file()
    result = node.run(RECREATE)
    assert result.returncode == 0, result.stderr
    _, env = _compose_env_file(node.call("compose-up"))
    assert "MODELFORGE_AGENT_HOSTNAME=gpu_node" in env["text"].splitlines()


def test_recreate_script_probe_unreadable_volume_fails_without_compose(node: NodeHost) -> None:
    result = node.run(RECREATE, str(node.write_env_file()), FAKE_DOCKER_FAIL="run")
    assert result.returncode == 1
    assert f"could not look for the identity in {node.state_dir}" in result.stderr
    assert "compose-up" not in [call["name"] for call in node.calls()]


def test_recreate_script_docker_compose_failing_exits_with_its_status_and_removes_env_file(node: NodeHost) -> None:
    _enrolled(node)
    result = node.run(RECREATE, str(node.write_env_file()), FAKE_DOCKER_FAIL="compose-up")
    assert result.returncode == fake_docker.FAIL_STATUS
    path, _ = _compose_env_file(node.call("compose-up"))
    assert not Path(path).exists()
    assert list(node.tmp_dir.iterdir()) == []


def test_recreate_script_sigint_while_docker_hangs_removes_env_file(node: NodeHost) -> None:
    _enrolled(node)
    process = node.start(RECREATE, str(node.write_env_file()), FAKE_DOCKER_HANG="compose-up")
    docker_pid = 0
    try:
        hanging = node.log_dir / "hanging"
        docker_pid = int(wait_until(lambda: hanging.exists() and hanging.read_text(), 20, "docker compose up to hang"))
        path, env = _compose_env_file(node.call("compose-up"))
        assert Path(path).exists() and env["mode"] == 0o600
        os.kill(process.pid, signal.SIGINT)
        process.wait(timeout=20)
    finally:
        node.stop(process, docker_pid)
    assert process.returncode == 130
    assert not Path(f"/proc/{docker_pid}").exists()
    assert list(node.tmp_dir.iterdir()) == []


def test_recreate_script_too_many_arguments_print_usage(node: NodeHost) -> None:
    result = node.run(RECREATE, "a.env", "b.env")
    assert result.returncode == 2
    assert "usage: scripts/recreate-node-agent.sh [--no-container] [ENV_FILE]" in result.stderr
    assert node.calls() == []


def test_recreate_script_identity_file_name_is_the_agents() -> None:
    helper = (ROOT / "scripts" / "_node_agent_compose.sh").read_text()
    assert f"\nIDENTITY_FILE={IDENTITY_FILE}\n" in helper


def test_recreate_script_callers_settings_dropped_by_name_only(node: NodeHost) -> None:
    _enrolled(node)
    result = node.run(RECREATE, str(node.write_env_file()), MODELFORGE_AGENT_HOSTNAME="other-secret-ish-value")
    assert result.returncode == 0, result.stderr
    assert "warning: ignoring MODELFORGE_AGENT_HOSTNAME from this shell's environment" in result.stderr
    assert "other-secret-ish-value" not in result.stderr
    assert all("MODELFORGE_AGENT_HOSTNAME" not in call["env"] for call in node.calls())
