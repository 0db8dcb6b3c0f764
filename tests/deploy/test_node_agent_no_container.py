"""scripts/node-agent-start.sh --no-container and scripts/recreate-node-agent.sh --no-container
(issue 21, first hour 6) against a fake agent process: the seed's start-command properties hold
without Compose (tracing off, the token read without echo, a temporary mode-0600 env file removed
on every exit, the token in no argv, output or leftover file); the recreation restarts the agent
without the token once it enrolled. And security pass 9: a control plane URL in the .env that is
not exactly an origin is refused before anything starts, with or without containers."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from modelforge_node_agent.identity import StateVolume, new_identity

from tests.deploy.node_host import RECREATE, ROOT, START, NodeHost, new_token
from tests.support.polling import wait_until

#: the fake agent: records what it was started with (its record holds the token on purpose: it is
#: the agent's own environment, outside the places a token must never reach), then exits with
#: FAKE_AGENT_EXIT or, with FAKE_AGENT_SLEEP, waits for a signal
FAKE_AGENT = f"""#!{sys.executable}
import json, os, signal, sys, time
record = {{
    "pid": os.getpid(),
    "argv": sys.argv,
    "env": {{k: v for k, v in os.environ.items() if k.startswith("MODELFORGE_")}},
    "tmp_files": [os.path.join(d, f) for d, _, fs in os.walk(os.environ["TMPDIR"]) for f in fs],
    "tmp_folders": sorted(
        os.stat(os.path.join(d, n)).st_mode & 0o777 for d, ns, _ in os.walk(os.environ["TMPDIR"]) for n in ns
    ),
}}
log = os.environ["FAKE_AGENT_LOG"]
with open(log, "a") as file:
    file.write(json.dumps(record) + "\\n")
if os.environ.get("FAKE_AGENT_SLEEP"):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.05)
sys.exit(int(os.environ.get("FAKE_AGENT_EXIT", "0")))
"""


@pytest.fixture()
def node(tmp_path: Path) -> NodeHost:
    host = NodeHost(tmp_path)
    agent = host.bin_dir / "modelforge-node-agent"
    agent.write_text(FAKE_AGENT)
    agent.chmod(0o755)
    return host


def _env_file(node: NodeHost, *extra: str) -> Path:
    return node.write_env_file(f"MODELFORGE_NODE_AGENT_COMMAND={node.bin_dir / 'modelforge-node-agent'}", *extra)


def _log(node: NodeHost) -> Path:
    return node.root / "agent-runs.jsonl"


def _runs(node: NodeHost) -> list[dict[str, Any]]:
    path = _log(node)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _env(node: NodeHost, **extra: str) -> dict[str, str]:
    return {"FAKE_AGENT_LOG": str(_log(node)), **extra}


def _enrolled(node: NodeHost) -> None:
    state = StateVolume(node.state_dir)
    identity = new_identity("https://cp.node-test.internal:8000")
    state.save(identity)
    state.enrolled_as(identity, "node_" + secrets.token_hex(16))


def test_no_container_start_runs_the_agent_with_the_token_from_a_removed_0600_file(node: NodeHost) -> None:
    token = new_token()
    result = node.run(START, "--no-container", str(_env_file(node)), stdin=token + "\n", **_env(node))
    assert result.returncode == 0, result.stderr
    assert [call["name"] for call in node.calls()] == []  # no docker at all
    [run] = _runs(node)
    assert run["env"]["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == token
    assert run["env"]["MODELFORGE_AGENT_STATE_VOLUME"] == str(node.state_dir)  # the host path itself
    assert run["env"]["MODELFORGE_AGENT_CONTROL_PLANE_URL"] == "https://cp.node-test.internal:8000"
    assert run["argv"][1:] == []
    # the file was removed as soon as the agent had read it; its folder was private
    assert run["tmp_files"] == [] and run["tmp_folders"] == [0o700]
    assert list(node.tmp_dir.iterdir()) == []
    assert node.leaks(token, result.stdout, result.stderr) == []
    assert "recreate-node-agent.sh --no-container" in result.stderr


def test_no_container_start_exits_with_the_agents_status_and_under_bash_x_traces_no_token(node: NodeHost) -> None:
    token = new_token()
    env = _env(node, FAKE_AGENT_EXIT="4")
    result = node.run(START, "--no-container", str(_env_file(node)), stdin=token, bash_flags=("-x",), **env)
    assert result.returncode == 4, result.stderr
    assert token not in result.stderr and token not in result.stdout
    assert list(node.tmp_dir.iterdir()) == []


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_no_container_start_signal_stops_the_agent_and_removes_the_folder(
    node: NodeHost, signum: int, status: int
) -> None:
    process = node.start(START, "--no-container", str(_env_file(node)), **_env(node, FAKE_AGENT_SLEEP="1"))
    try:
        assert process.stdin is not None
        process.stdin.write(new_token() + "\n")
        process.stdin.close()
        wait_until(lambda: _runs(node) != [], 30, "the agent to start")
        agent_pid = _runs(node)[0]["pid"]
        process.send_signal(signum)
        assert process.wait(timeout=30) == status
        wait_until(lambda: not Path(f"/proc/{agent_pid}").exists(), 30, "the agent to stop")
        assert list(node.tmp_dir.iterdir()) == []
    finally:
        node.stop(process, 0)


def test_no_container_start_without_an_agent_installed_says_how_to_get_one(node: NodeHost) -> None:
    env_file = node.write_env_file("MODELFORGE_NODE_AGENT_COMMAND=relative/agent")
    result = node.run(START, "--no-container", str(env_file), stdin=new_token(), **_env(node))
    assert result.returncode == 2 and "absolute path" in result.stderr
    assert _runs(node) == []


def test_no_container_start_refuses_a_missing_state_directory_before_the_token(node: NodeHost) -> None:
    env_file = _env_file(node)
    node.state_dir.rmdir()
    result = node.run(START, "--no-container", str(env_file), stdin=new_token(), **_env(node))
    assert result.returncode == 2 and "install -d -m 0700" in result.stderr and "65532" not in result.stderr
    assert _runs(node) == []


BAD_URLS = [
    'https://"cp".node-test.internal',
    "https://cp$(touch pwned).node-test.internal",
    "https://cp .node-test.internal",
    "https://cp.node-test.internal/api",
    "https://user@cp.node-test.internal",
    "http://cp.node-test.internal",
    "https://cp.node-test.internal:70000",
    "https://999.1.2.3",
    "ftp://cp.node-test.internal",
    "",
]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("mode", ["--no-container", "containers"])
def test_start_refuses_a_control_plane_url_that_is_not_an_origin(node: NodeHost, url: str, mode: str) -> None:
    """Security pass 9: the .env's value is checked before use, in both modes."""
    lines = [line for line in _env_file(node).read_text().splitlines() if "CONTROL_PLANE_URL" not in line]
    (node.work_dir / ".env").write_text("\n".join([*lines, f"MODELFORGE_AGENT_CONTROL_PLANE_URL={url}"]) + "\n")
    args = ("--no-container", ".env") if mode == "--no-container" else (".env",)
    result = node.run(START, *args, stdin=new_token(), **_env(node))
    assert result.returncode == 2, result.stderr
    assert "MODELFORGE_AGENT_CONTROL_PLANE_URL" in result.stderr
    assert _runs(node) == [] and node.calls() == []
    assert not (node.work_dir / "pwned").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:8000", "https://[2001:db8::1]:443/"])
def test_no_container_start_accepts_a_loopback_or_ipv6_origin(node: NodeHost, url: str) -> None:
    env_file = _env_file(node, f"MODELFORGE_AGENT_CONTROL_PLANE_URL={url}")
    result = node.run(START, "--no-container", str(env_file), stdin=new_token(), **_env(node))
    assert result.returncode == 0, result.stderr
    assert _runs(node)[0]["env"]["MODELFORGE_AGENT_CONTROL_PLANE_URL"] == url


def test_start_with_a_cpu_env_file_uses_the_compose_file_that_reserves_no_gpu(node: NodeHost) -> None:
    env_file = node.write_env_file()
    env_file.write_text(env_file.read_text().replace("ACCELERATOR_MODE=nvidia", "ACCELERATOR_MODE=cpu"))
    result = node.run(START, str(env_file), stdin=new_token())
    assert result.returncode == 0, result.stderr
    argv = node.call("compose-up")["argv"]
    assert str(ROOT / "docker-compose.node-agent.cpu.yml") in argv
    assert str(ROOT / "docker-compose.node-agent.yml") not in argv


def test_no_container_recreate_before_enrollment_refuses_and_starts_nothing(node: NodeHost) -> None:
    result = node.run(RECREATE, "--no-container", str(_env_file(node)), **_env(node))
    assert result.returncode == 3, result.stderr
    assert "no identity" in result.stderr
    assert _runs(node) == [] and list(node.tmp_dir.iterdir()) == []


def test_no_container_recreate_stops_the_running_agent_and_restarts_it_without_the_token(node: NodeHost) -> None:
    token = new_token()
    env_file = _env_file(node)
    first = node.start(START, "--no-container", str(env_file), **_env(node, FAKE_AGENT_SLEEP="1"))
    try:
        assert first.stdin is not None
        first.stdin.write(token + "\n")
        first.stdin.close()
        wait_until(lambda: _runs(node) != [], 30, "the agent to start")
        _enrolled(node)
        result = node.run(RECREATE, "--no-container", str(env_file), **_env(node))
        assert result.returncode == 0, result.stderr
        assert first.wait(timeout=30) == 0  # the first agent was stopped (TERM), its script exited with it
        old, new = _runs(node)
        assert old["env"]["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == token
        assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in new["env"]
        assert new["env"]["MODELFORGE_AGENT_STATE_VOLUME"] == str(node.state_dir)
        assert f"pid {old['pid']}" in result.stderr
        assert list(node.tmp_dir.iterdir()) == []
    finally:
        node.stop(first, 0)


def test_no_container_recreate_leaves_an_agent_on_another_state_directory_alone(node: NodeHost) -> None:
    other = subprocess.Popen(
        [str(node.bin_dir / "modelforge-node-agent")],
        env={
            **os.environ,
            **_env(node, FAKE_AGENT_SLEEP="1"),
            "TMPDIR": str(node.tmp_dir),
            "MODELFORGE_AGENT_STATE_VOLUME": str(node.root / "elsewhere"),
        },
    )
    try:
        wait_until(lambda: _runs(node) != [], 30, "the other agent to start")
        _enrolled(node)
        result = node.run(RECREATE, "--no-container", str(_env_file(node)), **_env(node))
        assert result.returncode == 0, result.stderr
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.terminate()
        other.wait(timeout=30)
