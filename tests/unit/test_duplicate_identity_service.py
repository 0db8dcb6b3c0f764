"""duplicate_identity: GPU claims and duplicate flags, decided against the in-memory stores."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain.records import Event
from chalicelib.services import duplicate_identity
from chalicelib.stores.contract import CLAIM_CHANGES_PER_WRITE, PARTNERS_PER_WRITE

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, gpu_uuid, inventory_of, inventory_record, node_record


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _node(stores: MemoryStores, uuids: list[str] | None = None, claimed: bool = True, **values: Any) -> str:
    agent = Agent()
    stores.nodes.seed(node_record(agent, **values))
    if uuids is not None:
        stores.nodes.seed_inventory(
            inventory_record(agent.node_id, inventory_of(uuids), revision="r1", claimed=claimed)
        )
    return agent.node_id


def _partners(stores: MemoryStores, node_id: str) -> set[str] | None:
    return stores.nodes.records[node_id].duplicate_partners


# --- claims -------------------------------------------------------------------------------------


def test_gpu_uuids_are_sorted_and_empty_without_an_inventory() -> None:
    assert duplicate_identity.gpu_uuids(inventory_of(["GPU-bbbbbbbb", "GPU-aaaaaaaa"])) == [
        "GPU-aaaaaaaa",
        "GPU-bbbbbbbb",
    ]
    assert duplicate_identity.gpu_uuids(None) == []


def test_reconcile_adds_and_deletes_the_difference_in_separate_writes(stores: MemoryStores) -> None:
    kept, dropped, added = gpu_uuid(), gpu_uuid(), gpu_uuid()
    node_id = _node(stores, [kept, dropped])
    duplicate_identity.reconcile_claims(stores, node_id, "r1", [kept, added], NOW)
    assert stores.nodes.claimed_by(node_id) == {kept, added}
    assert stores.nodes.inventories[node_id].claimed_uuids == {kept, added}
    assert [(e.type, e.subject) for e in stores.journal.events] == [
        ("gpu_claims.changed", {"node_id": node_id, "add": added}),
        ("gpu_claims.changed", {"node_id": node_id, "delete": dropped}),
    ]
    assert stores.journal.writes == 2


def test_reconcile_to_nothing_removes_every_claim(stores: MemoryStores) -> None:
    uuids = [gpu_uuid(), gpu_uuid()]
    node_id = _node(stores, uuids)
    duplicate_identity.reconcile_claims(stores, node_id, "r1", [], NOW)
    assert stores.nodes.claimed_by(node_id) == set() and stores.nodes.inventories[node_id].claimed_uuids is None
    assert [e.subject["delete"] for e in stores.journal.events] == [",".join(sorted(uuids))]


def test_reconcile_writes_in_bounded_batches(stores: MemoryStores) -> None:
    node_id = _node(stores, [], claimed=False)
    uuids = sorted(gpu_uuid() for _ in range(CLAIM_CHANGES_PER_WRITE + 2))
    duplicate_identity.reconcile_claims(stores, node_id, "r1", uuids, NOW)
    assert stores.journal.writes == 2 and stores.nodes.claimed_by(node_id) == set(uuids)


@pytest.mark.parametrize("revision", ["r0", "r2"])
def test_reconcile_for_another_revision_writes_nothing(stores: MemoryStores, revision: str) -> None:
    node_id = _node(stores, [gpu_uuid()])
    duplicate_identity.reconcile_claims(stores, node_id, revision, [gpu_uuid()], NOW)
    assert stores.journal.writes == 0 and stores.journal.calls == ["nodes.get_inventory"]


def test_reconcile_stops_when_a_newer_replacement_moves_first(stores: MemoryStores) -> None:
    old = gpu_uuid()
    node_id = _node(stores, [old])

    def newer_replacement() -> None:
        stores.nodes.inventories[node_id].revision = "r2"

    stores.journal.before_next("nodes.change_claims", newer_replacement)
    duplicate_identity.reconcile_claims(stores, node_id, "r1", [gpu_uuid()], NOW)
    assert stores.journal.writes == 0 and stores.journal.calls.count("nodes.change_claims") == 1
    assert stores.nodes.claimed_by(node_id) == {old}


# --- detection and flags ------------------------------------------------------------------------


def test_live_duplicates_are_other_live_nodes_with_an_active_credential(stores: MemoryStores) -> None:
    shared, other_shared = gpu_uuid(), gpu_uuid()
    me = _node(stores, [shared, other_shared])
    online = _node(stores, [shared, other_shared])
    stale = _node(stores, [shared], state="stale", last_heartbeat_at=NOW - SETTINGS.stale_after_seconds)
    pending = _node(stores, [shared], state="pending", last_heartbeat_at=None)
    _node(stores, [shared], state="offline", last_heartbeat_at=NOW - SETTINGS.offline_after_seconds)
    _node(stores, [shared], credential_state="revoked")
    found = duplicate_identity.live_duplicates(stores, SETTINGS, me, [shared, other_shared], NOW)
    assert found == {
        **{node: [shared] for node in (stale, pending)},
        online: [shared, other_shared],
    }
    assert stores.journal.writes == 0


def test_liveness_is_judged_by_the_heartbeat_age_not_the_persisted_state(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me = _node(stores, [shared])
    # persisted online, but silent past the offline threshold (the sweep has not run)
    _node(stores, [shared], last_heartbeat_at=NOW - SETTINGS.offline_after_seconds)
    assert duplicate_identity.live_duplicates(stores, SETTINGS, me, [shared], NOW) == {}


def test_detect_flags_new_live_partners_on_both_sides(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me, other = _node(stores, [shared]), _node(stores, [shared])
    assert duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], set(), NOW) == [other]
    assert _partners(stores, me) == {other} and _partners(stores, other) == {me}
    [event] = stores.journal.events
    assert event.type == "node.duplicate_suspected"
    assert event.subject == {"node_id": me, "reported_by": me, "others": other, "gpu_uuids": shared}


def test_detect_does_not_flag_known_partners_again(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me, other = _node(stores, [shared]), _node(stores, [shared])
    duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], set(), NOW)
    stores.journal.reset_counts()
    assert duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], {other}, NOW + 5) == []
    assert stores.journal.writes == 0
    assert stores.nodes.records[me].duplicate_suspected_at == NOW


def test_detect_unflags_a_partner_that_shares_nothing_any_more_on_both_sides(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me, other, third = _node(stores, [shared]), _node(stores, [shared]), _node(stores, [shared])
    duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], set(), NOW)
    assert _partners(stores, me) == {other, third}
    # ``other`` replaced its inventory: it no longer claims the GPU
    stores.nodes.inventories[other].claimed_uuids = None
    stores.journal.reset_counts()
    assert duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], {other, third}, NOW + 1) == []
    assert _partners(stores, me) == {third} and _partners(stores, other) is None
    # the flag time goes only where no partner is left
    assert stores.nodes.records[other].duplicate_suspected_at is None
    assert stores.nodes.records[me].duplicate_suspected_at == NOW
    assert stores.journal.event_types() == ["node.duplicate_cleared", "node.duplicate_flag_cleared"]
    assert stores.journal.events[1].subject == {"node_id": other}


def test_a_partner_that_shares_a_gpu_but_went_offline_stays_flagged(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me = _node(stores, [shared])
    other = _node(stores, [shared], state="offline", last_heartbeat_at=NOW - SETTINGS.offline_after_seconds)
    stores.nodes.link_duplicates(me, [other], NOW - 100, Event("setup", {}, NOW))
    stores.journal.reset_counts()
    assert duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], {other}, NOW) == []
    assert _partners(stores, me) == {other} and stores.journal.writes == 0


def test_a_partner_deleted_meanwhile_flags_nothing(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me, other = _node(stores, [shared]), _node(stores, [shared])
    stores.journal.before_next("nodes.link_duplicates", lambda: stores.nodes.records.pop(other))
    duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], set(), NOW)
    assert _partners(stores, me) is None and stores.journal.events == []


def test_many_partners_are_flagged_in_bounded_writes(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    me = _node(stores, [shared])
    others = {_node(stores, [shared]) for _ in range(PARTNERS_PER_WRITE + 1)}
    flagged = duplicate_identity.detect_and_flag(stores, SETTINGS, me, [shared], set(), NOW)
    assert set(flagged) == others and _partners(stores, me) == others
    assert stores.journal.event_types() == ["node.duplicate_suspected"] * 2
