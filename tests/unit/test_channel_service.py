"""channel: tickets minted inside writes the control plane makes anyway, the connect's checks (a read
first, then one conditional write that uses the ticket up), disconnects, the agent's messages, and
revocation closing the connection; decided against the in-memory stores."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Forbidden, Invalid, NotFound, TooLarge, Unauthenticated
from chalicelib.services import channel, enrollments, nodes
from modelforge_protocol import credentials, schemas

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    Agent,
    AgentIdentity,
    enroll_body,
    enrollment_record,
    heartbeat_body,
    node_record,
    settings_with,
)

CHANNEL = settings_with(
    MODELFORGE_CHANNEL_URL="wss://channel.example.com/live",
    MODELFORGE_CHANNEL_MANAGEMENT_URL="https://channel.example.com/live",
)
CONNECTION = "L0SM9cOFvHcCIhw="


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _headers(node_id: str, ticket: str) -> dict[str, str]:
    return {credentials.NODE_ID_HEADER: node_id, "Authorization": f"Bearer {ticket}"}


def _node_with_ticket(stores: MemoryStores, *, expires_in: float = 200, **values: Any) -> tuple[Agent, str]:
    agent = Agent()
    ticket = channel.mint(NOW - channel.TICKET_SECONDS + expires_in)
    stores.nodes.seed(
        node_record(agent, channel_ticket_sha256=ticket.sha256, channel_ticket_expires_at=ticket.expires_at, **values)
    )
    stores.journal.reset_counts()
    return agent, ticket.secret


def _beat(**push_channel: Any) -> typed.Heartbeat:
    body = heartbeat_body()
    if push_channel:
        body["push_channel"] = push_channel
    return typed.heartbeat(body)


# --- tickets ---------------------------------------------------------------------------------------


def test_mint_ticket_has_the_wire_format_a_300_second_life_and_only_its_hash_kept() -> None:
    ticket = channel.mint(NOW)
    assert re.fullmatch(schemas.CHANNEL_TICKET_PATTERN, ticket.secret)
    assert ticket.expires_at == NOW + 300 and channel.TICKET_SECONDS <= 600
    assert ticket.sha256 == credentials.sha256_hex(ticket.secret)
    assert ticket.secret not in repr(ticket) and ticket.sha256 not in repr(ticket)
    assert channel.mint(NOW).secret != ticket.secret


def test_enroll_with_a_channel_mints_a_ticket_in_the_node_write_and_logs_no_hash(stores: MemoryStores) -> None:
    enrollment, token = enrollment_record()
    stores.enrollments.seed(enrollment)
    enrolled = enrollments.enroll(stores, CHANNEL, typed.enroll(enroll_body(token, AgentIdentity())), NOW)
    assert enrolled.ticket is not None
    stored = stores.nodes.records[enrolled.node.node_id]
    assert stored.channel_ticket_sha256 == enrolled.ticket.sha256
    assert stored.channel_ticket_expires_at == NOW + 300
    assert stores.journal.writes == 1  # the enroll's one transaction, nothing more


def test_enroll_without_a_channel_mints_no_ticket(stores: MemoryStores) -> None:
    enrollment, token = enrollment_record()
    stores.enrollments.seed(enrollment)
    enrolled = enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(token, AgentIdentity())), NOW)
    assert enrolled.ticket is None and stores.nodes.records[enrolled.node.node_id].channel_ticket_sha256 is None


def test_heartbeat_asking_for_a_ticket_gets_one_written_by_its_own_update(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent))
    stores.journal.reset_counts()
    result = nodes.heartbeat(stores, CHANNEL, agent.caller, _beat(state="connecting", need_ticket=True), NOW)
    assert result.ticket is not None
    stored = stores.nodes.records[agent.node_id]
    assert stored.channel_ticket_sha256 == result.ticket.sha256
    assert (stored.channel_state, stored.channel_reason) == ("connecting", None)
    assert stores.journal.writes == 1 and stores.journal.events == []  # one update, not logged


@pytest.mark.parametrize(
    ("settings", "report"),
    [
        (SETTINGS, {"state": "connecting", "need_ticket": True}),  # no channel configured
        (CHANNEL, {"state": "connecting", "need_ticket": False}),  # not asked
        (CHANNEL, {"state": "connected", "need_ticket": True}),  # connected: needs none
        (CHANNEL, {"state": "off", "need_ticket": True}),  # turned off: needs none
        (CHANNEL, {}),  # an agent that reports no channel
    ],
)
def test_heartbeat_mints_no_ticket_unless_asked_with_a_channel(
    stores: MemoryStores, settings: Any, report: dict[str, Any]
) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent))
    result = nodes.heartbeat(stores, settings, agent.caller, _beat(**report), NOW)
    assert result.ticket is None and stores.nodes.records[agent.node_id].channel_ticket_sha256 is None


def test_heartbeat_of_a_revoked_credential_gets_no_ticket(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, credential_state="revoked"))
    with pytest.raises(Unauthenticated):
        nodes.heartbeat(stores, CHANNEL, agent.caller, _beat(state="connecting", need_ticket=True), NOW)
    assert stores.nodes.records[agent.node_id].channel_ticket_sha256 is None


def test_heartbeat_report_stores_the_fallback_reason_in_the_same_update(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent))
    stores.journal.reset_counts()
    nodes.heartbeat(
        stores, CHANNEL, agent.caller, _beat(state="fallback", reason="proxy refused", need_ticket=False), NOW
    )
    stored = stores.nodes.records[agent.node_id]
    assert (stored.channel_state, stored.channel_reason) == (None, "proxy refused")  # the reason says fallback
    assert stores.journal.writes == 1


def test_heartbeat_report_keeps_a_short_reason_and_drops_what_the_connection_shows(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, channel_state="off"))
    long_reason = "the proxy at 10.0.0.1:3128 refused the WebSocket upgrade with 403"
    nodes.heartbeat(stores, CHANNEL, agent.caller, _beat(state="fallback", reason=long_reason, need_ticket=False), NOW)
    stored = stores.nodes.records[agent.node_id]
    assert stored.channel_reason == long_reason[: nodes.STORED_REASON_CHARS] and stored.channel_state is None
    nodes.heartbeat(stores, CHANNEL, agent.caller, _beat(state="connected", need_ticket=False), NOW + 15)
    stored = stores.nodes.records[agent.node_id]
    assert (stored.channel_state, stored.channel_reason) == (None, None)


def test_heartbeat_without_a_report_leaves_the_last_one(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, channel_state="off"))
    nodes.heartbeat(stores, CHANNEL, agent.caller, _beat(), NOW)
    assert stores.nodes.records[agent.node_id].channel_state == "off"


def test_heartbeat_of_a_stale_node_carries_its_ticket_through_the_logged_transition(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, state="stale", last_heartbeat_at=NOW - 100))
    result = nodes.heartbeat(stores, CHANNEL, agent.caller, _beat(state="connecting", need_ticket=True), NOW)
    assert result.ticket is not None and result.transitioned_from == "stale"
    assert stores.nodes.records[agent.node_id].channel_ticket_sha256 == result.ticket.sha256


# --- connect -------------------------------------------------------------------------------------


def test_connect_with_the_node_s_ticket_records_the_connection_and_uses_the_ticket_up(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    assert channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), CONNECTION, NOW) == agent.node_id
    stored = stores.nodes.records[agent.node_id]
    assert (stored.channel_connection_id, stored.channel_connected_at) == (CONNECTION, NOW)
    assert stored.channel_ticket_sha256 is None and stored.channel_ticket_expires_at is None
    assert (stores.journal.reads, stores.journal.writes) == (1, 1)


def test_connect_with_a_used_ticket_is_refused(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), CONNECTION, NOW)
    with pytest.raises(Unauthenticated) as refused:
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), "other=", NOW + 1)
    assert refused.value.code == "channel_ticket_invalid"
    assert stores.nodes.records[agent.node_id].channel_connection_id == CONNECTION


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {credentials.NODE_ID_HEADER: "node_" + "a" * 32},
        {"Authorization": "Bearer mfct_" + "a" * 43},
    ],
)
def test_connect_without_a_ticket_is_refused_before_any_read(stores: MemoryStores, headers: dict[str, str]) -> None:
    with pytest.raises(Unauthenticated) as refused:
        channel.connect(stores, CHANNEL, headers, CONNECTION, NOW)
    assert refused.value.code == "channel_ticket_missing"
    assert (stores.journal.reads, stores.journal.writes) == (0, 0)


@pytest.mark.parametrize(
    "authorization",
    ["Basic mfct_" + "a" * 43, "Bearer mfct_short", "Bearer " + "x" * 48, "Bearer mfcr_" + "a" * 43],
)
def test_connect_with_a_malformed_ticket_is_refused_before_any_read(stores: MemoryStores, authorization: str) -> None:
    agent, _ = _node_with_ticket(stores)
    headers = {credentials.NODE_ID_HEADER: agent.node_id, "Authorization": authorization}
    with pytest.raises(Unauthenticated) as refused:
        channel.connect(stores, CHANNEL, headers, CONNECTION, NOW)
    assert refused.value.code == "channel_ticket_invalid"
    assert (stores.journal.reads, stores.journal.writes) == (0, 0)


def test_connect_with_another_node_s_ticket_is_refused_without_a_write(stores: MemoryStores) -> None:
    agent, _ = _node_with_ticket(stores)
    _, other_ticket = _node_with_ticket(stores)
    with pytest.raises(Unauthenticated) as refused:
        channel.connect(stores, CHANNEL, _headers(agent.node_id, other_ticket), CONNECTION, NOW)
    assert refused.value.code == "channel_ticket_invalid"
    assert stores.journal.writes == 0
    assert stores.nodes.records[agent.node_id].channel_connection_id is None


def test_connect_of_an_unknown_node_is_refused_without_a_write(stores: MemoryStores) -> None:
    _, ticket = _node_with_ticket(stores)
    with pytest.raises(Unauthenticated):
        channel.connect(stores, CHANNEL, _headers("node_" + "b" * 32, ticket), CONNECTION, NOW)
    assert stores.journal.writes == 0


def test_connect_with_an_expired_ticket_is_refused_without_a_write(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores, expires_in=0)
    with pytest.raises(Unauthenticated) as refused:
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), CONNECTION, NOW)
    assert refused.value.code == "channel_ticket_expired"
    assert stores.journal.writes == 0


def test_connect_of_a_revoked_credential_is_forbidden_without_a_write(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores, credential_state="revoked")
    with pytest.raises(Forbidden) as refused:
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), CONNECTION, NOW)
    assert refused.value.code == "credential_revoked"
    assert stores.journal.writes == 0


def test_connect_racing_a_revocation_is_refused(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)

    def revoke() -> None:
        stores.nodes.records[agent.node_id].credential_state = "revoked"

    stores.journal.before_next("nodes.connect_channel", revoke)
    with pytest.raises(Unauthenticated):
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), CONNECTION, NOW)
    assert stores.nodes.records[agent.node_id].channel_connection_id is None


def test_two_connects_with_one_ticket_open_one_connection(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    stores.journal.before_next(
        "nodes.connect_channel",
        lambda: channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), "first=", NOW),
    )
    with pytest.raises(Unauthenticated):
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), "second=", NOW)
    assert stores.nodes.records[agent.node_id].channel_connection_id == "first="


def test_connect_without_a_channel_configured_is_refused(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores)
    with pytest.raises(NotFound) as refused:
        channel.connect(stores, SETTINGS, _headers(agent.node_id, ticket), CONNECTION, NOW)
    assert refused.value.code == "channel_not_configured"


@pytest.mark.parametrize("connection_id", ["", "a b", "x" * 129, "id\n"])
def test_connect_with_an_invalid_connection_id_is_refused(stores: MemoryStores, connection_id: str) -> None:
    agent, ticket = _node_with_ticket(stores)
    with pytest.raises(Invalid):
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), connection_id, NOW)


def test_connect_refusals_never_carry_the_ticket(stores: MemoryStores) -> None:
    agent, ticket = _node_with_ticket(stores, expires_in=0)
    with pytest.raises(Unauthenticated) as refused:
        channel.connect(stores, CHANNEL, _headers(agent.node_id, ticket), CONNECTION, NOW)
    assert ticket not in str(refused.value.body()) and ticket[5:] not in str(refused.value.body())


# --- disconnect, revoke --------------------------------------------------------------------------


def test_disconnect_forgets_the_node_s_connection(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, channel_connection_id=CONNECTION, channel_connected_at=NOW - 10))
    assert channel.disconnect(stores, CONNECTION) == agent.node_id
    stored = stores.nodes.records[agent.node_id]
    assert stored.channel_connection_id is None and stored.channel_connected_at is None


def test_disconnect_of_an_old_connection_keeps_the_newer_one(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, channel_connection_id=CONNECTION))
    stores.journal.before_next(
        "nodes.disconnect_channel",
        lambda: setattr(stores.nodes.records[agent.node_id], "channel_connection_id", "newer="),
    )
    assert channel.disconnect(stores, CONNECTION) is None
    assert stores.nodes.records[agent.node_id].channel_connection_id == "newer="


def test_disconnect_of_an_unknown_connection_writes_nothing(stores: MemoryStores) -> None:
    assert channel.disconnect(stores, CONNECTION) is None
    assert stores.journal.writes == 0


def test_revoke_closes_the_node_s_connection_and_forgets_it(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, channel_connection_id=CONNECTION))
    stores.channel.open(CONNECTION)
    node = nodes.revoke_credential(stores, agent.node_id, NOW)
    assert stores.channel.closed == [CONNECTION] and CONNECTION not in stores.channel.connections
    assert stores.nodes.records[agent.node_id].channel_connection_id is None
    assert node.channel_connection_id is None and node.credential_state == "revoked"


def test_revoke_of_a_node_without_a_channel_closes_nothing(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent))
    nodes.revoke_credential(stores, agent.node_id, NOW)
    assert stores.channel.closed == []


# --- messages ------------------------------------------------------------------------------------


def test_read_message_accepts_a_ping() -> None:
    assert channel.read_message('{"v": 1, "type": "ping"}') == {"v": 1, "type": "ping"}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('{"v": 2, "type": "ping"}', "message_version_unsupported"),
        ('{"v": true, "type": "ping"}', "message_version_unsupported"),
        ('{"type": "ping"}', "message_version_unsupported"),
        ('{"v": 1, "type": "wake"}', "message_type_unsupported"),
        ('{"v": 1}', "message_type_unsupported"),
        ("[1]", "message_invalid"),
        ("not json", "message_invalid"),
        ('{"v": 1, "type": "ping", "x": NaN}', "message_invalid"),
        ("", "message_invalid"),
        (None, "message_invalid"),
    ],
)
def test_read_message_refuses_anything_but_a_version_1_ping(body: str | None, code: str) -> None:
    with pytest.raises(Invalid) as refused:
        channel.read_message(body)
    assert refused.value.code == code


def test_read_message_refuses_a_message_over_1_kib() -> None:
    with pytest.raises(TooLarge):
        channel.read_message('{"v": 1, "type": "ping", "pad": "' + "x" * 1024 + '"}')


def test_ticket_is_not_in_a_node_record_repr() -> None:
    ticket = channel.mint(NOW)
    node = dataclasses.replace(node_record(), channel_ticket_sha256=ticket.sha256)
    assert ticket.sha256 not in repr(node)
