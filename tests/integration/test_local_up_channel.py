"""`modelforge local up` serving the push channel, as a user runs it: its port and ready output, two
stacks side by side, a port in use, and a channel that comes back after a restart."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import ADMIN_TOKEN
from tests.support.agent_process import agent_env, start_agent
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import RunningProcess, free_port, local_up_command, run_to_exit, start_local_up

CHANNEL_RE = re.compile(r"push channel at (ws://127\.0\.0\.1:(\d+)/api/v1/agent/channel) \(management API (\S+)\)")
ENV = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}


def channel_of(running: RunningProcess) -> tuple[str, int, str]:
    match = CHANNEL_RE.search(running.output())
    assert match is not None, running.output()
    return match.group(1), int(match.group(2)), match.group(3)


def free_pair() -> int:
    """A free API port whose default channel port (+1000) is free too."""
    for _ in range(50):
        port = free_port()
        if port + 1000 <= 65535:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port + 1000)) != 0:
                    return port
    raise AssertionError("no free pair of ports")


def test_local_up_serves_the_channel_on_the_api_port_plus_1000_and_a_second_stack_gets_its_own(
    tmp_path: Path,
) -> None:
    first_port, second_port = free_pair(), free_pair()
    with (
        start_local_up(tmp_path / "first.log", port=first_port, env=ENV) as first,
        start_local_up(tmp_path / "second.log", port=second_port, env=ENV) as second,
    ):
        url, port, management = channel_of(first)
        assert port == first_port + 1000 and management == f"http://127.0.0.1:{port}"
        assert channel_of(second)[1] == second_port + 1000
        identity = AgentIdentity()
        cp = ControlPlane(first.api_url, ADMIN_TOKEN)
        answer = cp.enroll(cp.mint()["token"], identity).json()
        assert answer["channel"]["url"] == url
        assert output_order(first.output())


def output_order(output: str) -> bool:
    """The channel line comes before the ready line (a script that waits for "ready" has both)."""
    return output.index("push channel at") < output.index("control plane ready at")


def test_local_up_exits_1_naming_the_option_when_the_channel_port_is_taken() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        done = run_to_exit(local_up_command("--channel-port", str(taken)), ENV)
    assert done.returncode == 1
    assert f"port {taken} on 127.0.0.1 is already in use" in done.stderr and "--channel-port" in done.stderr


def test_local_up_channel_comes_back_after_a_restart_and_the_node_connects_again(tmp_path: Path) -> None:
    port, channel_port = free_port(), free_port()
    args = ("--data-dir", str(tmp_path / "data"), "--channel-port", str(channel_port))
    identity = AgentIdentity()
    with start_local_up(tmp_path / "before.log", *args, port=port, env=ENV) as before:
        cp = ControlPlane(before.api_url, ADMIN_TOKEN)
        ticket = cp.enroll(cp.mint()["token"], identity).json()["channel"]
        headers = {"Authorization": f"Bearer {ticket['ticket']}", "X-ModelForge-Node-Id": str(identity.node_id)}
        with connect(ticket["url"], additional_headers=headers, proxy=None, open_timeout=10) as channel:
            wait_until(lambda: cp.node(str(identity.node_id))["channel"] == "connected", 10, "connected")
            before.stop()
            with pytest.raises(ConnectionClosed):
                channel.recv(timeout=30)
            assert channel.close_code == 1001  # the stack said it was going away
    with start_local_up(tmp_path / "after.log", *args, port=port, env=ENV) as after:
        cp = ControlPlane(after.api_url, ADMIN_TOKEN)
        assert cp.node(str(identity.node_id))["channel"] == "fallback"  # the disconnect was saved
        answer = cp.heartbeat(identity, push_channel={"state": "connecting", "need_ticket": True})
        assert answer.status_code == 200, answer.text
        renewed = answer.json()["channel"]
        headers["Authorization"] = f"Bearer {renewed['ticket']}"
        with connect(renewed["url"], additional_headers=headers, proxy=None, open_timeout=10):
            wait_until(lambda: cp.node(str(identity.node_id))["channel"] == "connected", 10, "connected again")


def test_a_running_agent_reconnects_its_channel_after_local_up_restarts(tmp_path: Path) -> None:
    """The agent keeps running while the stack stops and starts again on the same ports and data:
    its channel closes (1001), it asks for a new ticket in a heartbeat and connects again."""
    port, channel_port = free_port(), free_port()
    args = ("--data-dir", str(tmp_path / "data"), "--channel-port", str(channel_port))
    before = start_local_up(tmp_path / "before.log", *args, port=port, env=ENV)
    agent = None
    try:
        cp = ControlPlane(before.api_url, ADMIN_TOKEN)
        agent = start_agent(tmp_path / "agent.log", agent_env(before.api_url, cp.mint()["token"], tmp_path / "agent"))
        node_id = wait_until(lambda: enrolled_node(tmp_path / "agent"), 30, "the agent enrolled", detail=agent.output)
        wait_until(lambda: cp.node(node_id)["channel"] == "connected", 30, "connected", detail=agent.output)
        before.stop()
        with start_local_up(tmp_path / "after.log", *args, port=port, env=ENV) as after:
            cp = ControlPlane(after.api_url, ADMIN_TOKEN)
            wait_until(lambda: cp.node(node_id)["channel"] == "connected", 60, "connected again", detail=agent.output)
            assert agent.returncode is None
    finally:
        if agent is not None:
            agent.stop()
        before.stop()


def enrolled_node(state: Path) -> str | None:
    """The node id the agent keeps in its state volume once it has enrolled."""
    identity = state / "identity.json"
    if not identity.is_file():
        return None
    node_id = json.loads(identity.read_text()).get("node_id")
    return str(node_id) if node_id else None
