"""scripts/node-agent-start.sh against a fake docker: the token reaches Compose's env file (mode
0600) and nowhere else (no argv, no environment, no process's command line, no file left behind,
no output, not under `bash -x`), on success, on docker's failure and on a signal while docker
hangs; the release flow's command and image-ID check; refusals before anything starts."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import termios
from pathlib import Path

import pytest
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.deploy.node_host import IMAGE_ID, ROOT, START, NodeHost, new_token
from tests.support import fake_docker
from tests.support.polling import wait_until

COMPOSE_FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.node-agent.yml")]
PRIVATE_CA_FILE = ["-f", str(ROOT / "docker-compose.node-agent.private-ca.yml")]
UP = ["up", "-d", "--no-build", "--pull", "never", "node-agent"]


@pytest.fixture()
def node(tmp_path: Path) -> NodeHost:
    return NodeHost(tmp_path)


def _compose_env_file(call: dict) -> tuple[str, dict]:
    path = call["env"]["MODELFORGE_AGENT_ENV_FILE"]
    return path, call["env_files"][path]


def _command_lines_holding(secret: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if secret.encode() in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found


def test_start_script_token_on_stdin_starts_agent_from_mode_0600_env_file(node: NodeHost) -> None:
    env_file = node.write_env_file()
    token = new_token()
    result = node.run(START, str(env_file), stdin=token + "\n")
    assert result.returncode == 0, result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect", "compose-up", "compose-ps", "inspect"]
    up = node.call("compose-up")
    path, env = _compose_env_file(up)
    assert up["argv"] == ["compose", *COMPOSE_FILES, "--env-file", path, *UP]
    assert env["mode"] == 0o600 and env["folder_mode"] == 0o700
    lines = env["text"].splitlines()
    assert f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={token}" in lines
    assert f"MODELFORGE_AGENT_STATE_VOLUME={node.state_dir}" in lines
    assert "MODELFORGE_AGENT_HOSTNAME=gpu_node" in lines
    assert not Path(path).exists()
    assert list(node.tmp_dir.iterdir()) == []
    assert node.leaks(token, result.stdout, result.stderr) == []
    assert fake_docker.CONTAINER_ID in result.stderr  # where to follow the agent's logs


def test_start_script_docker_compose_failing_exits_with_its_status_and_removes_env_file(node: NodeHost) -> None:
    token = new_token()
    result = node.run(START, str(node.write_env_file()), stdin=token, FAKE_DOCKER_FAIL="compose-up")
    assert result.returncode == fake_docker.FAIL_STATUS
    assert "docker compose up failed" in result.stderr
    path, env = _compose_env_file(node.call("compose-up"))
    assert env["mode"] == 0o600
    assert not Path(path).exists()
    assert list(node.tmp_dir.iterdir()) == []
    assert node.leaks(token, result.stdout, result.stderr) == []


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_start_script_signal_while_docker_hangs_stops_docker_and_removes_env_file(
    node: NodeHost, signum: int, status: int
) -> None:
    token = new_token()
    process = node.start(START, str(node.write_env_file()), FAKE_DOCKER_HANG="compose-up")
    docker_pid = 0
    try:
        assert process.stdin is not None
        process.stdin.write(token + "\n")
        process.stdin.close()
        hanging = node.log_dir / "hanging"
        docker_pid = int(wait_until(lambda: hanging.exists() and hanging.read_text(), 20, "docker compose up to hang"))
        path, env = _compose_env_file(node.call("compose-up"))
        assert Path(path).exists() and env["mode"] == 0o600
        assert _command_lines_holding(token) == []
        for pid in (process.pid, docker_pid):
            assert token.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        os.kill(process.pid, signum)
        process.wait(timeout=20)
        stdout, stderr = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    finally:
        node.stop(process, docker_pid)
    assert process.returncode == status
    assert not Path(f"/proc/{docker_pid}").exists()  # stopped and reaped by the script
    assert not Path(path).exists()
    assert list(node.tmp_dir.iterdir()) == []
    assert node.leaks(token, stdout, stderr) == []


def test_start_script_under_bash_x_traces_nothing_after_set_plus_x(node: NodeHost) -> None:
    token = new_token()
    result = node.run(START, str(node.write_env_file()), stdin=token, bash_flags=("-x",))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == "+ set +x"  # tracing was on, and the first command ended it
    assert not [line for line in result.stderr.splitlines() if line.startswith("+")][1:]
    assert node.leaks(token, result.stdout, result.stderr) == []


def test_start_script_token_from_terminal_is_not_echoed(node: NodeHost) -> None:
    token = new_token()
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            ["bash", str(START), str(node.write_env_file())],
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            cwd=node.work_dir,
            env=node.environment(),
        )
        seen = bytearray()

        def prompt_shown_and_echo_off() -> bool:
            while select.select([controller], [], [], 0)[0]:
                seen.extend(os.read(controller, 4096))
            return b"Enrollment token" in seen and not termios.tcgetattr(terminal)[3] & termios.ECHO

        wait_until(prompt_shown_and_echo_off, 20, "the hidden token prompt")
        os.write(controller, token.encode() + b"\n")
        process.wait(timeout=20)
        while select.select([controller], [], [], 0.2)[0]:
            try:
                seen.extend(os.read(controller, 4096))
            except OSError:
                break
    finally:
        os.close(controller)
        os.close(terminal)
    assert process.returncode == 0, seen.decode(errors="replace")
    _, env = _compose_env_file(node.call("compose-up"))
    assert f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={token}" in env["text"].splitlines()
    assert token.encode() not in seen
    assert node.leaks(token) == []


def test_start_script_image_id_differing_after_start_removes_container_and_fails(node: NodeHost) -> None:
    """Removed, not only stopped: a stopped container's configuration (docker inspect) would still
    hold the one-time token."""
    token = new_token()
    other = "sha256:" + "cd" * 32
    result = node.run(START, str(node.write_env_file()), stdin=token, FAKE_DOCKER_CONTAINER_IMAGE_ID=other)
    assert result.returncode == 1
    assert f"runs image {other}, not {IMAGE_ID}" in result.stderr and "removed it" in result.stderr
    assert node.call("rm")["argv"] == ["rm", "-f", fake_docker.CONTAINER_ID]
    assert "stop" not in [call["name"] for call in node.calls()]
    assert list(node.tmp_dir.iterdir()) == []
    assert node.leaks(token, result.stdout, result.stderr) == []


def test_start_script_without_image_setting_uses_this_release_tag(node: NodeHost) -> None:
    result = node.run(START, str(node.write_env_file()), stdin=new_token())
    assert result.returncode == 0, result.stderr
    assert node.call("image-inspect")["argv"][-1] == f"modelforge-node-agent:{IMAGE_TAG_VERSION}"


def test_start_script_image_setting_is_inspected_and_reaches_compose(node: NodeHost) -> None:
    image = "registry.example/modelforge-node-agent@sha256:" + "12" * 32
    result = node.run(START, str(node.write_env_file(f"MODELFORGE_NODE_AGENT_IMAGE={image}")), stdin=new_token())
    assert result.returncode == 0, result.stderr
    assert node.call("image-inspect")["argv"][-1] == image
    _, env = _compose_env_file(node.call("compose-up"))
    assert f"MODELFORGE_NODE_AGENT_IMAGE={image}" in env["text"].splitlines()


@pytest.mark.parametrize(
    "image", ["modelforge-node-agent:latest", "modelforge-node-agent", "registry.example:5000/agent"]
)
def test_start_script_floating_image_tag_refused_before_docker(node: NodeHost, image: str) -> None:
    result = node.run(START, str(node.write_env_file(f"MODELFORGE_NODE_AGENT_IMAGE={image}")), stdin=new_token())
    assert result.returncode == 2
    assert "floating tag" in result.stderr
    assert node.calls() == []


def test_start_script_image_not_loaded_fails_before_reading_token(node: NodeHost) -> None:
    token = new_token()
    result = node.run(START, str(node.write_env_file()), stdin=token, FAKE_DOCKER_FAIL="image-inspect")
    assert result.returncode == 1
    assert "is not on this node" in result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect"]
    assert list(node.tmp_dir.iterdir()) == []


def test_start_script_private_ca_setting_adds_private_ca_file(node: NodeHost) -> None:
    ca = node.work_dir / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    result = node.run(START, str(node.write_env_file(f"MODELFORGE_AGENT_CA_CERT_PATH={ca}")), stdin=new_token())
    assert result.returncode == 0, result.stderr
    up = node.call("compose-up")
    path, _ = _compose_env_file(up)
    assert up["argv"] == ["compose", *COMPOSE_FILES, *PRIVATE_CA_FILE, "--env-file", path, *UP]


def test_start_script_private_ca_file_missing_refused(node: NodeHost) -> None:
    missing = node.work_dir / "missing.pem"
    result = node.run(START, str(node.write_env_file(f"MODELFORGE_AGENT_CA_CERT_PATH={missing}")), stdin=new_token())
    assert result.returncode == 2
    assert f"MODELFORGE_AGENT_CA_CERT_PATH: {missing} is not a readable file" in result.stderr
    assert node.calls() == []


@pytest.mark.parametrize("arguments", [(), ("a.env", "b.env"), ("",)])
def test_start_script_wrong_arguments_print_usage_and_exit_2(node: NodeHost, arguments: tuple[str, ...]) -> None:
    result = node.run(START, *arguments, stdin=new_token())
    assert result.returncode == 2
    assert "usage: scripts/node-agent-start.sh [--no-container] ENV_FILE" in result.stderr
    assert node.calls() == []


def test_start_script_env_file_missing_refused(node: NodeHost) -> None:
    result = node.run(START, str(node.work_dir / "absent.env"), stdin=new_token())
    assert result.returncode == 2
    assert "absent.env is not a readable file" in result.stderr
    assert node.calls() == []


@pytest.mark.parametrize("given", ["", "   \n", "mfe.enr_0123.not-a-token-{nonce}"])
def test_start_script_empty_or_malformed_token_refused_before_compose(node: NodeHost, given: str) -> None:
    given = given.format(nonce=os.urandom(8).hex())
    result = node.run(START, str(node.write_env_file()), stdin=given)
    assert result.returncode == 2
    assert "no enrollment token given" in result.stderr or "not an enrollment token" in result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect"]
    assert list(node.tmp_dir.iterdir()) == []
    if given.strip():
        assert node.leaks(given.strip(), result.stdout, result.stderr) == []


def test_start_script_env_file_holding_token_refused_without_repeating_it(node: NodeHost) -> None:
    token = new_token()
    env_file = node.write_env_file(f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={token}")
    result = node.run(START, str(env_file), stdin=new_token())
    assert result.returncode == 2
    assert "holds MODELFORGE_AGENT_ENROLLMENT_TOKEN: delete that line" in result.stderr
    assert node.calls() == []
    assert token not in result.stdout + result.stderr


def test_start_script_state_directory_missing_refused_with_command_to_create_it(node: NodeHost) -> None:
    node.state_dir.rmdir()
    result = node.run(START, str(node.write_env_file()), stdin=new_token())
    assert result.returncode == 2
    assert f"sudo install -d -m 0700 -o 65532 -g 65532 '{node.state_dir}'" in result.stderr
    assert node.calls() == []


def test_start_script_state_directory_unset_refused(node: NodeHost) -> None:
    result = node.run(START, str(node.write_env_file(state=False)), stdin=new_token())
    assert result.returncode == 2
    assert "does not set MODELFORGE_AGENT_STATE_VOLUME" in result.stderr
    assert node.calls() == []


def test_start_script_settings_in_callers_environment_do_not_reach_docker(node: NodeHost) -> None:
    exported = new_token()
    result = node.run(
        START,
        str(node.write_env_file()),
        stdin=new_token(),
        MODELFORGE_AGENT_ENROLLMENT_TOKEN=exported,
        MODELFORGE_AGENT_STATE_VOLUME="/somewhere/else",
    )
    assert result.returncode == 0, result.stderr
    for call in node.calls():
        assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in call["env"]
        assert "MODELFORGE_AGENT_STATE_VOLUME" not in call["env"]
    assert node.leaks(exported) == []
    # each dropped variable is named (so a `export MODELFORGE_AGENT_...` that did nothing is seen),
    # never its value
    warnings = [line for line in result.stderr.splitlines() if "from this shell's environment" in line]
    assert len(warnings) == 1, result.stderr
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" in warnings[0] and "MODELFORGE_AGENT_STATE_VOLUME" in warnings[0]
    assert "put them there" in warnings[0]
    assert exported not in result.stderr and "/somewhere/else" not in result.stderr


def test_start_script_without_callers_settings_warns_of_nothing(node: NodeHost) -> None:
    result = node.run(START, str(node.write_env_file()), stdin=new_token())
    assert result.returncode == 0, result.stderr
    assert "from this shell's environment" not in result.stderr


@pytest.mark.parametrize("caller", [{"TOKEN": "x"}, {"SHELLOPTS": "allexport"}], ids=["exported-TOKEN", "allexport"])
def test_start_script_token_never_exported_to_docker(node: NodeHost, caller: dict[str, str]) -> None:
    """A caller's exported TOKEN (the name the script reads the token into) or allexport must not
    carry the token into the environment of the docker commands that follow the prompt."""
    token = new_token()
    result = node.run(START, str(node.write_env_file()), stdin=token, **caller)
    assert result.returncode == 0, result.stderr
    assert [call["name"] for call in node.calls()] == ["image-inspect", "compose-up", "compose-ps", "inspect"]
    for call in node.calls():
        assert not [name for name, value in call["env"].items() if token in value], call["name"]
        assert call["env"].get("TOKEN") in (None, "x")
    assert node.leaks(token, result.stdout, result.stderr) == []
