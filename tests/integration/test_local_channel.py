"""The push channel of the local stack, end to end on 127.0.0.1: the control plane's own handlers
behind the local channel server, tickets from real enroll and heartbeat answers, and messages the
control plane sends through the management API."""

from __future__ import annotations

from typing import Any

import pytest
from modelforge_local_stack.local_stack import LocalStack
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support.api import AgentIdentity, ControlPlane, cpu_inventory
from tests.support.polling import wait_until


def open_channel(stack: LocalStack, node_id: str, ticket: str | None) -> ClientConnection:
    assert stack.channel is not None
    headers = {"X-ModelForge-Node-Id": node_id}
    if ticket is not None:
        headers["Authorization"] = f"Bearer {ticket}"
    return connect(stack.channel.channel_url, additional_headers=headers, proxy=None, open_timeout=10)


def enrolled(cp: ControlPlane, capabilities: tuple[str, ...] = ("cpu",)) -> tuple[AgentIdentity, dict[str, Any]]:
    """A new node and the channel block of its enroll answer."""
    identity = AgentIdentity()
    inventory = {**cpu_inventory(), "capabilities": list(capabilities)}
    response = cp.enroll(cp.mint()["token"], identity, inventory=inventory)
    assert response.status_code == 201, response.text
    return identity, response.json()["channel"]


def refused_status(stack: LocalStack, node_id: str, ticket: str | None) -> int:
    with pytest.raises(InvalidStatus) as refused:
        open_channel(stack, node_id, ticket)
    return refused.value.response.status_code


def test_local_channel_url_is_the_one_the_enroll_answer_gives(stack: LocalStack, cp: ControlPlane) -> None:
    _, channel = enrolled(cp)
    assert stack.channel is not None
    assert channel["url"] == stack.channel.channel_url
    assert channel["url"].startswith("ws://127.0.0.1:") and channel["url"].endswith("/api/v1/agent/channel")


def test_local_channel_refuses_no_ticket_a_bad_one_and_another_nodes(stack: LocalStack, cp: ControlPlane) -> None:
    first, first_channel = enrolled(cp)
    second, _ = enrolled(cp)
    assert first.node_id and second.node_id
    assert refused_status(stack, first.node_id, None) == 401
    assert refused_status(stack, first.node_id, "mfct_" + "A" * 43) == 401
    assert refused_status(stack, second.node_id, first_channel["ticket"]) == 401
    assert cp.node(first.node_id)["channel"] == "fallback"


def test_local_channel_accepts_a_good_ticket_once_and_the_node_shows_connected(
    stack: LocalStack, cp: ControlPlane
) -> None:
    identity, channel = enrolled(cp)
    assert identity.node_id
    with open_channel(stack, identity.node_id, channel["ticket"]):
        wait_until(lambda: cp.node(str(identity.node_id))["channel"] == "connected", 10, "the node connected")
        assert refused_status(stack, identity.node_id, channel["ticket"]) == 401  # single use
    wait_until(lambda: cp.node(str(identity.node_id))["channel"] == "fallback", 10, "the node disconnected")


def test_local_channel_carries_a_wake_to_a_parked_node_when_work_is_submitted(
    stack: LocalStack, cp: ControlPlane
) -> None:
    identity, channel = enrolled(cp, ("cpu", "diagnostic.echo"))
    assert identity.node_id
    with open_channel(stack, identity.node_id, channel["ticket"]) as connection:
        wait_until(lambda: cp.node(str(identity.node_id))["channel"] == "connected", 10, "the node connected")
        assert cp.heartbeat(identity).status_code == 200  # online
        while cp.claim(identity).status_code == 200:  # what earlier tests left on the shared stack
            pass
        assert cp.claim(identity).status_code == 204  # nothing to claim: the node parks
        submitted = cp.submit_work("diagnostic.echo", {"text": "hi"})
        assert submitted.status_code in (200, 201, 202), submitted.text
        assert connection.recv(timeout=10) == '{"v":1,"type":"wake"}'
        assert cp.claim(identity).status_code == 200


def test_local_channel_revoking_the_credential_closes_the_connection(stack: LocalStack, cp: ControlPlane) -> None:
    identity, channel = enrolled(cp)
    with open_channel(stack, str(identity.node_id), channel["ticket"]) as connection:
        wait_until(lambda: cp.node(str(identity.node_id))["channel"] == "connected", 10, "the node connected")
        revoked = cp.admin("POST", f"/api/v1/admin/nodes/{identity.node_id}/revoke-credential")
        assert revoked.status_code == 200, revoked.text
        with pytest.raises(ConnectionClosed):
            connection.recv(timeout=10)
        assert connection.close_code == 1000
