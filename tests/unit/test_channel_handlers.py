"""The push channel's Chalice WebSocket handlers (functions/app.py: channel_connect, channel_message,
channel_disconnect) answer API Gateway-shaped events as Lambda would get them, over the in-memory
stores; and the agent answers carry ``features`` and the ``channel`` block.

The events have the fields API Gateway's WebSocket API sends a Lambda proxy integration:
``requestContext`` (``routeKey``, ``eventType``, ``connectionId``, ``apiId``, ``stage``,
``domainName``), ``headers`` on ``$connect``, ``body`` on messages. A ``$connect`` answer with a
``statusCode`` other than 200 refuses the handshake with that status.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from chalicelib import instance
from chalicelib.services import channel
from modelforge_local_stack.http_server import load_app
from modelforge_protocol import credentials

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import SETTINGS, Agent, node_record, settings_with

app_module = load_app()
API_ID = "a1b2c3d4e5"
CONNECTION = "L0SM9cOFvHcCIhw="
CHANNEL = settings_with(
    MODELFORGE_CHANNEL_URL="wss://channel.example.com/live",
    MODELFORGE_CHANNEL_MANAGEMENT_URL="https://channel.example.com/live",
)


@pytest.fixture()
def stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryStores]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    stores = memory_stores()
    monkeypatch.setattr(instance, "_instance", instance.Instance(settings=CHANNEL, stores=stores))
    yield stores


def ws_event(
    route: str, connection_id: str = CONNECTION, *, headers: dict[str, str] | None = None, body: str | None = None
) -> dict[str, Any]:
    event_type = {"$connect": "CONNECT", "$disconnect": "DISCONNECT"}.get(route, "MESSAGE")
    event: dict[str, Any] = {
        "requestContext": {
            "routeKey": route,
            "eventType": event_type,
            "connectionId": connection_id,
            "apiId": API_ID,
            "stage": "api",
            "domainName": f"{API_ID}.execute-api.us-east-1.amazonaws.com",
            "requestId": "req-1",
            "connectedAt": 1_700_000_000_000,
            "requestTimeEpoch": 1_700_000_000_000,
        },
        "isBase64Encoded": False,
    }
    if headers is not None:
        event["headers"] = {"Host": f"{API_ID}.execute-api.us-east-1.amazonaws.com", **headers}
    if body is not None:
        event["body"] = body
    return event


def _node_with_ticket(stores: MemoryStores, *, expires_in: float = 200, **values: Any) -> tuple[Agent, str]:
    import time

    agent = Agent()
    ticket = channel.mint(time.time() - channel.TICKET_SECONDS + expires_in)
    stores.nodes.seed(
        node_record(agent, channel_ticket_sha256=ticket.sha256, channel_ticket_expires_at=ticket.expires_at, **values)
    )
    return agent, ticket.secret


def _connect(node_id: str | None, ticket: str | None, connection_id: str = CONNECTION) -> dict[str, Any]:
    headers = {}
    if node_id is not None:
        headers[credentials.NODE_ID_HEADER] = node_id
    if ticket is not None:
        headers["Authorization"] = f"Bearer {ticket}"
    answer: dict[str, Any] = app_module.channel_connect(ws_event("$connect", connection_id, headers=headers), None)
    return answer


def _code(answer: dict[str, Any]) -> str:
    return str(json.loads(answer["body"])["error"]["code"])


def test_handlers_are_registered_under_their_names_for_the_three_routes() -> None:
    handlers = app_module.app.websocket_handlers
    assert {route: entry.name for route, entry in handlers.items()} == {
        "$connect": "channel_connect",
        "$default": "channel_message",
        "$disconnect": "channel_disconnect",
    }
    assert "WEBSOCKETS" in app_module.app.experimental_feature_flags


def test_connect_with_the_node_s_ticket_is_accepted_and_recorded(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    assert _connect(agent.node_id, ticket) == {"statusCode": 200}
    assert stores.nodes.records[agent.node_id].channel_connection_id == CONNECTION


def test_connect_reusing_a_used_ticket_is_refused(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    assert _connect(agent.node_id, ticket)["statusCode"] == 200
    answer = _connect(agent.node_id, ticket, "another=")
    assert (answer["statusCode"], _code(answer)) == (401, "channel_ticket_invalid")


def test_connect_without_a_ticket_is_refused_with_401(stores: MemoryStores) -> None:
    agent, _ = _node_with_ticket(stores)
    answer = _connect(agent.node_id, None)
    assert (answer["statusCode"], _code(answer)) == (401, "channel_ticket_missing")
    assert stores.journal.writes == 0


def test_connect_with_another_node_s_ticket_is_refused_with_401(stores: MemoryStores) -> None:
    agent, _ = _node_with_ticket(stores)
    _, other = _node_with_ticket(stores)
    answer = _connect(agent.node_id, other)
    assert (answer["statusCode"], _code(answer)) == (401, "channel_ticket_invalid")
    assert stores.journal.writes == 0


def test_connect_with_an_expired_ticket_is_refused_with_401(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores, expires_in=-1)
    answer = _connect(agent.node_id, ticket)
    assert (answer["statusCode"], _code(answer)) == (401, "channel_ticket_expired")


def test_connect_of_a_revoked_credential_is_refused_with_403(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores, credential_state="revoked")
    answer = _connect(agent.node_id, ticket)
    assert (answer["statusCode"], _code(answer)) == (403, "credential_revoked")


def test_connect_without_a_channel_configured_is_refused(stores: MemoryStores, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instance, "_instance", instance.Instance(settings=SETTINGS, stores=stores))
    agent, ticket = _node_with_ticket(stores)
    answer = _connect(agent.node_id, ticket)
    assert (answer["statusCode"], _code(answer)) == (404, "channel_not_configured")


def test_handlers_never_log_the_ticket(stores: MemoryStores, caplog: pytest.LogCaptureFixture) -> None:
    agent, ticket = _node_with_ticket(stores, expires_in=-1)
    caplog.set_level(logging.DEBUG)
    _connect(agent.node_id, ticket)
    _, good = _node_with_ticket(stores)
    _connect(agent.node_id, good)
    logged = "\n".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    assert ticket not in logged and good not in logged and ticket[5:] not in logged
    assert "channel_connected_refused" in logged


def test_message_ping_is_accepted(stores: MemoryStores) -> None:
    answer = app_module.channel_message(ws_event("$default", body='{"v": 1, "type": "ping"}'), None)
    assert answer == {"statusCode": 200}


def test_message_of_another_type_is_refused_with_a_log_line(
    stores: MemoryStores, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    answer = app_module.channel_message(ws_event("$default", body='{"v": 1, "type": "claim"}'), None)
    assert (answer["statusCode"], _code(answer)) == (400, "message_type_unsupported")
    assert [record.__dict__.get("code") for record in caplog.records] == ["message_type_unsupported"]
    assert stores.journal.writes == 0


def test_disconnect_clears_the_node_s_connection(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    _connect(agent.node_id, ticket)
    assert app_module.channel_disconnect(ws_event("$disconnect"), None) == {"statusCode": 200}
    assert stores.nodes.records[agent.node_id].channel_connection_id is None


def test_disconnect_of_an_unknown_connection_is_answered_200(stores: MemoryStores) -> None:
    assert app_module.channel_disconnect(ws_event("$disconnect", "unknown="), None) == {"statusCode": 200}


# --- the agent answers: features and the channel block -------------------------------------------


def _heartbeat(agent: Agent, **body: Any) -> tuple[int, Any]:
    from tests.unit.service_bodies import heartbeat_body
    from tests.unit.test_http_api_events import http_api_event, invoke

    headers = {credentials.NODE_ID_HEADER: agent.node_id, "Authorization": f"Bearer {agent.credential}"}
    event = http_api_event(
        "POST", "/api/v1/agent/heartbeat", headers=headers, body=json.dumps(heartbeat_body(**body)).encode()
    )
    status, _, answer = invoke(event)
    return status, answer


def test_heartbeat_answer_advertises_push_channel_and_carries_a_ticket_when_asked(stores: MemoryStores) -> None:
    import time

    agent = Agent()
    stores.nodes.seed(node_record(agent, last_heartbeat_at=time.time() - 5))
    status, answer = _heartbeat(agent, push_channel={"state": "connecting", "need_ticket": True})
    assert status == 200
    assert answer["features"] == ["node_fault", "slots", "gpu_health", "agent_instance", "push_channel"]
    block = answer["channel"]
    assert block["url"] == "wss://channel.example.com/live" and block["expires_at"].endswith("Z")
    assert credentials.sha256_hex(block["ticket"]) == stores.nodes.records[agent.node_id].channel_ticket_sha256
    status, answer = _heartbeat(agent, push_channel={"state": "connected", "need_ticket": False})
    assert (
        status == 200
        and "channel" not in answer
        and answer["features"] == ["node_fault", "slots", "gpu_health", "agent_instance", "push_channel"]
    )


def test_heartbeat_answer_without_a_channel_advertises_no_push_channel(
    stores: MemoryStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.setattr(instance, "_instance", instance.Instance(settings=SETTINGS, stores=stores))
    agent = Agent()
    stores.nodes.seed(node_record(agent, last_heartbeat_at=time.time() - 5))
    status, answer = _heartbeat(agent)
    assert status == 200 and "channel" not in answer
    # what the control plane accepts does not depend on the channel: an agent without one still
    # reports slots and GPU health, and marks a busy worker as a node fault
    assert answer["features"] == ["node_fault", "slots", "gpu_health", "agent_instance"]
