"""gpu_health: latches by GPU and boot, re-checks after a clear, drains and missing GPUs, decided
against the in-memory stores; and what a heartbeat costs with and without them."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Conflict, NotFound
from chalicelib.domain.records import GPU_BLOCKED, NODE_DRAINED
from chalicelib.services import gpu_health, nodes, work
from chalicelib.services.known_callers import KnownCallers

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    Agent,
    gpu_inventory,
    heartbeat_body,
    inventory_record,
    node_record,
)

BOOT = "0b0b0b0b-0000-4000-8000-000000000001"
NEW_BOOT = "0b0b0b0b-0000-4000-8000-000000000002"


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _node(stores: MemoryStores, gpus: int = 2) -> tuple[Agent, list[str]]:
    agent = Agent()
    stores.nodes.seed(node_record(agent, accelerator_mode="nvidia", capabilities={"cuda", "diagnostic.echo"}))
    document = gpu_inventory(gpus)
    stores.nodes.seed_inventory(inventory_record(agent.node_id, document))
    return agent, [gpu["uuid"] for gpu in document["gpus"]]


def _grade(uuid: str, state: str = "healthy", code: str | None = None, action: str = "none") -> dict[str, Any]:
    reasons = [] if code is None else [{"code": code, "action": action, "since": "2026-12-02T10:00:00Z"}]
    return {"uuid": uuid, "state": state, "reasons": reasons}


def _beat(
    stores: MemoryStores, agent: Agent, at: float, grades: list[dict[str, Any]] | None = None, boot: str = BOOT
) -> nodes.HeartbeatResult:
    extra: dict[str, Any] = {"boot_id": boot}
    if grades is not None:
        extra["gpu_health"] = {"gpus": grades}
    known = KnownCallers()
    known.remember((agent.node_id, agent.credential_sha256))
    return nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(gpus=2, **extra)), at, known)


def _view(stores: MemoryStores, agent: Agent, uuid: str) -> dict[str, Any]:
    views = gpu_health.gpu_views(stores.nodes.get_inventory(agent.node_id))
    return next(view for view in views if view["uuid"] == uuid)


# --- latches ------------------------------------------------------------------------------------


def test_a_hard_fault_is_latched_and_outlives_an_agent_restart_on_the_same_boot(stores: MemoryStores) -> None:
    agent, (first, second) = _node(stores)
    result = _beat(stores, agent, NOW, [_grade(first, "unschedulable", "xid_48", "reset_gpu"), _grade(second)])
    assert result.gpu == gpu_health.GpuAnswer(drained=False, blocked=[{"uuid": first, "reason": "latched"}], recheck=[])
    assert stores.nodes.records[agent.node_id].gpu_blocks == GPU_BLOCKED
    assert stores.journal.event_types() == ["gpu.state_changed"]
    # a restarted agent forgot the Xid and grades the GPU healthy: the latch holds on this boot
    result = _beat(stores, agent, NOW + 15, [_grade(first), _grade(second)])
    assert result.gpu is not None and result.gpu.blocked == [{"uuid": first, "reason": "latched"}]
    view = _view(stores, agent, first)
    assert (view["state"], view["latched"], view["schedulable"]) == ("unschedulable", True, False)
    assert [reason["code"] for reason in view["reasons"]] == ["xid_48"]
    assert _view(stores, agent, second)["schedulable"] is True


def test_a_new_boot_releases_the_latch(stores: MemoryStores) -> None:
    agent, (first, second) = _node(stores)
    _beat(stores, agent, NOW, [_grade(first, "failed", "xid_79", "reboot"), _grade(second)])
    result = _beat(stores, agent, NOW + 600, [_grade(first), _grade(second)], boot=NEW_BOOT)
    assert result.gpu is not None and result.gpu.blocked == []
    assert stores.nodes.records[agent.node_id].gpu_blocks is None
    assert _view(stores, agent, first)["schedulable"] is True


def test_a_fault_that_gets_worse_updates_its_latch(stores: MemoryStores) -> None:
    agent, (first, second) = _node(stores)
    _beat(stores, agent, NOW, [_grade(first, "unschedulable", "xid_48", "reset_gpu"), _grade(second)])
    _beat(stores, agent, NOW + 15, [_grade(first, "failed", "gpu_lost", "reboot"), _grade(second)])
    assert _view(stores, agent, first)["state"] == "failed"


@pytest.mark.parametrize("state", ["degraded", "unknown", "healthy"])
def test_a_soft_state_is_recorded_and_never_latched(stores: MemoryStores, state: str) -> None:
    agent, (first, second) = _node(stores)
    result = _beat(stores, agent, NOW, [_grade(first, state, "xid_13", "restart_app"), _grade(second)])
    assert result.gpu is not None and result.gpu.blocked == []
    view = _view(stores, agent, first)
    assert (view["state"], view["latched"], view["schedulable"]) == (state, False, True)
    assert stores.nodes.records[agent.node_id].gpu_blocks is None


# --- clearing and the re-check ------------------------------------------------------------------


def _latched(stores: MemoryStores) -> tuple[Agent, str, str]:
    agent, (first, second) = _node(stores)
    _beat(stores, agent, NOW, [_grade(first, "unschedulable", "xid_48", "reset_gpu"), _grade(second)])
    return agent, first, second


def test_a_cleared_gpu_is_rechecked_and_a_repaired_one_serves(stores: MemoryStores) -> None:
    agent, first, second = _latched(stores)
    gpu_health.clear(stores, agent.node_id, first, NOW + 30)
    assert _view(stores, agent, first)["recheck_pending"] is True
    # the next heartbeat tells the agent, and records that it did
    result = _beat(stores, agent, NOW + 45)
    assert result.gpu is not None and result.gpu.recheck == [first] and result.gpu.blocked == []
    # a report the agent sent in the same heartbeat as it learned decides nothing...
    _beat(stores, agent, NOW + 45, [_grade(first, "unschedulable", "xid_48", "reset_gpu"), _grade(second)])
    assert _view(stores, agent, first)["recheck_pending"] is True
    # ...its fresh check afterwards does
    result = _beat(stores, agent, NOW + 60, [_grade(first), _grade(second)])
    assert result.gpu is not None and result.gpu.recheck == [] and result.gpu.blocked == []
    assert _view(stores, agent, first)["schedulable"] is True
    assert stores.nodes.records[agent.node_id].gpu_blocks is None


def test_a_cleared_gpu_that_is_still_broken_is_latched_again(stores: MemoryStores) -> None:
    agent, first, second = _latched(stores)
    gpu_health.clear(stores, agent.node_id, first, NOW + 30)
    _beat(stores, agent, NOW + 45)
    result = _beat(
        stores, agent, NOW + 60, [_grade(first, "unschedulable", "remap_pending", "reset_gpu"), _grade(second)]
    )
    assert result.gpu is not None and result.gpu.blocked == [{"uuid": first, "reason": "latched"}]
    assert _view(stores, agent, first)["latched"] is True


def test_clearing_what_is_not_latched_or_not_there_is_refused_and_changes_nothing(stores: MemoryStores) -> None:
    agent, first, second = _latched(stores)
    stores.journal.reset_counts()
    with pytest.raises(Conflict) as refused:
        gpu_health.clear(stores, agent.node_id, second, NOW)
    assert refused.value.code == "gpu_fault_not_latched"
    with pytest.raises(NotFound) as missing:
        gpu_health.clear(stores, agent.node_id, "GPU-00000000-0000-0000-0000-000000000000", NOW)
    assert missing.value.code == "gpu_not_found"
    with pytest.raises(NotFound) as no_node:
        gpu_health.clear(stores, "node_" + "0" * 32, first, NOW)
    assert no_node.value.code == "node_not_found"
    with pytest.raises(NotFound):
        gpu_health.clear(stores, "not-a-node-id", first, NOW)
    assert stores.journal.writes == 0


# --- drains -------------------------------------------------------------------------------------


def test_a_drained_node_claims_nothing_and_its_answer_says_so(stores: MemoryStores) -> None:
    agent, _ = _node(stores)
    gpu_health.drain(stores, agent.node_id, None, True, NOW)
    assert stores.nodes.records[agent.node_id].gpu_blocks == NODE_DRAINED
    result = _beat(stores, agent, NOW + 1)
    assert result.gpu is not None and result.gpu.drained is True
    submitted = work.submit(stores, typed.submit_work({"capability": "diagnostic.echo", "input": {"text": "hi"}}), NOW)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW + 1) is None
    assert stores.journal.writes == 0  # refused before any transaction
    gpu_health.drain(stores, agent.node_id, None, False, NOW + 2)
    assert stores.nodes.records[agent.node_id].gpu_blocks is None
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW + 3)
    assert claimed is not None and claimed.item.work_id == submitted.item.work_id


def test_a_drained_gpu_is_blocked_and_draining_twice_writes_once(stores: MemoryStores) -> None:
    agent, (first, _second) = _node(stores)
    stores.journal.reset_counts()
    gpu_health.drain(stores, agent.node_id, first, True, NOW)
    gpu_health.drain(stores, agent.node_id, first, True, NOW + 1)
    assert stores.journal.writes == 1
    result = _beat(stores, agent, NOW + 2)
    assert result.gpu is not None and result.gpu.blocked == [{"uuid": first, "reason": "drained"}]
    view = _view(stores, agent, first)
    assert (view["drained"], view["schedulable"], view["state"]) == (True, False, "unknown")
    gpu_health.drain(stores, agent.node_id, first, False, NOW + 3)
    assert stores.nodes.records[agent.node_id].gpu_blocks is None


# --- missing GPUs -------------------------------------------------------------------------------


def test_a_vanished_gpu_is_failed_missing_until_the_new_set_is_accepted(stores: MemoryStores) -> None:
    agent, (first, second) = _node(stores)
    _beat(stores, agent, NOW, [_grade(first), _grade(second)])
    # the agent restarts with one GPU: its new inventory lacks the second
    fewer = gpu_inventory(1)
    fewer["gpus"][0]["uuid"] = first
    stores.nodes.seed_inventory(
        inventory_record(agent.node_id, fewer, gpu_state=stores.nodes.inventories[agent.node_id].gpu_state)
    )
    view = _view(stores, agent, second)
    assert (view["state"], view["missing"], view["reasons"][0]["code"]) == ("failed", True, "missing")
    gpu_health.accept_gpus(stores, agent.node_id, NOW + 60)
    uuids = [view["uuid"] for view in gpu_health.gpu_views(stores.nodes.get_inventory(agent.node_id))]
    assert uuids == [first]


# --- cost ---------------------------------------------------------------------------------------


def test_a_heartbeat_without_a_report_or_a_block_reads_nothing_more(stores: MemoryStores) -> None:
    agent, (first, second) = _node(stores)
    _beat(stores, agent, NOW, [_grade(first), _grade(second)])
    stores.journal.reset_counts()
    result = _beat(stores, agent, NOW + 15)
    assert result.gpu is None
    assert stores.journal.calls == ["nodes.record_heartbeat"]


def test_an_unchanged_report_reads_once_and_writes_nothing_more(stores: MemoryStores) -> None:
    agent, (first, second) = _node(stores)
    _beat(stores, agent, NOW, [_grade(first), _grade(second)])
    stores.journal.reset_counts()
    _beat(stores, agent, NOW + 15, [_grade(first), _grade(second)])
    assert stores.journal.calls == ["nodes.record_heartbeat", "nodes.get_inventory"]
