"""The in-memory stores honour the DynamoDB stores' guards: a write whose guard does not hold
raises GuardFailed and changes nothing (no record, no event, no write counted)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import MASS_STALE_HOLD, ONLINE_NODES, ControlItem, Event, Heartbeat
from chalicelib.stores.contract import (
    CLAIM_CHANGES_PER_WRITE,
    ControlStore,
    EnrollmentStore,
    Holder,
    NodeStore,
    Stores,
    WorkStore,
)

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, enrollment_record, inventory_record, node_record

EVENT = Event("test.event", {"node_id": "x"}, NOW)
BEAT = Heartbeat(health={"status": "ok"}, telemetry=[], agent_version="1.3.0", protocol_version=1)


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _state(stores: MemoryStores) -> dict[str, Any]:
    return copy.deepcopy(
        {
            "nodes": stores.nodes.records,
            "inventories": stores.nodes.inventories,
            "enrollments": stores.enrollments.records,
            "fleet": stores.control.records,
            "events": stores.journal.events,
            "writes": stores.journal.writes,
        }
    )


def _refused(stores: MemoryStores, write: Callable[[], object]) -> None:
    """``write`` fails its guard and changes nothing."""
    before = _state(stores)
    with pytest.raises(GuardFailed):
        write()
    assert _state(stores) == before


def test_the_fakes_are_the_protocols() -> None:
    stores = memory_stores()
    assert isinstance(stores, Stores)
    enrollments: EnrollmentStore = stores.enrollments
    nodes: NodeStore = stores.nodes
    control: ControlStore = stores.control
    work: WorkStore = stores.work
    assert enrollments.get("enr_x") is None and nodes.get("node_x") is None and control.get(ONLINE_NODES) is None
    assert work.get("work_x") is None


# --- heartbeats ---------------------------------------------------------------------------------


@pytest.fixture()
def agent(stores: MemoryStores) -> Iterator[Agent]:
    agent = Agent()
    stores.nodes.seed(node_record(agent, state="online"))
    yield agent


@pytest.mark.parametrize(
    "change",
    [
        {"credential_sha256": "0" * 64},
        {"credential_state": "revoked"},
        {"liveness": "stale"},
        {"liveness": "pending"},
    ],
    ids=["other-credential", "revoked", "stale", "pending"],
)
def test_steady_heartbeat_needs_the_active_credential_and_an_online_node(
    stores: MemoryStores, agent: Agent, change: dict[str, str]
) -> None:
    for name, value in change.items():
        setattr(stores.nodes.records[agent.node_id], name, value)
    _refused(stores, lambda: stores.nodes.record_heartbeat(_holder(agent), BEAT, NOW))


def test_steady_heartbeat_of_an_unknown_node_fails_its_guard(stores: MemoryStores) -> None:
    _refused(stores, lambda: stores.nodes.record_heartbeat(Holder("node_" + "f" * 32, "0" * 64), BEAT, NOW))


def test_steady_heartbeat_writes_once_logs_nothing_and_returns_the_node_as_written(
    stores: MemoryStores, agent: Agent
) -> None:
    beat = Heartbeat(health={"status": "degraded"}, telemetry=[[1.0]], agent_version="1.4.0", protocol_version=1)
    written = stores.nodes.record_heartbeat(_holder(agent), beat, NOW)
    assert (written.last_heartbeat_at, written.health, written.telemetry) == (NOW, {"status": "degraded"}, [[1.0]])
    assert (written.agent_version, written.hostname) == ("1.4.0", "gpu-node-1")
    assert stores.nodes.records[agent.node_id].last_heartbeat_at == NOW
    assert stores.journal.writes == 1 and stores.journal.events == []


def test_transition_heartbeat_needs_the_liveness_it_read(stores: MemoryStores, agent: Agent) -> None:
    stores.nodes.records[agent.node_id].liveness = "stale"
    _refused(
        stores,
        lambda: stores.nodes.bring_online(_holder(agent), "offline", BEAT, NOW, EVENT),
    )


def test_transition_heartbeat_needs_the_active_credential(stores: MemoryStores, agent: Agent) -> None:
    stores.nodes.records[agent.node_id].liveness = "stale"
    _refused(
        stores,
        lambda: stores.nodes.bring_online(Holder(agent.node_id, "0" * 64), "stale", BEAT, NOW, EVENT),
    )


def test_transition_heartbeat_adds_one_to_the_counter_creating_it_when_absent(
    stores: MemoryStores, agent: Agent
) -> None:
    stores.nodes.records[agent.node_id].liveness = "stale"
    stores.nodes.bring_online(_holder(agent), "stale", BEAT, NOW + 1, EVENT)
    node = stores.nodes.records[agent.node_id]
    assert (node.liveness, node.liveness_changed_at, node.last_heartbeat_at) == ("online", NOW + 1, NOW + 1)
    assert stores.control.records[ONLINE_NODES] == ControlItem(ONLINE_NODES, count=1, revision=1)
    assert stores.journal.events == [EVENT]

    stores.control.records[ONLINE_NODES].count, stores.control.records[ONLINE_NODES].revision = 7, 4
    stores.nodes.records[agent.node_id].liveness = "pending"
    stores.nodes.bring_online(_holder(agent), "pending", BEAT, NOW, EVENT)
    assert (stores.control.records[ONLINE_NODES].count, stores.control.records[ONLINE_NODES].revision) == (8, 5)


# --- inventory and claims -----------------------------------------------------------------------


def _holder(agent: Agent, credential_sha256: str | None = None) -> Holder:
    return Holder(agent.node_id, credential_sha256 or agent.credential_sha256)


def _replace(stores: MemoryStores, holder: Holder, revision: str, previous: str | None) -> None:
    inventory = inventory_record(holder.node_id, revision=revision, rate_window_start=NOW, rate_window_count=1)
    stores.nodes.replace_inventory(holder, inventory, previous, {"echo"}, EVENT)


def test_replace_inventory_creates_the_first_one(stores: MemoryStores, agent: Agent) -> None:
    _replace(stores, _holder(agent), "r1", None)
    assert stores.nodes.inventories[agent.node_id].revision == "r1"
    assert stores.nodes.records[agent.node_id].capabilities == {"echo"}
    assert stores.journal.events == [EVENT]


def test_replace_inventory_keeps_the_claims_recorded(stores: MemoryStores, agent: Agent) -> None:
    stores.nodes.seed_inventory(inventory_record(agent.node_id, revision="r1", claimed_uuids={"GPU-a"}))
    _replace(stores, _holder(agent), "r2", "r1")
    assert stores.nodes.inventories[agent.node_id].claimed_uuids == {"GPU-a"}


@pytest.mark.parametrize("previous", [None, "r0"], ids=["none-but-one-exists", "an-older-revision"])
def test_replace_inventory_needs_the_revision_it_read(stores: MemoryStores, agent: Agent, previous: str | None) -> None:
    stores.nodes.seed_inventory(inventory_record(agent.node_id, revision="r1"))
    _refused(
        stores,
        lambda: _replace(stores, _holder(agent), "r2", previous),
    )


def test_replace_inventory_with_a_revision_when_none_exists_fails(stores: MemoryStores, agent: Agent) -> None:
    _refused(
        stores,
        lambda: _replace(stores, _holder(agent), "r2", "r1"),
    )


@pytest.mark.parametrize("credential_state", ["active", "revoked"])
def test_replace_inventory_needs_the_active_credential(stores: MemoryStores, credential_state: str) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, credential_state=credential_state))
    credential = "0" * 64 if credential_state == "active" else agent.credential_sha256
    _refused(stores, lambda: _replace(stores, _holder(agent, credential), "r1", None))


def test_claims_follow_the_inventory_revision_and_an_emptied_set_is_removed(stores: MemoryStores, agent: Agent) -> None:
    stores.nodes.seed_inventory(inventory_record(agent.node_id, revision="r1"))
    _refused(stores, lambda: stores.nodes.change_claims(agent.node_id, "r0", ["GPU-a"], True, NOW, EVENT))

    stores.nodes.change_claims(agent.node_id, "r1", ["GPU-a", "GPU-b"], True, NOW, EVENT)
    assert stores.nodes.inventories[agent.node_id].claimed_uuids == {"GPU-a", "GPU-b"}
    assert stores.nodes.claimants("GPU-a") == [agent.node_id] and stores.nodes.claimed_by(agent.node_id) == {
        "GPU-a",
        "GPU-b",
    }

    stores.nodes.change_claims(agent.node_id, "r1", ["GPU-a", "GPU-b"], False, NOW, EVENT)
    assert stores.nodes.inventories[agent.node_id].claimed_uuids is None
    assert stores.nodes.claimants("GPU-a") == [] and stores.nodes.claimed_by(agent.node_id) == set()
    assert stores.journal.writes == 2


def test_claims_of_a_node_without_inventory_fail(stores: MemoryStores, agent: Agent) -> None:
    _refused(stores, lambda: stores.nodes.change_claims(agent.node_id, "r1", ["GPU-a"], True, NOW, EVENT))


def test_claim_writes_are_bounded_and_never_empty(stores: MemoryStores, agent: Agent) -> None:
    stores.nodes.seed_inventory(inventory_record(agent.node_id, revision="r1"))
    with pytest.raises(ValueError):
        stores.nodes.change_claims(
            agent.node_id, "r1", [f"GPU-{i}" for i in range(CLAIM_CHANGES_PER_WRITE + 1)], True, NOW, EVENT
        )
    with pytest.raises(ValueError):
        stores.nodes.change_claims(agent.node_id, "r1", [], True, NOW, EVENT)


# --- duplicate flags ----------------------------------------------------------------------------


def test_link_needs_every_node_and_changes_none_when_one_is_missing(stores: MemoryStores, agent: Agent) -> None:
    other = node_record()
    stores.nodes.seed(other)
    _refused(
        stores, lambda: stores.nodes.link_duplicates(agent.node_id, [other.node_id, "node_" + "f" * 32], NOW, EVENT)
    )


def test_link_and_unlink_both_sides_keeping_the_first_flag_time(stores: MemoryStores, agent: Agent) -> None:
    first, second = node_record(), node_record()
    stores.nodes.seed(first)
    stores.nodes.seed(second)
    stores.nodes.link_duplicates(agent.node_id, [first.node_id], NOW, EVENT)
    stores.nodes.link_duplicates(agent.node_id, [second.node_id], NOW + 10, EVENT)
    node = stores.nodes.records[agent.node_id]
    assert node.duplicate_partners == {first.node_id, second.node_id} and node.duplicate_suspected_at == NOW
    assert stores.nodes.records[second.node_id].duplicate_partners == {agent.node_id}
    assert stores.nodes.records[second.node_id].duplicate_suspected_at == NOW + 10

    # the time goes only once no partner is left
    _refused(stores, lambda: stores.nodes.forget_duplicate_time(agent.node_id, EVENT))
    stores.nodes.unlink_duplicates(agent.node_id, [first.node_id], EVENT)
    assert node.duplicate_partners == {second.node_id}
    assert stores.nodes.records[first.node_id].duplicate_partners is None
    assert stores.nodes.records[first.node_id].duplicate_suspected_at == NOW  # unlinking keeps the time
    stores.nodes.forget_duplicate_time(first.node_id, EVENT)
    assert stores.nodes.records[first.node_id].duplicate_suspected_at is None


def test_forget_duplicate_time_of_a_missing_node_fails(stores: MemoryStores) -> None:
    _refused(stores, lambda: stores.nodes.forget_duplicate_time("node_" + "f" * 32, EVENT))


# --- credentials and the sweep ------------------------------------------------------------------


def test_revoke_credential_needs_an_active_one(stores: MemoryStores, agent: Agent) -> None:
    _refused(stores, lambda: stores.nodes.revoke_credential("node_" + "f" * 32, NOW, EVENT))
    stores.nodes.revoke_credential(agent.node_id, NOW, EVENT)
    node = stores.nodes.records[agent.node_id]
    assert (node.credential_state, node.credential_revoked_at) == ("revoked", NOW)
    _refused(stores, lambda: stores.nodes.revoke_credential(agent.node_id, NOW, EVENT))


@pytest.mark.parametrize(
    ("stored", "expected", "not_after"),
    [
        ({}, "stale", NOW),  # another liveness
        ({}, "online", NOW - 10),  # a heartbeat after the cutoff
        ({"last_heartbeat_at": None}, "online", NOW),  # a missing attribute compares false
    ],
    ids=["liveness-moved", "heartbeat-since", "never-heartbeated"],
)
def test_change_liveness_guard(
    stores: MemoryStores, agent: Agent, stored: dict[str, Any], expected: str, not_after: float
) -> None:
    for name, value in stored.items():
        setattr(stores.nodes.records[agent.node_id], name, value)
    _refused(stores, lambda: stores.nodes.change_liveness(agent.node_id, expected, "stale", not_after, NOW, EVENT))


def test_change_liveness_moves_the_counter(stores: MemoryStores, agent: Agent) -> None:
    stores.control.seed(ControlItem(ONLINE_NODES, count=3, revision=9))
    stores.nodes.change_liveness(agent.node_id, "online", "stale", NOW - 5, NOW, EVENT)
    node = stores.nodes.records[agent.node_id]
    assert (node.liveness, node.liveness_changed_at) == ("stale", NOW)
    assert (stores.control.records[ONLINE_NODES].count, stores.control.records[ONLINE_NODES].revision) == (2, 10)
    stores.nodes.records[agent.node_id].last_heartbeat_at = NOW - 400
    stores.nodes.change_liveness(agent.node_id, "stale", "offline", NOW - 300, NOW, EVENT)
    assert (stores.control.records[ONLINE_NODES].count, stores.control.records[ONLINE_NODES].revision) == (2, 10)


def test_the_fake_buckets_heartbeats_as_the_test_settings_do() -> None:
    assert memory_stores().nodes._bucket_seconds == SETTINGS.sweep_bucket_seconds


def test_late_nodes_and_counts_read_by_state_and_heartbeat_bucket(stores: MemoryStores) -> None:
    late = [node_record(state="online", last_heartbeat_at=NOW - 200) for _ in range(6)]
    fresh = node_record(state="online", last_heartbeat_at=NOW)
    stale = node_record(state="stale", last_heartbeat_at=NOW - 200)
    pending = node_record(state="pending", last_heartbeat_at=None)
    for node in [*late, fresh, stale, pending]:
        stores.nodes.seed(node)
    cutoff = NOW - 100
    assert sorted(stores.nodes.late_nodes("online", cutoff)) == sorted(node.node_id for node in late)
    assert stores.nodes.late_nodes("stale", cutoff) == [stale.node_id]
    assert stores.nodes.count_in_state("online") == 7
    # a heartbeat just after the cutoff, in a bucket that starts by it: read (the sweep skips it)
    bucket_start = (NOW - 100) // 45 * 45
    just_after = node_record(state="online", last_heartbeat_at=bucket_start + 1)
    stores.nodes.seed(just_after)
    assert just_after.node_id in stores.nodes.late_nodes("online", bucket_start)


# --- enrollments --------------------------------------------------------------------------------


def _consume(
    stores: MemoryStores, enrollment_id: str, token_sha256: str, now: float = NOW, node_id: str | None = None
) -> None:
    node = node_record(Agent(node_id) if node_id else None, state="pending", last_heartbeat_at=None)
    inventory = inventory_record(node.node_id, claimed_uuids={"GPU-a"})
    stores.enrollments.consume(enrollment_id, token_sha256, "f" * 64, node, inventory, now)


def test_consume_creates_the_node_inventory_claims_and_four_events(stores: MemoryStores) -> None:
    enrollment, _ = enrollment_record()
    stores.enrollments.seed(enrollment)
    _consume(stores, enrollment.enrollment_id, enrollment.token_sha256)
    consumed = stores.enrollments.records[enrollment.enrollment_id]
    node_id = consumed.node_id
    assert (consumed.state, consumed.consumed_at, consumed.idempotency_key_sha256) == ("consumed", NOW, "f" * 64)
    assert node_id in stores.nodes.records and node_id in stores.nodes.inventories
    assert stores.nodes.claimants("GPU-a") == [node_id]
    assert stores.journal.event_types() == [
        "enrollment.consumed",
        "node.registered",
        "credential.issued",
        "inventory.replaced",
    ]
    assert stores.journal.writes == 1


@pytest.mark.parametrize(
    ("stored", "token", "now"),
    [
        ({}, "0" * 64, NOW),
        ({"state": "consumed"}, None, NOW),
        ({"state": "revoked"}, None, NOW),
        ({}, None, NOW + 900),  # expires_at == now: expired
    ],
    ids=["other-token", "consumed", "revoked", "expired"],
)
def test_consume_guard(stores: MemoryStores, stored: dict[str, Any], token: str | None, now: float) -> None:
    enrollment, _ = enrollment_record(expires_at=NOW + 900, **stored)
    stores.enrollments.seed(enrollment)
    _refused(stores, lambda: _consume(stores, enrollment.enrollment_id, token or enrollment.token_sha256, now))


def test_consume_never_overwrites_a_node(stores: MemoryStores, agent: Agent) -> None:
    enrollment, _ = enrollment_record()
    stores.enrollments.seed(enrollment)
    _refused(stores, lambda: _consume(stores, enrollment.enrollment_id, enrollment.token_sha256, node_id=agent.node_id))


def test_create_never_overwrites_and_revoke_needs_a_pending_enrollment(stores: MemoryStores) -> None:
    enrollment, _ = enrollment_record()
    stores.enrollments.create(enrollment, EVENT)
    _refused(stores, lambda: stores.enrollments.create(enrollment, EVENT))
    _refused(stores, lambda: stores.enrollments.revoke("enr_" + "f" * 32, NOW, EVENT))
    stores.enrollments.revoke(enrollment.enrollment_id, NOW, EVENT)
    revoked = stores.enrollments.records[enrollment.enrollment_id]
    assert (revoked.state, revoked.revoked_at) == ("revoked", NOW)
    _refused(stores, lambda: stores.enrollments.revoke(enrollment.enrollment_id, NOW, EVENT))


# --- the control table --------------------------------------------------------------------------------


def test_control_put_needs_the_next_revision(stores: MemoryStores) -> None:
    with pytest.raises(ValueError):
        stores.control.put(ControlItem(MASS_STALE_HOLD, active=True), EVENT)
    _refused(stores, lambda: stores.control.put(ControlItem(MASS_STALE_HOLD, active=True, revision=2), EVENT))
    stores.control.put(ControlItem(MASS_STALE_HOLD, active=True, revision=1), EVENT)
    _refused(stores, lambda: stores.control.put(ControlItem(MASS_STALE_HOLD, active=False, revision=1), EVENT))
    stores.control.put(ControlItem(MASS_STALE_HOLD, active=False, revision=2), EVENT)
    assert stores.control.records[MASS_STALE_HOLD] == ControlItem(MASS_STALE_HOLD, active=False, revision=2)


def test_control_put_of_revision_one_over_an_item_without_revision(stores: MemoryStores) -> None:
    stores.control.seed(ControlItem(MASS_STALE_HOLD, active=True))
    stores.control.put(ControlItem(MASS_STALE_HOLD, active=False, revision=1), EVENT)
    assert stores.control.records[MASS_STALE_HOLD].active is False


def test_recount_needs_the_revision_read(stores: MemoryStores) -> None:
    stores.control.recount_online_nodes(None, 5, NOW + 0.0004, EVENT)
    assert stores.control.records[ONLINE_NODES] == ControlItem(ONLINE_NODES, count=5, revision=1, updated_at=NOW)
    _refused(stores, lambda: stores.control.recount_online_nodes(None, 6, NOW, EVENT))
    read = stores.control.get(ONLINE_NODES)
    stores.control.add_online(+1)  # a transition moved the counter since the read
    _refused(stores, lambda: stores.control.recount_online_nodes(read, 6, NOW, EVENT))
    stores.control.recount_online_nodes(stores.control.get(ONLINE_NODES), 6, NOW, EVENT)
    assert (stores.control.records[ONLINE_NODES].count, stores.control.records[ONLINE_NODES].revision) == (6, 3)


# --- copies, paging, the journal ------------------------------------------------------------------


def test_records_go_in_and_come_out_as_copies(stores: MemoryStores, agent: Agent) -> None:
    read = stores.nodes.get(agent.node_id)
    assert read is not None
    read.liveness, read.health = "offline", {"status": "bad"}
    written = stores.nodes.record_heartbeat(_holder(agent), BEAT, NOW)
    written.liveness = "offline"
    enrollment, _ = enrollment_record()
    stores.enrollments.create(enrollment, EVENT)
    enrollment.state = "consumed"
    stored = stores.nodes.records[agent.node_id]
    assert stored.liveness == "online" and stored.health == {"status": "ok"} and stored.last_heartbeat_at == NOW
    assert stores.enrollments.records[enrollment.enrollment_id].state == "pending"


def test_list_page_pages_by_id(stores: MemoryStores) -> None:
    nodes = sorted((node_record() for _ in range(5)), key=lambda node: node.node_id)
    for node in nodes:
        stores.nodes.seed(node)
    first, key = stores.nodes.list_page(2, None)
    second, key2 = stores.nodes.list_page(2, key)
    last, key3 = stores.nodes.list_page(2, key2)
    assert [n.node_id for n in first + second + last] == [n.node_id for n in nodes]
    assert key == {"node_id": nodes[1].node_id} and key3 is None


def test_before_next_runs_inside_the_next_write_of_that_method_only(stores: MemoryStores, agent: Agent) -> None:
    def sweep_moves_first() -> None:
        stores.nodes.records[agent.node_id].liveness = "stale"

    stores.journal.before_next("nodes.record_heartbeat", sweep_moves_first)
    stores.control.put(ControlItem(MASS_STALE_HOLD, active=True, revision=1), EVENT)  # another method: not run
    assert stores.nodes.records[agent.node_id].liveness == "online"
    with pytest.raises(GuardFailed):
        stores.nodes.record_heartbeat(_holder(agent), BEAT, NOW)
    assert stores.nodes.records[agent.node_id].last_heartbeat_at == NOW - 5
    stores.nodes.records[agent.node_id].liveness = "online"
    stores.nodes.record_heartbeat(_holder(agent), BEAT, NOW)  # once only
    assert stores.journal.before_write == []
    assert stores.journal.calls == ["control.put", "nodes.record_heartbeat", "nodes.record_heartbeat"]
    assert stores.journal.writes == 2
