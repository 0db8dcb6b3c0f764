"""What ./scripts/dev-up relies on, against real `modelforge local up` processes: the admin token
kept in a file across restarts, the CPU agent watched (why it exited, and the one command that
enrolls it again), and `modelforge log replay` against a running or a stopped data dir."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from modelforge_local_stack import provision
from modelforge_local_stack.replay import TABLE_ENV
from modelforge_node_agent.identity import StateVolume, new_identity

from tests.conftest import ADMIN_TOKEN
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import cli_command, free_port, run_to_exit, start_local_up
from tests.support.snapshots import scan_table, state_log_objects

TOKEN_LINE = re.compile(r"admin token (generated and kept|kept) in (\S+) .*KEY=\$\(cat (\S+)\)")


def _no_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODELFORGE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("MODELFORGE_ADMIN_TOKEN_SHA256", raising=False)


def test_the_admin_token_file_keeps_one_token_across_restarts_and_the_variable_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_admin_token(monkeypatch)
    token_file = tmp_path / ".modelforge" / "admin-token"
    args = ("--admin-token-file", str(token_file))
    with start_local_up(tmp_path / "first.log", *args) as first:
        line = TOKEN_LINE.search(first.output())
        assert line is not None and line.group(1) == "generated and kept", first.output()
        assert line.group(2) == str(token_file)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token not in first.output()  # said where it is, never printed
        assert ControlPlane(first.api_url, token).admin("GET", "/api/v1/admin/nodes").status_code == 200
    with start_local_up(tmp_path / "second.log", *args) as second:
        line = TOKEN_LINE.search(second.output())
        assert line is not None and line.group(1) == "kept", second.output()
        assert token_file.read_text().strip() == token
        assert ControlPlane(second.api_url, token).admin("GET", "/api/v1/admin/nodes").status_code == 200
    with start_local_up(tmp_path / "third.log", *args, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as third:
        assert f"admin token from MODELFORGE_ADMIN_TOKEN ({token_file} is not used)" in third.output()
        assert ControlPlane(third.api_url, ADMIN_TOKEN).admin("GET", "/api/v1/admin/nodes").status_code == 200
        assert ControlPlane(third.api_url, token).admin("GET", "/api/v1/admin/nodes").status_code == 403
    assert token_file.read_text().strip() == token


def test_an_admin_token_file_others_can_read_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_admin_token(monkeypatch)
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    token_file.chmod(0o644)
    done = run_to_exit(cli_command("local", "up", "--port", str(free_port()), "--admin-token-file", str(token_file)))
    assert done.returncode == 2
    assert f"chmod 600 {token_file}" in done.stderr and ADMIN_TOKEN not in done.stderr + done.stdout


def _stale_identity(state_dir: Path, api_url: str) -> str:
    """An agent identity for ``api_url`` whose node that control plane has never seen: what the
    agent holds after the control plane's data dir was deleted."""
    volume = StateVolume(state_dir)
    volume.prepare()
    identity = new_identity(api_url)
    volume.save(identity)
    node_id = f"node_{uuid.uuid4().hex}"
    volume.enrolled_as(identity, node_id)
    return node_id


def test_local_up_says_why_its_agent_exited_4_after_a_reset_and_enrolls_it_again_after_the_offered_command(
    tmp_path: Path,
) -> None:
    port, agent_state = free_port(), tmp_path / "agent-state"
    lost_node = _stale_identity(agent_state, f"http://127.0.0.1:{port}")
    args = ("--data-dir", str(tmp_path / "fresh"), "--with-cpu-agent", str(agent_state))
    with start_local_up(tmp_path / "run.log", *args, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}, port=port) as running:
        running.wait_for(r"exited with status 4: its identity or credential was refused", timeout=60)
        offered = running.wait_for(r"To enroll it again as a new node, run:  (mv \S+ \S+)\n", timeout=10)
        output = running.output()
        assert f"This control plane does not know node {lost_node}: its data was reset" in output, output
        # the agent's own last line says the same in words (text log, and credential_invalid's next step)
        assert "agent: the control plane does not know this node's credential" in output, output
        subprocess.run(offered.group(1), shell=True, check=True, cwd=tmp_path)
        running.wait_for(r"CPU node agent enrolling again with a new token", timeout=10)
        enrolled = running.wait_for(r"agent: enrolled as (node_\w+)", timeout=60).group(1)
        running.wait_for(r"agent: heartbeating every 15 s", timeout=30)
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)
        assert cp.node(enrolled)["status"] == "online" and enrolled != lost_node
        assert (agent_state / "identity.json.old").is_file()
    assert running.returncode == 0
    assert "Traceback" not in running.output()


def _replay(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_to_exit(cli_command("log", "replay", *args), env, timeout=120)


def test_log_replay_rebuilds_new_tables_in_a_running_and_in_a_stopped_data_dir(tmp_path: Path) -> None:
    data_dir, env = tmp_path / "state", {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    names = provision.resource_names("modelforge")
    live = provision.resource_names("live")
    with start_local_up(tmp_path / "first.log", "--data-dir", str(data_dir), env=env) as running:
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)
        node = cp.enrolled_node(display_name="replayed")
        assert cp.heartbeat(node).status_code == 200
        cp.mint(display_name="pending")
        outbox = scan_table(running.emulator_url, names["MODELFORGE_OUTBOX_TABLE"])
        bucket = names["MODELFORGE_STATE_LOG_BUCKET"]
        wait_until(
            lambda: len(state_log_objects(running.emulator_url, bucket)) == len(outbox), 30, "the state log shipped"
        )
        done = _replay("--data-dir", str(data_dir), "--table-prefix", "live")
        assert done.returncode == 0, done.stderr
        assert (
            done.stdout.startswith(f"replayed {len(outbox)} events (") and "in the running local stack" in done.stdout
        )
        assert (
            f"pid {running.process.pid}" in done.stdout and "created the empty tables live-enrollments" in done.stdout
        )
        rebuilt = scan_table(running.emulator_url, live["MODELFORGE_NODES_TABLE"])
        assert [item["display_name"]["S"] for item in rebuilt] == ["replayed"]
        again = _replay("--data-dir", str(data_dir), "--table-prefix", "live")
        assert again.returncode == 1 and "is not empty" in again.stderr and len(again.stderr.splitlines()) == 1
    stopped = _replay("--data-dir", str(data_dir), "--table-prefix", "offline")
    assert stopped.returncode == 0, stopped.stderr
    assert f"replayed {len(outbox)} events" in stopped.stdout and "in the stopped local stack" in stopped.stdout
    with start_local_up(tmp_path / "second.log", "--data-dir", str(data_dir), env=env) as restarted:
        offline = provision.resource_names("offline")
        for logical, variable in TABLE_ENV.items():  # both rebuilds were kept by the data dir
            assert scan_table(restarted.emulator_url, offline[variable]) == scan_table(
                restarted.emulator_url, live[variable]
            ), logical
        assert "Traceback" not in restarted.output()


def _bare_environment(tmp_path: Path) -> dict[str, str]:
    """No AWS region, credentials or endpoint anywhere (not even ~/.aws)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update(
        HOME=str(tmp_path), AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none")
    )
    return env


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            (),
            {},
            "no AWS region: set AWS_DEFAULT_REGION"
            " (for the local stack, name its data dir with --data-dir D, or --local)",
        ),
        (
            ("--endpoint-url", "https://dynamodb.example.invalid"),
            {"AWS_DEFAULT_REGION": "eu-west-1"},
            "no AWS credentials",
        ),
        (("--endpoint-url", "http://127.0.0.1:9"), {}, "cannot reach http://127.0.0.1:9: is it running?"),
        (("--data-dir", "/nonexistent/state"), {}, "there is no local stack data in /nonexistent/state"),
    ],
    ids=["no-flags", "no-credentials", "nothing-listening", "no-data-dir"],
)
def test_log_replay_errors_are_one_line_never_a_traceback(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    done = run_to_exit(cli_command("log", "replay", *args), env, base_env=_bare_environment(tmp_path), timeout=120)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert expected in done.stderr, done.stderr


def test_log_replay_of_a_data_dir_that_is_not_one_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "not-a-data-dir"
    folder.mkdir()
    done = _replay("--data-dir", str(folder))
    assert done.returncode == 1 and "holds no saved state" in done.stderr
    assert list(folder.iterdir()) == []


def test_the_lock_file_of_a_running_stack_names_its_pid_and_urls(tmp_path: Path) -> None:
    with start_local_up(
        tmp_path / "run.log", "--data-dir", str(tmp_path / "d"), env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    ) as running:
        holder = json.loads((tmp_path / "d" / "local-up.lock").read_text())
        assert holder == {"pid": running.process.pid, "api_url": running.api_url, "emulator_url": running.emulator_url}


def test_simulated_gpus_runs_the_local_agent_as_a_simulated_gpu_node_beside_the_cpu_identity(tmp_path: Path) -> None:
    agent_state = tmp_path / "agent-state"
    args = ("--data-dir", str(tmp_path / "data"), "--with-cpu-agent", str(agent_state), "--simulated-gpus", "4")
    with start_local_up(tmp_path / "run.log", *args, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        running.wait_for(r"simulated nodes accepted", timeout=30)
        scenario = tmp_path / "simulated-4-gpus.json"
        running.wait_for(r"simulated 4-GPU node agent started .*" + re.escape(str(scenario)), timeout=30)
        enrolled = running.wait_for(r"agent: enrolled as (node_\w+)", timeout=60).group(1)
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)
        node = cp.node(enrolled)
        assert node["simulated"] is True and node["accelerator_mode"] == "nvidia"
        assert node["display_name"] == "local simulated GPU node"
        assert len(node["inventory"]["gpus"]) == 4
        assert (tmp_path / "agent-state-simulated-4-gpus" / "identity.json").is_file()
        assert not (agent_state / "identity.json").exists()  # the CPU node's folder is left alone
        assert json.loads(scenario.read_text())["gpus"][0]["uuid"] == node["inventory"]["gpus"][0]["uuid"]
    assert running.returncode == 0


def test_simulated_gpus_without_the_local_agent_is_refused() -> None:
    done = run_to_exit(cli_command("local", "up", "--simulated-gpus", "8"), None, timeout=60)
    assert done.returncode == 2 and "--simulated-gpus runs the --with-cpu-agent agent" in done.stderr
