"""`modelforge local up` as a user runs it: a real process, real sockets, real TLS."""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
from functools import partial
from pathlib import Path

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.pki import write_server_pki
from tests.support.polling import wait_until
from tests.support.processes import free_port, local_up_command, run_to_exit, start_local_up


def test_local_up_refuses_offline_not_exceeding_stale_before_serving() -> None:
    env = {
        "MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN,
        "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "60",
    }
    done = run_to_exit(local_up_command(), env)
    assert done.returncode == 2
    assert "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS" in done.stderr
    assert "MODELFORGE_NODE_STALE_AFTER_SECONDS" in done.stderr
    assert "ready" not in done.stdout


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MODELFORGE_HEARTBEAT_INTERVAL_SECONDS", "abc"),
        ("MODELFORGE_NODE_STALE_AFTER_SECONDS", "0"),
        ("MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", "-5"),
        ("MODELFORGE_ADMIN_TOKEN", "short"),
    ],
)
def test_local_up_names_each_invalid_variable_and_exits_2(variable: str, value: str) -> None:
    done = run_to_exit(local_up_command(), {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN, variable: value})
    assert done.returncode == 2
    assert variable in done.stderr


def test_local_up_never_echoes_an_invalid_admin_token() -> None:
    secret_but_short = "Zq8-not-long-enough"
    done = run_to_exit(local_up_command(), {"MODELFORGE_ADMIN_TOKEN": secret_but_short})
    assert done.returncode == 2 and "MODELFORGE_ADMIN_TOKEN" in done.stderr
    assert secret_but_short not in done.stderr + done.stdout


def test_local_up_requires_tls_cert_and_key_together(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    done = run_to_exit(local_up_command("--tls-cert", str(cert)), {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert done.returncode == 2 and "--tls-key" in done.stderr


def test_local_up_exits_non_zero_when_the_port_is_taken() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_to_exit(local_up_command(port=port), {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert done.returncode == 1 and "cannot start" in done.stderr


def test_local_up_generates_and_prints_an_admin_token_once_when_none_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MODELFORGE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("MODELFORGE_ADMIN_TOKEN_SHA256", raising=False)
    with start_local_up(tmp_path / "log") as running:
        output = running.output()
        tokens = re.findall(r"admin token \(generated, shown once\): (\S+)", output)
        assert len(tokens) == 1, output
        cp = ControlPlane(running.api_url, tokens[0])
        assert cp.admin("GET", "/api/v1/admin/nodes").status_code == 200
        assert output.count(tokens[0]) == 1


def test_local_up_serves_https_with_a_private_ca_and_refuses_clients_without_it(tmp_path: Path) -> None:
    cert_file, key_file, ca_file = write_server_pki(tmp_path, "127.0.0.1", "localhost")
    tls = ("--tls-cert", str(cert_file), "--tls-key", str(key_file))
    with start_local_up(tmp_path / "log", *tls, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        assert running.api_url.startswith("https://127.0.0.1:")
        assert requests.get(running.api_url + "/api/v1/health", verify=str(ca_file), timeout=10).status_code == 200
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(running.api_url + "/api/v1/health", timeout=10)
        cp = ControlPlane(running.api_url, ADMIN_TOKEN, verify=str(ca_file))
        identity = cp.enrolled_node()
        assert cp.heartbeat(identity).status_code == 200


def test_local_up_data_dir_keeps_enrollments_and_nodes_across_restarts(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    port = free_port()
    with start_local_up(tmp_path / "first.log", "--data-dir", str(data_dir), env=env, port=port) as first:
        cp = ControlPlane(first.api_url, ADMIN_TOKEN)
        identity = cp.enrolled_node(display_name="survivor")
        assert cp.heartbeat(identity).status_code == 200
        unused = cp.mint(display_name="still pending")
    assert first.returncode == 0
    with start_local_up(tmp_path / "second.log", "--data-dir", str(data_dir), env=env, port=port) as second:
        cp = ControlPlane(second.api_url, ADMIN_TOKEN)
        assert cp.node(identity.node_id)["display_name"] == "survivor"
        assert cp.heartbeat(identity).status_code == 200
        later = AgentIdentity()
        assert cp.enroll(unused["token"], later).status_code == 201
        assert "restored" in second.output()
    assert (data_dir.stat().st_mode & 0o777) == 0o700


def test_local_up_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    running = start_local_up(tmp_path / "log", env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN})
    assert running.stop() == 0
    assert "stopped" in running.output()


def test_api_server_holds_a_hundred_concurrent_connections_without_resets(local_up) -> None:  # type: ignore[no-untyped-def]
    """chalice local's listen queue of 5 resets most of these; ours must answer them all."""
    clients = 100
    barrier = threading.Barrier(clients)
    failures: list[str] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        with requests.Session() as session:
            try:
                barrier.wait(timeout=30)
                for _ in range(3):  # keep-alive: the same connection is reused
                    status = session.get(local_up.api_url + "/api/v1/health", timeout=60).status_code
                    with lock:
                        statuses.append(status)
            except Exception as error:  # noqa: BLE001 - every failure is recorded and asserted on
                with lock:
                    failures.append(type(error).__name__)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert statuses == [200] * clients * 3


SEED_CURL = """curl -s -X POST -H "X-ModelForge-Admin-Token: $KEY" -H "Content-Type: application/json" \\
  -d '{"display_name":"GPU Node","expires_in_seconds":900}' \\
  http://127.0.0.1:8000/api/v1/admin/node-enrollments"""


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_seed_curl_command_mints_a_token_against_local_up(local_up) -> None:  # type: ignore[no-untyped-def]
    command = SEED_CURL.replace("http://127.0.0.1:8000", local_up.api_url)  # same text when on port 8000
    done = run_to_exit(["bash", "-c", command], {"KEY": ADMIN_TOKEN})
    answer = json.loads(done.stdout)
    assert answer["status"] == "pending" and answer["display_name"] == "GPU Node"
    assert answer["token"].startswith("mfe.") and answer["production_eligible"] is False


def _online_cpu_agents(cp: ControlPlane) -> list[dict]:
    return [node for node in cp.all_nodes() if node["status"] == "online" and node["hostname"] == "local-cpu-agent"]


def _finished_work(cp: ControlPlane, work_id: str) -> dict | None:
    item = cp.work(work_id)
    return item if item["status"] not in ("queued", "leased") else None


def test_local_up_with_cpu_agent_runs_an_enrolled_heartbeating_node_that_survives_restarts(tmp_path: Path) -> None:
    """What the README's first quick-start command runs: the stack, the runtime worker and an agent
    that serves the worker's capabilities and runs the work it is given."""
    port, data_dir, agent_state = free_port(), tmp_path / "plane", tmp_path / "agent"
    args = (
        "--data-dir",
        str(data_dir),
        "--with-worker",
        str(tmp_path / "worker"),
        "--with-cpu-agent",
        str(agent_state),
    )
    node_ids = []
    for attempt in range(2):
        env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
        with start_local_up(tmp_path / f"run-{attempt}.log", *args, env=env, port=port) as running:
            cp = ControlPlane(running.api_url, ADMIN_TOKEN)
            online = wait_until(
                partial(_online_cpu_agents, cp), 60, "the CPU agent online", interval=0.2, detail=running.output
            )
            assert len(online) == 1, running.output()
            node_ids.append(online[0]["node_id"])
            assert len(cp.all_nodes()) == 1
            submitted = cp.submit_work("diagnostic.echo", {"attempt": attempt})
            assert submitted.status_code == 201, submitted.text
            done = wait_until(
                partial(_finished_work, cp, submitted.json()["work_id"]),
                60,
                "the echo work done",
                interval=0.3,
                detail=running.output,
            )
            assert done["status"] == "succeeded" and done["node_id"] == node_ids[-1], done
        assert running.returncode == 0
        output = running.output()
        # the agent beside local up writes text a person reads (MODELFORGE_AGENT_LOG_FORMAT=text)
        assert f"agent: enrolled as {node_ids[0]}" in output or attempt == 1, output
        assert re.search(r"agent: heartbeating every 15 s as node_\w+ \(status online\)", output), output
        assert "agent: stopped" in output and "Traceback" not in output
    assert node_ids[0] == node_ids[1]
