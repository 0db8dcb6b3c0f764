"""scripts/recreate-node-agent.sh against a fake docker: it refuses while the state volume holds
no identity (looked for with the agent's image, read-only, no network), and otherwise recreates
the container from an env file without any token, keeping the state volume; its temporary file
goes on success, failure and signal as the start script's does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from modelforge_node_agent.identity import IDENTITY_FILE
from modelforge_protocol.versions import IMAGE_TAG_VERSION
from tests.deploy.node_host import RECREATE, ROOT, NodeHost, new_token
from tests.support import fake_docker
from tests.support.polling import wait_until

UP = ["up", "-d", "--force-recreate", "--no-build", "--pull", "never", "node-agent"]


@pytest.fixture()
def node(tmp_path: Path) -> NodeHost:
    return NodeHost(tmp_path)


def _enrolled(node: NodeHost) -> None:
    (node.state_dir / IDENTITY_FILE).write_text("{}")


def _compose_env_file(call: dict) -> tuple[str, dict]:
    path = call["env"]["MODELFORGE_AGENT_ENV_FILE"]
    return path, call["env_files"][path]


def _probe(node: NodeHost) -> subprocess.CompletedProcess[str]:
    """The identity probe the script gave `docker run`, run here on the state directory itself."""
    argv = node.call("run")["argv"]
    code = argv[argv.index("-c") + 1].replace("/state/", f"{node.state_dir}/")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)


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


def test_recreate_script_with_identity_force_recreates_without_token(node: NodeHost) -> None:
    _enrolled(node)
    result = node.run(RECREATE, str(node.write_env_file()))
    assert result.returncode == 0, result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect", "run", "compose-up", "compose-ps", "inspect"]
    assert _probe(node).returncode == 0
    up = node.call("compose-up")
    path, env = _compose_env_file(up)
    assert up["argv"][-len(UP):] == UP
    assert up["argv"][:5] == ["compose", "-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.node-agent.yml")]
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
    assert "usage: scripts/recreate-node-agent.sh [ENV_FILE]" in result.stderr
    assert node.calls() == []


def test_recreate_script_identity_file_name_is_the_agents() -> None:
    helper = (ROOT / "scripts" / "_node_agent_compose.sh").read_text()
    assert f"\nIDENTITY_FILE={IDENTITY_FILE}\n" in helper
    assert fake_docker.IDENTITY_FILE == IDENTITY_FILE
