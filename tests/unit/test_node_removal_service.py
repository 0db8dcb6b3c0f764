"""node_removal: an admin's delete and the sweep's node retention, decided against the in-memory
stores (each store guard as DynamoDB checks it)."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Conflict, NotFound, Unauthenticated
from chalicelib.domain.records import ONLINE_NODES, ControlItem, Parked
from chalicelib.services import node_removal, nodes, sweep, work
from chalicelib.stores.contract import NODE_DELETE_PARTS

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    Agent,
    enrollment_record,
    gpu_uuid,
    heartbeat_body,
    inventory_of,
    inventory_record,
    node_record,
    settings_with,
)

OFFLINE_BEAT = NOW - SETTINGS.offline_after_seconds - 1
DAY = 86400


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _seed(stores: MemoryStores, uuids: list[str] | None = None, **values: Any) -> Agent:
    agent = Agent()
    node = node_record(agent, capabilities={"diagnostic.echo"}, **values)
    stores.nodes.seed(node)
    stores.nodes.seed_inventory(inventory_record(agent.node_id, inventory_of(uuids or [])))
    enrollment, _ = enrollment_record(enrollment_id=node.enrollment_id, state="consumed", node_id=agent.node_id)
    stores.enrollments.seed(enrollment)
    return agent


def _gone(stores: MemoryStores, agent: Agent) -> None:
    node_id = agent.node_id
    assert node_id not in stores.nodes.records and node_id not in stores.nodes.inventories
    assert not any(enrollment.node_id == node_id for enrollment in stores.enrollments.records.values())
    assert not any(key[1] == node_id for key in stores.parking.items)
    assert not any(node_id in (node.duplicate_partners or ()) for node in stores.nodes.records.values())


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"credential_state": "revoked"}, "credential_revoked"),  # even while online
        ({"state": "offline", "last_heartbeat_at": OFFLINE_BEAT}, "offline"),
        ({"state": "stale", "last_heartbeat_at": OFFLINE_BEAT}, "offline"),  # offline before the sweep says so
    ],
    ids=["revoked", "offline", "offline-by-age"],
)
def test_a_revoked_or_offline_node_goes_with_everything_of_it(
    stores: MemoryStores, values: dict[str, Any], reason: str
) -> None:
    shared = gpu_uuid()
    agent = _seed(stores, [shared, gpu_uuid()], **values)
    twin = _seed(stores, [shared])
    stores.nodes.records[agent.node_id].duplicate_partners = {twin.node_id}
    stores.nodes.records[twin.node_id].duplicate_partners = {agent.node_id}
    stores.parking.items[("diagnostic.echo", agent.node_id)] = Parked(agent.node_id, frozenset({"x"}), NOW - 1)
    stores.journal.reset_counts()

    removed = node_removal.delete(stores, SETTINGS, agent.node_id, NOW)
    assert removed == node_removal.Removed(agent.node_id, reason, 0)
    _gone(stores, agent)
    assert stores.nodes.records[twin.node_id].duplicate_partners is None
    assert stores.nodes.claimants(shared) == [twin.node_id]
    [event] = stores.journal.events
    assert (event.type, event.subject) == ("node.deleted", {"node_id": agent.node_id, "reason": reason})


@pytest.mark.parametrize(
    ("values", "status"),
    [
        ({}, "online"),
        ({"state": "stale", "last_heartbeat_at": NOW - 100}, "stale"),
        ({"state": "pending", "last_heartbeat_at": None}, "pending"),
    ],  # fmt: skip
)
def test_a_live_node_with_an_active_credential_is_not_removable(
    stores: MemoryStores, values: dict[str, Any], status: str
) -> None:
    agent = _seed(stores, **values)
    with pytest.raises(Conflict) as refused:
        node_removal.delete(stores, SETTINGS, agent.node_id, NOW)
    assert refused.value.code == "node_not_removable"
    assert f"is {status}" in refused.value.message and "revoke-credential" in refused.value.message
    assert agent.node_id in stores.nodes.records and stores.journal.events == []


def test_an_unknown_node_is_not_found(stores: MemoryStores) -> None:
    with pytest.raises(NotFound) as refused:
        node_removal.delete(stores, SETTINGS, Agent().node_id, NOW)
    assert refused.value.code == "node_not_found"


def test_an_online_node_revoked_moves_the_online_counter(stores: MemoryStores) -> None:
    agent = _seed(stores, credential_state="revoked")
    stores.control.seed(ControlItem(ONLINE_NODES, count=3, revision=1))
    node_removal.delete(stores, SETTINGS, agent.node_id, NOW)
    assert stores.control.records[ONLINE_NODES].count == 2


def test_its_leases_are_requeued_fenced_by_epoch_and_its_credential_no_longer_authenticates(
    stores: MemoryStores,
) -> None:
    agent = _seed(stores, state="online")
    item = work.submit(stores, typed.submit_work({"capability": "diagnostic.echo", "input": {"n": 1}}), NOW - 10).item
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW - 1)
    assert claimed is not None and claimed.item.work_id == item.work_id
    stores.nodes.records[agent.node_id].credential_state = "revoked"

    assert node_removal.delete(stores, SETTINGS, agent.node_id, NOW).leases_released == 1
    requeued = stores.work.records[item.work_id]
    assert (requeued.status, requeued.epoch, requeued.lease_expires_at) == ("queued", claimed.item.epoch, None)
    assert "node_offline" in requeued.errors[-1]["reason"]  # as the sweep releases an offline node's leases
    with pytest.raises(Unauthenticated):  # the deleted node is unknown
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW + 1)


def test_a_node_back_online_between_read_and_write_stays(stores: MemoryStores, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = _seed(stores, state="offline", last_heartbeat_at=OFFLINE_BEAT)
    read = stores.nodes.get

    def heartbeat_meanwhile(node_id: str) -> Any:
        node = read(node_id)
        stored = stores.nodes.records[agent.node_id]
        stored.liveness, stored.last_heartbeat_at = "online", NOW
        return node

    monkeypatch.setattr(stores.nodes, "get", heartbeat_meanwhile)
    with pytest.raises(Conflict) as refused:
        node_removal.delete(stores, SETTINGS, agent.node_id, NOW)
    assert refused.value.code == "node_not_removable" and agent.node_id in stores.nodes.records


def test_a_node_past_one_deletions_limit_drops_its_claims_first(stores: MemoryStores) -> None:
    uuids = [gpu_uuid() for _ in range(NODE_DELETE_PARTS + 5)]
    agent = _seed(stores, uuids, credential_state="revoked")
    node_removal.delete(stores, SETTINGS, agent.node_id, NOW)
    _gone(stores, agent)
    assert all(stores.nodes.claimants(uuid) == [] for uuid in uuids)


# --- retention (the sweep) ------------------------------------------------------------------------


def test_without_a_retention_the_sweep_removes_nothing(stores: MemoryStores) -> None:
    agent = _seed(stores, state="offline", last_heartbeat_at=NOW - 400 * DAY, liveness_changed_at=NOW - 400 * DAY)
    assert SETTINGS.node_retention_days is None
    assert sweep.run(stores, SETTINGS, NOW).nodes_removed == 0
    assert agent.node_id in stores.nodes.records


def test_the_sweep_removes_nodes_offline_longer_than_the_retention_at_most_a_batch_a_run(
    stores: MemoryStores,
) -> None:
    settings = settings_with(MODELFORGE_NODE_RETENTION_DAYS="14")
    old = dict(state="offline", last_heartbeat_at=NOW - 15 * DAY, liveness_changed_at=NOW - 15 * DAY)
    retired = [_seed(stores, **old) for _ in range(node_removal.RETIRED_PER_SWEEP + 2)]
    recent = _seed(stores, state="offline", last_heartbeat_at=NOW - 13 * DAY, liveness_changed_at=NOW - 13 * DAY)
    revoked_online = _seed(stores, credential_state="revoked")  # the admin's to delete, not the sweep's

    assert sweep.run(stores, settings, NOW).nodes_removed == node_removal.RETIRED_PER_SWEEP
    assert sweep.run(stores, settings, NOW).nodes_removed == 2
    for agent in retired:
        _gone(stores, agent)
    assert {recent.node_id, revoked_online.node_id} <= set(stores.nodes.records)


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "two weeks", "3651"])
def test_a_retention_that_is_not_a_whole_number_of_days_is_a_configuration_error(raw: str) -> None:
    from chalicelib.config.settings import SettingsError

    with pytest.raises(SettingsError) as refused:
        settings_with(MODELFORGE_NODE_RETENTION_DAYS=raw)
    assert "MODELFORGE_NODE_RETENTION_DAYS" in str(refused.value)


def test_a_blank_retention_is_unset() -> None:
    assert settings_with(MODELFORGE_NODE_RETENTION_DAYS=" ").node_retention_days is None
    assert settings_with(MODELFORGE_NODE_RETENTION_DAYS="14").node_retention_days == 14
