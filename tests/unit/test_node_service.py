"""nodes: heartbeats, inventory replacement and credential revocation, decided against the
in-memory stores (each store guard as DynamoDB checks it)."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.config.settings import INVENTORY_RATE_WINDOW_SECONDS
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Conflict, Invalid, NotFound, RateLimited, Unauthenticated
from chalicelib.domain.records import ONLINE_NODES, TELEMETRY_COLUMNS, ControlItem, Event
from chalicelib.services import nodes
from chalicelib.services.known_callers import KnownCallers

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    Agent,
    gpu_inventory,
    gpu_telemetry,
    gpu_uuid,
    heartbeat_body,
    inventory_body,
    inventory_of,
    inventory_record,
    node_record,
)


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _seed(stores: MemoryStores, state: str = "online", **values: Any) -> Agent:
    agent = Agent()
    stores.nodes.seed(node_record(agent, state=state, **values))
    return agent


def _known(agent: Agent) -> KnownCallers:
    known = KnownCallers()
    known.remember((agent.node_id, agent.credential_sha256))
    return known


# --- heartbeat: the steady path -----------------------------------------------------------------


def test_a_known_online_caller_costs_exactly_one_write_and_logs_nothing(stores: MemoryStores) -> None:
    agent = _seed(stores)
    stores.journal.reset_counts()
    result = nodes.heartbeat(
        stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(gpus=2)), NOW, _known(agent)
    )
    assert result.transitioned_from is None and result.node.liveness == "online"
    assert stores.journal.calls == ["nodes.record_heartbeat"]
    assert (stores.journal.reads, stores.journal.writes, stores.journal.events) == (0, 1, [])
    stored = stores.nodes.records[agent.node_id]
    assert stored.last_heartbeat_at == NOW
    assert stored.telemetry == [[gpu[c] for c in TELEMETRY_COLUMNS] for gpu in gpu_telemetry(2)["gpus"]]
    assert stored.health == {"status": "ok"} and stored.agent_version == "1.3.0"


def test_a_heartbeats_slots_are_kept_in_its_one_write_and_an_absent_report_keeps_the_last(stores: MemoryStores) -> None:
    agent = _seed(stores)
    slots = {"total": 8, "busy": 3, "schedulable": 7}
    stores.journal.reset_counts()
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(slots=slots)), NOW, _known(agent))
    assert stores.journal.writes == 1 and stores.nodes.records[agent.node_id].slots == [8, 3, 7]
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW + 1, _known(agent))
    assert stores.nodes.records[agent.node_id].slots == [8, 3, 7]  # an older agent's heartbeat changes nothing


@pytest.mark.parametrize(
    "slots",
    [
        {"total": 2, "busy": 3, "schedulable": 2},
        {"total": 2, "busy": 0, "schedulable": 3},
        {"total": 0, "busy": 0, "schedulable": 0},
        {"total": 65, "busy": 0, "schedulable": 0},
        {"total": 2, "busy": 0},
        {"total": 2, "busy": 0, "schedulable": 2, "gpus": 2},
    ],
    ids=["busy-over-total", "schedulable-over-total", "no-slot", "too-many", "missing", "unknown-field"],
)
def test_a_heartbeat_with_impossible_slots_is_refused_and_changes_nothing(
    stores: MemoryStores, slots: dict[str, Any]
) -> None:
    agent = _seed(stores)
    before = stores.nodes.records[agent.node_id]
    with pytest.raises(Invalid) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(slots=slots)), NOW + 1)
    assert refused.value.code == "invalid_request"
    assert stores.nodes.records[agent.node_id] == before


def test_telemetry_rows_are_stored_in_gpu_index_order(stores: MemoryStores) -> None:
    agent = _seed(stores)
    telemetry = gpu_telemetry(3)
    telemetry["gpus"].reverse()
    telemetry["gpus"][0]["utilization_percent"] = 11.0  # index 2
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(telemetry=telemetry)), NOW)
    rows = stores.nodes.records[agent.node_id].telemetry
    assert rows is not None and [row[0] for row in rows] == [0, 1, 2] and rows[2][1] == 11.0


def test_an_unknown_online_caller_is_read_once_then_remembered(stores: MemoryStores) -> None:
    agent = _seed(stores)
    known = KnownCallers()
    stores.journal.reset_counts()
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW, known)
    assert stores.journal.calls == ["nodes.get", "nodes.record_heartbeat"]
    assert (agent.node_id, agent.credential_sha256) in known
    stores.journal.reset_counts()
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW + 15, known)
    assert stores.journal.calls == ["nodes.record_heartbeat"]


# --- heartbeat: refusals ------------------------------------------------------------------------


def test_an_unknown_node_is_refused_after_one_read_and_no_write(stores: MemoryStores) -> None:
    agent = Agent()  # never enrolled
    known = KnownCallers()
    with pytest.raises(Unauthenticated) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW, known)
    assert refused.value.code == "credential_invalid"
    assert stores.journal.calls == ["nodes.get"] and stores.journal.writes == 0 and len(known) == 0


def test_a_wrong_credential_is_refused_after_one_read_and_no_write(stores: MemoryStores) -> None:
    agent = _seed(stores)
    impostor = Agent(node_id=agent.node_id)  # the node's id, another credential
    before = stores.nodes.records[agent.node_id].last_heartbeat_at
    with pytest.raises(Unauthenticated) as refused:
        nodes.heartbeat(stores, SETTINGS, impostor.caller, typed.heartbeat(heartbeat_body()), NOW)
    assert refused.value.code == "credential_invalid"
    assert stores.journal.calls == ["nodes.get"] and stores.journal.writes == 0
    assert stores.nodes.records[agent.node_id].last_heartbeat_at == before


def test_a_revoked_credential_is_refused_with_its_own_code(stores: MemoryStores) -> None:
    agent = _seed(stores, credential_state="revoked")
    with pytest.raises(Unauthenticated) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW)
    assert refused.value.code == "credential_revoked" and stores.journal.writes == 0


def test_a_known_caller_revoked_since_is_read_refused_and_forgotten(stores: MemoryStores) -> None:
    agent = _seed(stores)
    known = _known(agent)
    stores.nodes.records[agent.node_id].credential_state = "revoked"
    with pytest.raises(Unauthenticated) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW, known)
    assert refused.value.code == "credential_revoked"
    assert stores.journal.calls == ["nodes.record_heartbeat", "nodes.get"] and stores.journal.writes == 0
    assert (agent.node_id, agent.credential_sha256) not in known


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (heartbeat_body(protocol_version=2), "protocol_incompatible"),
        (heartbeat_body(health={"status": "fine"}), "invalid_request"),
        (heartbeat_body(telemetry={"gpus": [gpu_telemetry(1)["gpus"][0]] * 2}), "invalid_request"),
    ],
    ids=["protocol-too-new", "schema", "duplicate-gpu-index"],
)
def test_an_invalid_heartbeat_reads_and_writes_nothing(
    stores: MemoryStores, body: dict[str, object], code: str
) -> None:
    agent = _seed(stores)
    with pytest.raises(Invalid) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(body), NOW)
    assert refused.value.code == code and stores.journal.calls == []


# --- heartbeat: transitions to online -----------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "stale", "offline"])
def test_a_transition_to_online_is_logged_and_counted(stores: MemoryStores, state: str) -> None:
    last = None if state == "pending" else NOW - 400
    agent = _seed(stores, state=state, last_heartbeat_at=last)
    stores.control.seed(ControlItem(ONLINE_NODES, count=4, revision=7))
    result = nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW, _known(agent))
    assert result.transitioned_from == state and result.node.liveness == "online"
    [event] = stores.journal.events
    assert event.type == "node.liveness_changed" and event.at == NOW
    assert event.subject == {"node_id": agent.node_id, "from": state, "to": "online", "cause": "heartbeat"}
    stored = stores.nodes.records[agent.node_id]
    assert (stored.liveness, stored.liveness_changed_at, stored.last_heartbeat_at) == ("online", NOW, NOW)
    counter = stores.control.records[ONLINE_NODES]
    assert (counter.count, counter.revision) == (5, 8)


def test_the_first_transition_creates_the_online_counter(stores: MemoryStores) -> None:
    agent = _seed(stores, state="pending", last_heartbeat_at=None)
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW)
    assert stores.control.records[ONLINE_NODES] == ControlItem(ONLINE_NODES, count=1, revision=1)


def test_a_heartbeat_that_loses_to_the_sweep_takes_the_transition_path(stores: MemoryStores) -> None:
    agent = _seed(stores, last_heartbeat_at=NOW - 70)

    def sweep_marks_it_stale() -> None:
        stores.nodes.change_liveness(agent.node_id, "online", "stale", NOW - 60, NOW, Event("sweep", {}, NOW))

    stores.control.seed(ControlItem(ONLINE_NODES, count=1, revision=1))
    stores.journal.before_next("nodes.record_heartbeat", sweep_marks_it_stale)
    result = nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW, _known(agent))
    assert result.transitioned_from == "stale"
    assert stores.journal.event_types() == ["sweep", "node.liveness_changed"]
    assert stores.nodes.records[agent.node_id].liveness == "online"
    assert stores.control.records[ONLINE_NODES].count == 1  # -1 by the sweep, +1 by the heartbeat


def test_a_transition_retries_from_a_fresh_read_when_the_liveness_moved(stores: MemoryStores) -> None:
    agent = _seed(stores, state="stale", last_heartbeat_at=NOW - 100)

    def sweep_moves_it_offline() -> None:
        stores.nodes.records[agent.node_id].liveness = "offline"

    stores.journal.before_next("nodes.bring_online", sweep_moves_it_offline)
    result = nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW)
    assert result.transitioned_from == "offline"
    assert [event.subject["from"] for event in stores.journal.events] == ["offline"]
    assert stores.control.records[ONLINE_NODES].count == 1


def test_three_lost_transitions_end_in_a_conflict_with_nothing_written(stores: MemoryStores) -> None:
    agent = _seed(stores, state="stale", last_heartbeat_at=NOW - 100)

    def another_writer_moves_it() -> None:
        node = stores.nodes.records[agent.node_id]
        node.liveness = "offline" if node.liveness == "stale" else "stale"

    stores.journal.before_next("nodes.bring_online", another_writer_moves_it, times=3)
    with pytest.raises(Conflict) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW)
    assert refused.value.code == "heartbeat_conflict"
    assert stores.journal.calls.count("nodes.bring_online") == 3
    assert stores.journal.writes == 0 and stores.journal.events == [] and ONLINE_NODES not in stores.control.records
    assert stores.nodes.records[agent.node_id].last_heartbeat_at == NOW - 100


def test_a_credential_revoked_during_a_transition_is_refused(stores: MemoryStores) -> None:
    agent = _seed(stores, state="stale", last_heartbeat_at=NOW - 100)

    def admin_revokes() -> None:
        stores.nodes.records[agent.node_id].credential_state = "revoked"

    stores.journal.before_next("nodes.bring_online", admin_revokes)
    with pytest.raises(Unauthenticated) as refused:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW)
    assert refused.value.code == "credential_revoked" and stores.journal.events == []


# --- inventory ----------------------------------------------------------------------------------


def test_inventory_replacement_is_limited_per_window_then_the_window_starts_again(stores: MemoryStores) -> None:
    agent = _seed(stores)
    limit = SETTINGS.inventory_rate_limit
    for i in range(limit):
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW + i)
    assert stores.nodes.inventories[agent.node_id].rate_window_count == limit
    writes = stores.journal.writes
    with pytest.raises(RateLimited) as refused:
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW + 100)
    assert refused.value.code == "inventory_rate_limited"
    assert refused.value.retry_after_seconds == INVENTORY_RATE_WINDOW_SECONDS - 100
    assert stores.journal.writes == writes

    nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW + INVENTORY_RATE_WINDOW_SECONDS
    )
    stored = stores.nodes.inventories[agent.node_id]
    assert (stored.rate_window_start, stored.rate_window_count) == (NOW + INVENTORY_RATE_WINDOW_SECONDS, 1)


def test_retry_after_rounds_up(stores: MemoryStores) -> None:
    agent = _seed(stores)
    for _ in range(SETTINGS.inventory_rate_limit):
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW)
    with pytest.raises(RateLimited) as refused:
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW + 99.5)
    assert refused.value.retry_after_seconds == 501


def test_inventory_replacement_stores_the_document_and_logs_it(stores: MemoryStores) -> None:
    agent = _seed(stores)
    document = gpu_inventory(2)
    returned = nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(document)), NOW
    )
    assert returned.inventory == document and returned.updated_at == NOW
    stored = stores.nodes.inventories[agent.node_id]
    assert stored.inventory == document and stored.revision
    assert stores.journal.event_types() == ["inventory.replaced", "gpu_claims.changed"]
    assert stores.journal.events[0].subject == {"node_id": agent.node_id}


@pytest.mark.parametrize(
    ("credential_state", "impostor", "code"),
    [("active", True, "credential_invalid"), ("revoked", False, "credential_revoked")],
)
def test_an_inventory_from_a_wrong_or_revoked_credential_costs_one_read(
    stores: MemoryStores, credential_state: str, impostor: bool, code: str
) -> None:
    agent = _seed(stores, credential_state=credential_state)
    caller = Agent(node_id=agent.node_id).caller if impostor else agent.caller
    with pytest.raises(Unauthenticated) as refused:
        nodes.replace_inventory(stores, SETTINGS, caller, typed.replace_inventory(inventory_body()), NOW)
    assert refused.value.code == code
    assert stores.journal.calls == ["nodes.get"] and agent.node_id not in stores.nodes.inventories


def test_inventory_replacement_reconciles_the_claims(stores: MemoryStores) -> None:
    agent = _seed(stores)
    kept, dropped, added = gpu_uuid(), gpu_uuid(), gpu_uuid()
    stores.nodes.seed_inventory(inventory_record(agent.node_id, inventory_of([kept, dropped])))
    stores.journal.reset_counts()
    nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(inventory_of([kept, added]))), NOW
    )
    assert stores.nodes.inventories[agent.node_id].claimed_uuids == {kept, added}
    assert stores.nodes.claimed_by(agent.node_id) == {kept, added}
    assert stores.nodes.claimants(dropped) == []
    changes = [event.subject for event in stores.journal.events_of("gpu_claims.changed")]
    assert changes == [{"node_id": agent.node_id, "add": added}, {"node_id": agent.node_id, "delete": dropped}]


def test_an_unchanged_inventory_writes_no_claims(stores: MemoryStores) -> None:
    agent = _seed(stores)
    uuids = [gpu_uuid(), gpu_uuid()]
    stores.nodes.seed_inventory(inventory_record(agent.node_id, inventory_of(uuids)))
    stores.journal.reset_counts()
    nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(inventory_of(uuids))), NOW
    )
    assert stores.journal.event_types() == ["inventory.replaced"] and stores.journal.writes == 1


def test_inventory_flags_a_live_duplicate_on_both_sides_and_unflags_it_when_it_goes(stores: MemoryStores) -> None:
    agent, other = _seed(stores), _seed(stores)
    shared = gpu_uuid()
    stores.nodes.seed_inventory(inventory_record(other.node_id, inventory_of([shared])))
    nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(inventory_of([shared, gpu_uuid()]))), NOW
    )
    mine, theirs = stores.nodes.records[agent.node_id], stores.nodes.records[other.node_id]
    assert mine.duplicate_partners == {other.node_id} and theirs.duplicate_partners == {agent.node_id}
    assert mine.duplicate_suspected_at == NOW and theirs.duplicate_suspected_at == NOW
    [suspected] = stores.journal.events_of("node.duplicate_suspected")
    assert suspected.subject["others"] == other.node_id and suspected.subject["gpu_uuids"] == shared

    nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(inventory_of([gpu_uuid()]))), NOW + 1
    )
    mine, theirs = stores.nodes.records[agent.node_id], stores.nodes.records[other.node_id]
    assert mine.duplicate_partners is None and theirs.duplicate_partners is None
    assert mine.duplicate_suspected_at is None and theirs.duplicate_suspected_at is None
    assert len(stores.journal.events_of("node.duplicate_cleared")) == 1
    assert {e.subject["node_id"] for e in stores.journal.events_of("node.duplicate_flag_cleared")} == {
        agent.node_id,
        other.node_id,
    }


def test_inventory_does_not_flag_offline_or_revoked_nodes(stores: MemoryStores) -> None:
    agent = _seed(stores)
    offline = _seed(stores, state="offline", last_heartbeat_at=NOW - SETTINGS.offline_after_seconds)
    revoked = _seed(stores, credential_state="revoked")
    shared = gpu_uuid()
    for other in (offline, revoked):
        stores.nodes.seed_inventory(inventory_record(other.node_id, inventory_of([shared])))
    nodes.replace_inventory(
        stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(inventory_of([shared]))), NOW
    )
    assert stores.nodes.records[agent.node_id].duplicate_partners is None
    assert stores.journal.events_of("node.duplicate_suspected") == []


def test_a_replacement_that_loses_to_another_retries_and_counts_from_the_fresh_read(stores: MemoryStores) -> None:
    agent = _seed(stores)
    nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW)

    def another_replacement() -> None:
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW + 1)

    stores.journal.before_next("nodes.replace_inventory", another_replacement)
    nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW + 2)
    assert stores.nodes.inventories[agent.node_id].rate_window_count == 3
    assert stores.journal.calls.count("nodes.replace_inventory") == 4  # ours failed once


def test_three_lost_replacements_end_in_a_conflict(stores: MemoryStores) -> None:
    agent = _seed(stores)

    def another_replacement() -> None:
        current = stores.nodes.inventories.get(agent.node_id)
        stores.nodes.seed_inventory(
            inventory_record(agent.node_id, revision=f"other-{current.revision if current else ''}")
        )

    stores.journal.before_next("nodes.replace_inventory", another_replacement, times=3)
    with pytest.raises(Conflict) as refused:
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW)
    assert refused.value.code == "inventory_conflict"
    assert stores.journal.writes == 0 and stores.journal.events == []


def test_a_credential_revoked_during_a_replacement_is_refused(stores: MemoryStores) -> None:
    agent = _seed(stores)

    def admin_revokes() -> None:
        stores.nodes.records[agent.node_id].credential_state = "revoked"

    stores.journal.before_next("nodes.replace_inventory", admin_revokes)
    with pytest.raises(Unauthenticated) as refused:
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body()), NOW)
    assert refused.value.code == "credential_revoked" and agent.node_id not in stores.nodes.inventories


def test_an_inventory_with_a_gpu_uuid_twice_is_invalid(stores: MemoryStores) -> None:
    agent = _seed(stores)
    document = gpu_inventory(2)
    document["gpus"][1]["uuid"] = document["gpus"][0]["uuid"]
    with pytest.raises(Invalid):
        nodes.replace_inventory(stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(document)), NOW)
    assert stores.journal.calls == []


# --- credentials and reads ----------------------------------------------------------------------


def test_revoking_a_credential_logs_it_once_then_conflicts(stores: MemoryStores) -> None:
    agent = _seed(stores)
    node = nodes.revoke_credential(stores, agent.node_id, NOW)
    assert (node.credential_state, node.credential_revoked_at) == ("revoked", NOW)
    assert [(e.type, e.subject) for e in stores.journal.events] == [("credential.revoked", {"node_id": agent.node_id})]
    with pytest.raises(Conflict) as refused:
        nodes.revoke_credential(stores, agent.node_id, NOW + 1)
    assert refused.value.code == "credential_already_revoked"
    assert stores.nodes.records[agent.node_id].credential_revoked_at == NOW and len(stores.journal.events) == 1


@pytest.mark.parametrize("node_id", ["node_" + "f" * 32, "not-a-node-id"])
def test_unknown_nodes_are_not_found(stores: MemoryStores, node_id: str) -> None:
    with pytest.raises(NotFound) as missing:
        nodes.get(stores, node_id)
    assert missing.value.code == "node_not_found"
    with pytest.raises(NotFound):
        nodes.revoke_credential(stores, node_id, NOW)
    assert stores.journal.writes == 0
    if node_id == "not-a-node-id":
        assert stores.journal.reads == 0  # a malformed id is never looked up


def test_get_returns_the_stored_node(stores: MemoryStores) -> None:
    agent = _seed(stores)
    assert nodes.get(stores, agent.node_id) == stores.nodes.records[agent.node_id]


# --- what the node keeps of a reported health ---------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        ({"status": "ok"}, {"status": "ok"}),
        (
            {"status": "ok", "worker": {"status": "ok", "detail": "worker 1.3.0: ocr", "unavailable": []}},
            {"status": "ok", "worker": {"status": "ok"}},
        ),
        # anything that is not plainly healthy is kept whole: its detail says what is wrong
        (
            {
                "status": "degraded",
                "detail": "runtime worker degraded",
                "worker": {"status": "degraded", "detail": "x"},
            },
            {
                "status": "degraded",
                "detail": "runtime worker degraded",
                "worker": {"status": "degraded", "detail": "x"},
            },
        ),
        (
            {
                "status": "ok",
                "worker": {"status": "ok", "unavailable": [{"name": "ocr", "reason": "artifact_quarantined"}]},
            },
            {
                "status": "ok",
                "worker": {"status": "ok", "unavailable": [{"name": "ocr", "reason": "artifact_quarantined"}]},
            },
        ),
    ],
    ids=["no_worker", "healthy_worker", "degraded", "unavailable_capability"],
)
def test_a_healthy_workers_detail_is_not_kept_and_anything_else_is(
    stores: MemoryStores, reported: dict[str, Any], kept: dict[str, Any]
) -> None:
    agent = _seed(stores)
    nodes.heartbeat(
        stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(health=reported)), NOW, _known(agent)
    )
    assert stores.nodes.records[agent.node_id].health == kept


@pytest.mark.parametrize(
    ("health", "stored"),
    [
        ({"status": "ok"}, "ok"),
        ({"status": "ok", "worker": {"status": "ok"}}, "ok/ok"),
        ({"status": "degraded", "detail": "d"}, '{"status":"degraded","detail":"d"}'),
    ],
)
def test_the_node_item_stores_the_usual_healths_in_a_few_bytes(health: dict[str, Any], stored: str) -> None:
    from chalicelib.stores.models import CompactHealthAttribute

    attribute = CompactHealthAttribute(null=True)
    assert attribute.serialize(health) == stored
    assert attribute.deserialize(stored) == health
