"""The node agent as operators run it: real `modelforge local up` and agent processes, real
sockets, real TLS with a test CA (trustme)."""

from __future__ import annotations

import json
import re
import signal
import ssl
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tests.agent.fake_control_plane import TOKEN, FakeServer, fake_server, json_reply
from tests.conftest import ADMIN_TOKEN
from tests.support.agent_process import agent_env, start_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import RunningProcess, free_port, start_local_up

UNRESOLVABLE_NAME = "cp.modelforge.test"  # .test never resolves (RFC 2606)


@dataclass
class Pki:
    ca_file: Path
    other_ca_file: Path
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost", UNRESOLVABLE_NAME)
    paths = Pki(folder / "ca.pem", folder / "other-ca.pem", folder / "cert.pem", folder / "key.pem")
    ca.cert_pem.write_to_path(str(paths.ca_file))
    other.cert_pem.write_to_path(str(paths.other_ca_file))
    cert.private_key_and_cert_chain_pem.write_to_path(str(paths.cert_file))
    cert.private_key_pem.write_to_path(str(paths.key_file))
    return paths


@pytest.fixture(scope="module")
def tls_plane(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log = tmp_path_factory.mktemp("tls-plane") / "local-up.log"
    tls = ("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file))
    with start_local_up(log, *tls, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        yield running


def nodes_of(cp: ControlPlane, enrollment_id: str) -> list[dict]:
    return [node for node in cp.all_nodes() if node["enrollment_id"] == enrollment_id]


def test_cpu_agent_enrolls_over_tls_is_online_and_keeps_its_identity_across_restarts(
    tls_plane: RunningProcess, pki: Pki, tmp_path: Path
) -> None:
    cp = ControlPlane(tls_plane.api_url, ADMIN_TOKEN, verify=str(pki.ca_file))
    minted = cp.mint(display_name="tls cpu node")
    env = agent_env(
        tls_plane.api_url, minted["token"], tmp_path / "state", MODELFORGE_AGENT_CA_CERT_PATH=str(pki.ca_file)
    )
    first = start_agent(tmp_path / "agent.log", env)
    try:
        node_id = first.wait_for(r'"event": "enrolled".*?"node_id": "(node_\w+)"').group(1)
        node = wait_until(lambda: (n := cp.node(node_id))["status"] == "online" and n, timeout=60, what="node online")
        assert node["inventory"]["capabilities"] == ["cpu"] and node["inventory"]["gpus"] == []
        assert node["accelerator_mode"] == "cpu" and node["hostname"] == "gpu_node"
    finally:  # stopped whatever happened; its exit status is checked after, so a failure above shows
        started = time.monotonic()
        first_exit = first.stop()
        stop_seconds = time.monotonic() - started
    assert first_exit == 0
    assert stop_seconds < 3, "SIGTERM must stop the agent within 2 s"
    second = start_agent(tmp_path / "agent.log", env)
    try:
        second.wait_for("enrollment token is ignored and can be removed")
        second.wait_for(r'"event": "inventory_published"')
    finally:
        second_exit = second.stop()
    assert second_exit == 0
    assert [node["node_id"] for node in nodes_of(cp, minted["enrollment_id"])] == [node_id]
    assert minted["token"] not in first.output() + second.output()


def test_agent_exits_4_when_its_credential_is_revoked(tls_plane: RunningProcess, pki: Pki, tmp_path: Path) -> None:
    cp = ControlPlane(tls_plane.api_url, ADMIN_TOKEN, verify=str(pki.ca_file))
    minted = cp.mint(display_name="to be revoked")
    agent = start_agent(
        tmp_path / "agent.log",
        agent_env(
            tls_plane.api_url, minted["token"], tmp_path / "state", MODELFORGE_AGENT_CA_CERT_PATH=str(pki.ca_file)
        ),
    )
    try:
        node_id = agent.wait_for(r'"event": "enrolled".*?"node_id": "(node_\w+)"').group(1)
        assert cp.admin("POST", f"/api/v1/admin/nodes/{node_id}/revoke-credential").status_code == 200
        assert agent.wait_exit(timeout=30) == 4
    finally:
        agent.stop()
    assert "credential_revoked" in agent.output() and "enrolled again" in agent.output()


def test_agent_with_the_wrong_ca_reports_a_tls_error_and_never_falls_back(
    tls_plane: RunningProcess, pki: Pki, tmp_path: Path
) -> None:
    cp = ControlPlane(tls_plane.api_url, ADMIN_TOKEN, verify=str(pki.ca_file))
    minted = cp.mint(display_name="wrong ca")
    agent = start_agent(
        tmp_path / "agent.log",
        agent_env(
            tls_plane.api_url, minted["token"], tmp_path / "state", MODELFORGE_AGENT_CA_CERT_PATH=str(pki.other_ca_file)
        ),
    )
    try:
        agent.wait_for(r"TLSError on POST /api/v1/agent/enroll \(backoff 2s…16s\): certificate verify failed")
    finally:
        exit_status = agent.stop()
    assert exit_status == 0
    assert nodes_of(cp, minted["enrollment_id"]) == []
    enrollment = cp.admin("GET", f"/api/v1/admin/node-enrollments/{minted['enrollment_id']}").json()
    assert enrollment["status"] == "pending"


def test_host_address_override_connects_to_the_address_and_verifies_the_url_name(
    tls_plane: RunningProcess, pki: Pki, tmp_path: Path
) -> None:
    port = tls_plane.api_url.rsplit(":", 1)[1]
    cp = ControlPlane(tls_plane.api_url, ADMIN_TOKEN, verify=str(pki.ca_file))
    minted = cp.mint(display_name="host address override")
    env = agent_env(
        f"https://{UNRESOLVABLE_NAME}:{port}",
        minted["token"],
        tmp_path / "state",
        MODELFORGE_AGENT_CA_CERT_PATH=str(pki.ca_file),
        MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS="127.0.0.1",
    )
    agent = start_agent(tmp_path / "agent.log", env)
    try:
        node_id = agent.wait_for(r'"event": "enrolled".*?"node_id": "(node_\w+)"').group(1)
        wait_until(lambda: cp.node(node_id)["status"] == "online", timeout=60, what="node online")
    finally:
        exit_status = agent.stop()
    assert exit_status == 0


def test_agent_backs_off_while_the_control_plane_is_down_and_resumes_when_it_returns(tmp_path: Path) -> None:
    port, data_dir = free_port(), tmp_path / "plane-state"
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    plane = start_local_up(tmp_path / "plane-1.log", "--data-dir", str(data_dir), env=env, port=port)
    cp = ControlPlane(plane.api_url, ADMIN_TOKEN)
    minted = cp.mint(display_name="outage")
    agent = start_agent(tmp_path / "agent.log", agent_env(plane.api_url, minted["token"], tmp_path / "state"))
    try:
        node_id = agent.wait_for(r'"event": "enrolled".*?"node_id": "(node_\w+)"').group(1)
        wait_until(lambda: cp.node(node_id)["status"] == "online", timeout=60, what="node online")
        assert plane.stop() == 0
        for step in ("1s", "2s", "4s"):
            agent.wait_for(rf"ConnectError on POST /api/v1/agent/heartbeat \(backoff {step}…16s\)", timeout=30)
        plane = start_local_up(tmp_path / "plane-2.log", "--data-dir", str(data_dir), env=env, port=port)
        agent.wait_for(r'"event": "publish_recovered"', timeout=40)
        before = ControlPlane(plane.api_url, ADMIN_TOKEN).node(node_id)["last_heartbeat_at"]
        wait_until(
            lambda: ControlPlane(plane.api_url, ADMIN_TOKEN).node(node_id)["last_heartbeat_at"] != before,
            timeout=60,
            what="heartbeat advancing",
        )
    finally:
        agent.stop()
        plane.stop()
    credential = json.loads((tmp_path / "state" / "identity.json").read_text())["credential"]
    assert credential not in agent.output()


# --- the host-address override checks the URL's name, not the address it connects to --------------


def _tls_server(ca: trustme.CA, name: str) -> FakeServer:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(context)
    return FakeServer(tls=context)


def _override_env(server: FakeServer, ca_file: Path, state: Path) -> dict[str, str]:
    port = server.url.rsplit(":", 1)[1]
    return agent_env(
        f"https://{UNRESOLVABLE_NAME}:{port}",
        TOKEN,
        state,
        MODELFORGE_AGENT_CA_CERT_PATH=str(ca_file),
        MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS="127.0.0.1",
    )


def _ca_file(ca: trustme.CA, folder: Path) -> Path:
    path = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def test_host_address_override_with_a_certificate_for_the_url_name_only_enrolls(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = _tls_server(ca, UNRESOLVABLE_NAME)  # does not name 127.0.0.1, where the agent connects
    agent = start_agent(tmp_path / "agent.log", _override_env(server, _ca_file(ca, tmp_path), tmp_path / "state"))
    try:
        agent.wait_for(r'"event": "enrolled"')
    finally:
        exit_status = agent.stop()
        server.close()
    assert exit_status == 0
    assert server.seen[0].path == "/api/v1/agent/enroll" and server.seen[0].headers["Host"].startswith(
        UNRESOLVABLE_NAME
    )


def test_host_address_override_with_a_certificate_for_the_address_only_is_a_tls_hostname_error(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = _tls_server(ca, "127.0.0.1")  # names the address, not the URL's name: must not be trusted
    agent = start_agent(tmp_path / "agent.log", _override_env(server, _ca_file(ca, tmp_path), tmp_path / "state"))
    try:
        agent.wait_for(
            r"TLSError on POST /api/v1/agent/enroll \(backoff 1s…16s\): certificate does not match the host name"
        )
    finally:
        exit_status = agent.stop()
        server.close()
    assert exit_status == 0
    assert server.seen == [] and not re.search(r'"event": "enrolled"', agent.output())


# --- exit statuses as a process sees them ------------------------------------------------------


def test_agent_refused_for_its_protocol_exits_5_naming_the_verdict(tmp_path: Path) -> None:
    refusal = {"code": "protocol_incompatible", "verdict": "TOO_OLD", "next_step": "Upgrade the node agent."}
    with fake_server({"/api/v1/agent/enroll": json_reply(400, {"error": refusal})}) as plane:
        agent = start_agent(tmp_path / "agent.log", agent_env(plane.url, TOKEN, tmp_path / "state"))
        try:
            exit_status = agent.wait_exit(timeout=30)
        finally:
            agent.stop()
    assert exit_status == 5
    assert re.search(r'"event": "agent_exit".*"exit_code": 5', agent.output())
    assert "TOO_OLD. Upgrade the node agent." in agent.output()


def test_agent_given_a_refusal_it_does_not_know_exits_1(tmp_path: Path) -> None:
    with fake_server({"/api/v1/agent/enroll": json_reply(404, {"error": {"code": "not_found"}})}) as plane:
        agent = start_agent(tmp_path / "agent.log", agent_env(plane.url, TOKEN, tmp_path / "state"))
        try:
            exit_status = agent.wait_exit(timeout=30)
        finally:
            agent.stop()
    assert exit_status == 1
    assert "HTTP 404 not_found on POST /api/v1/agent/enroll" in agent.output()


#: The real entry point, with the inventory builder made to crash: an error nobody foresaw.
CRASHING_AGENT = (
    "import sys\n"
    "import modelforge_node_agent.agent as agent\n"
    "def crash(*_): raise ZeroDivisionError('inventory crashed')\n"
    "agent.host_inventory = crash\n"
    "from modelforge_node_agent.main import main\n"
    "sys.exit(main())\n"
)


def test_agent_that_crashes_exits_1_and_logs_the_traceback(tmp_path: Path) -> None:
    with fake_server() as plane:
        env = agent_env(plane.url, TOKEN, tmp_path / "state")
        agent = start_agent(tmp_path / "agent.log", env, [sys.executable, "-c", CRASHING_AGENT])
        try:
            exit_status = agent.wait_exit(timeout=30)
        finally:
            agent.stop()
    assert exit_status == 1
    assert '"event": "agent_crashed"' in agent.output() and "ZeroDivisionError: inventory crashed" in agent.output()
    assert plane.seen == []


def test_agent_stops_cleanly_with_exit_0_on_sigint(tmp_path: Path) -> None:
    with fake_server() as plane:
        agent = start_agent(tmp_path / "agent.log", agent_env(plane.url, TOKEN, tmp_path / "state"))
        try:
            wait_until(lambda: plane.paths().count("/api/v1/agent/heartbeat") >= 2, timeout=30, what="two heartbeats")
        finally:
            started = time.monotonic()
            exit_status = agent.stop(signal.SIGINT)
            stop_seconds = time.monotonic() - started
    assert exit_status == 0 and stop_seconds < 3, f"exit {exit_status} after {stop_seconds:.1f} s:\n{agent.output()}"
    assert '"event": "agent_stopped"' in agent.output() and "Traceback" not in agent.output()
