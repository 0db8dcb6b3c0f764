"""Inventory replacement: any number of changed GPU UUIDs, exact claims afterwards, a per-node
rate limit, and duplicate-identity flags that are raised and cleared on both sides.

Over HTTP against the in-process stack; the claims are read from the emulator's table.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests
from modelforge_local_stack.emulator import operations_delta
from modelforge_protocol import schemas

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.snapshots import scan_table


def _claims(stack: Any, node_id: str) -> set[str]:
    items = scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_GPU_CLAIMS_TABLE"])
    return {item["gpu_uuid"]["S"] for item in items if item["node_id"]["S"] == node_id}


def _inventory_item(stack: Any, node_id: str) -> dict[str, Any]:
    items = scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_INVENTORIES_TABLE"])
    return next(item for item in items if item["node_id"]["S"] == node_id)


def _uuids(inventory: dict[str, Any]) -> set[str]:
    return {gpu["uuid"] for gpu in inventory["gpus"]}


def _replace(cp: ControlPlane, identity: AgentIdentity, inventory: dict[str, Any]) -> requests.Response:
    return cp.request(
        "POST",
        "/api/v1/agent/inventory",
        headers=identity.headers(),
        json={"protocol_version": 1, "inventory": inventory},
    )


def _reported(cp: ControlPlane, node_id: str) -> dict[str, Any]:
    """The inventory as the node reported it (the admin view adds ``updated_at``)."""
    view = dict(cp.node(node_id)["inventory"])
    view.pop("updated_at")
    return view


def _gpu_node(cp: ControlPlane, gpus: int, inventory: dict[str, Any] | None = None) -> AgentIdentity:
    identity = AgentIdentity()
    answer = cp.enroll(
        cp.mint()["token"], identity, accelerator_mode="nvidia", inventory=inventory or gpu_inventory(gpus)
    )
    assert answer.status_code == 201, answer.text
    return identity


def test_inventory_with_all_64_gpu_uuids_changed_twice_succeeds_and_claims_follow(stack, cp: ControlPlane) -> None:
    """MIG reconfiguration changes every UUID: 128 claim changes, far over one transaction's 100 items."""
    identity = _gpu_node(cp, schemas.MAX_GPUS)
    assert identity.node_id is not None
    for _ in range(2):
        inventory = gpu_inventory(schemas.MAX_GPUS)
        response = _replace(cp, identity, inventory)
        assert response.status_code == 200, response.text
        assert _claims(stack, identity.node_id) == _uuids(inventory)
        recorded = set(_inventory_item(stack, identity.node_id)["claimed_uuids"]["SS"])
        assert recorded == _uuids(inventory)


def test_inventory_replacements_rate_limited_per_node_with_retry_after_and_no_write(
    counted_stack, cp: ControlPlane
) -> None:
    stack = counted_stack
    identity = _gpu_node(cp, 1)
    other = _gpu_node(cp, 1)
    limit = int(__import__("chalicelib.instance", fromlist=["get"]).get().settings.inventory_rate_limit)
    for _ in range(limit):
        assert _replace(cp, identity, gpu_inventory(1)).status_code == 200
    stack.drain_state_log()
    before = {k: v for k, v in stack.aws_operations().items() if not k.startswith("poller:")}
    refused = _replace(cp, identity, gpu_inventory(1))
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "inventory_rate_limited"
    assert 1 <= error["retry_after_seconds"] <= 600
    assert refused.headers["Retry-After"] == str(error["retry_after_seconds"])
    delta = operations_delta(before, {k: v for k, v in stack.aws_operations().items() if not k.startswith("poller:")})
    assert set(delta) <= {"GetItem"}, delta  # refused before anything is written
    # another node's budget is its own
    assert _replace(cp, other, gpu_inventory(1)).status_code == 200


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_inventory_replacements_leave_claims_equal_to_the_stored_inventory(
    stack, cp: ControlPlane, round_: int
) -> None:
    """Eight replacements of one node race (real threads, real HTTP); whichever wins, the claims
    and the inventory's record of them equal the stored inventory's UUIDs."""
    identity = _gpu_node(cp, 4)
    assert identity.node_id is not None
    inventories = [gpu_inventory(40) for _ in range(8)]
    barrier = threading.Barrier(len(inventories))
    answers: list[int] = []

    def send(inventory: dict[str, Any]) -> None:
        session = ControlPlane(cp.base_url, cp.admin_token)
        barrier.wait(timeout=30)
        answers.append(_replace(session, identity, inventory).status_code)

    threads = [threading.Thread(target=send, args=(inventory,)) for inventory in inventories]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert answers and set(answers) <= {200, 409}, answers
    assert 200 in answers
    stored = cp.node(identity.node_id)["inventory"]
    assert _claims(stack, identity.node_id) == _uuids(stored)
    assert set(_inventory_item(stack, identity.node_id)["claimed_uuids"]["SS"]) == _uuids(stored)


def test_a_planted_gpu_uuid_flags_both_nodes_visibly_and_withdrawing_it_clears_both(stack, cp: ControlPlane) -> None:
    victim = _gpu_node(cp, 2)
    assert victim.node_id is not None and cp.heartbeat(victim, gpus=2).status_code == 200
    victim_inventory = _reported(cp, victim.node_id)
    planter = _gpu_node(cp, 1)
    assert planter.node_id is not None and cp.heartbeat(planter, gpus=1).status_code == 200
    own = _reported(cp, planter.node_id)
    planted = {**own, "gpus": [*own["gpus"], {**victim_inventory["gpus"][0], "index": 1}]}
    assert _replace(cp, planter, planted).status_code == 200

    seen = cp.node(victim.node_id)
    assert seen["duplicate_suspected"] == [planter.node_id]
    assert seen["duplicate_suspected_since"] is not None
    assert cp.node(planter.node_id)["duplicate_suspected"] == [victim.node_id]
    readiness = cp.admin("GET", f"/api/v1/admin/nodes/{victim.node_id}/readiness").json()
    check = next(c for c in readiness["checks"] if c["name"] == "identity_unique")
    assert not check["ok"] and planter.node_id in check["detail"] and "flagged since" in check["detail"]
    stack.drain_state_log()
    # the state-log event names who reported the shared UUID
    events = _events(stack, "node.duplicate_suspected")
    assert any(
        e["subject"]["reported_by"] == planter.node_id and victim.node_id in e["subject"]["others"] for e in events
    )

    assert _replace(cp, planter, own).status_code == 200  # the planted UUID is withdrawn
    for node_id in (victim.node_id, planter.node_id):
        view = cp.node(node_id)
        assert view["duplicate_suspected"] == [] and view["duplicate_suspected_since"] is None, view
    readiness = cp.admin("GET", f"/api/v1/admin/nodes/{victim.node_id}/readiness").json()
    assert next(c for c in readiness["checks"] if c["name"] == "identity_unique")["ok"]


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_reports_of_one_gpu_by_two_nodes_lose_no_flag(stack, cp: ControlPlane, round_: int) -> None:
    """Two nodes report the first node's GPU at the same moment: the first node ends flagged
    with both (set additions, no read-modify-write)."""
    first = _gpu_node(cp, 1)
    assert first.node_id is not None and cp.heartbeat(first, gpus=1).status_code == 200
    shared = _reported(cp, first.node_id)
    twins = [_gpu_node(cp, 1) for _ in range(2)]
    for twin in twins:
        assert cp.heartbeat(twin, gpus=1).status_code == 200
    barrier = threading.Barrier(len(twins))

    def report(twin: AgentIdentity) -> None:
        barrier.wait(timeout=30)
        assert _replace(ControlPlane(cp.base_url, cp.admin_token), twin, shared).status_code == 200

    threads = [threading.Thread(target=report, args=(twin,)) for twin in twins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert cp.node(first.node_id)["duplicate_suspected"] == sorted(twin.node_id or "" for twin in twins)


def _events(stack: Any, event_type: str) -> list[dict[str, Any]]:
    import json

    from tests.support.snapshots import state_log_objects

    objects = state_log_objects(stack.aws_endpoint_url, stack.names["MODELFORGE_STATE_LOG_BUCKET"])
    events = [json.loads(raw) for raw in objects.values()]
    return [event for event in events if event["type"] == event_type]
