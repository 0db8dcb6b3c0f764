"""readiness.check against the in-memory stores: a node enrolled and heartbeating through the
services is ready, and each check fails on its own when its condition breaks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import NotFound
from chalicelib.domain.records import Event
from chalicelib.services import enrollments, gpu_health, nodes, readiness

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    Agent,
    enroll_agent,
    gpu_inventory,
    gpu_telemetry,
    heartbeat_body,
    inventory_of,
    inventory_record,
    node_record,
)

CHECKS = [
    "connection",
    "inventory_age",
    "protocol_compatibility",
    "agent_health",
    "telemetry_age",
    "identity_unique",
    "worker",
    "push_channel",
    "gpu_health",
]


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _ready_gpu_node(stores: MemoryStores, gpus: int = 2) -> Agent:
    agent = enroll_agent(stores, inventory=gpu_inventory(gpus), accelerator_mode="nvidia", now=NOW - 30)
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(gpus)), NOW - 5)
    return agent


def _failing(result: readiness.Readiness) -> list[str]:
    return [check.name for check in result.checks if not check.ok]


def test_a_node_that_enrolled_and_heartbeats_is_ready(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    stores.journal.reset_counts()
    result = readiness.check(stores, SETTINGS, agent.node_id, NOW)
    assert [check.name for check in result.checks] == CHECKS
    assert result.ready and result.status == "online" and result.node_id == agent.node_id
    assert all(check.next_step is None for check in result.checks)
    assert result.enrollment_id == stores.nodes.records[agent.node_id].enrollment_id
    assert stores.journal.writes == 0


def test_a_node_that_never_heartbeated_fails_connection_health_and_telemetry(stores: MemoryStores) -> None:
    agent = enroll_agent(stores, inventory=gpu_inventory(1), accelerator_mode="nvidia", now=NOW)
    result = readiness.check(stores, SETTINGS, agent.node_id, NOW)
    assert _failing(result) == ["connection", "agent_health", "telemetry_age"]
    assert result.status == "pending"
    assert all(check.next_step for check in result.checks if not check.ok)


def _set(**values: object) -> Callable[[MemoryStores, Agent], None]:
    def change(stores: MemoryStores, agent: Agent) -> None:
        for name, value in values.items():
            setattr(stores.nodes.records[agent.node_id], name, value)

    return change


def _inventory(**values: object) -> Callable[[MemoryStores, Agent], None]:
    def change(stores: MemoryStores, agent: Agent) -> None:
        for name, value in values.items():
            setattr(stores.nodes.inventories[agent.node_id], name, value)

    return change


def _no_inventory(stores: MemoryStores, agent: Agent) -> None:
    del stores.nodes.inventories[agent.node_id]


def _live_twin(stores: MemoryStores, agent: Agent) -> None:
    """Another live node reports one of this node's GPUs (flagged as such)."""
    twin = Agent()
    stores.nodes.seed(node_record(twin))
    shared = sorted(gpu["uuid"] for gpu in stores.nodes.inventories[agent.node_id].inventory["gpus"])[:1]
    stores.nodes.seed_inventory(inventory_record(twin.node_id, inventory_of(shared)))
    stores.nodes.link_duplicates(agent.node_id, [twin.node_id], NOW - 20, Event("setup", {}, NOW))


@pytest.mark.parametrize(
    ("change", "failing", "says"),
    [
        (
            _set(last_heartbeat_at=NOW - SETTINGS.stale_after_seconds),
            ["connection", "telemetry_age"],
            "last heartbeat 60s ago",
        ),
        (_no_inventory, ["inventory_age", "telemetry_age"], "no inventory"),
        (
            _inventory(updated_at=NOW - SETTINGS.readiness_inventory_max_age_seconds - 1),
            ["inventory_age"],
            "older than",
        ),
        (_inventory(inventory={**gpu_inventory(2), "capabilities": []}), ["inventory_age"], "no capabilities"),
        (_set(protocol_version=2), ["protocol_compatibility"], "TOO_NEW"),
        (_set(health={"status": "degraded"}), ["agent_health"], "agent reports degraded"),
        (_set(health=None), ["agent_health"], "has not reported its health"),
        (_set(telemetry=[[0, 1.0, 1, 2, 40.0, 100.0]]), ["telemetry_age"], "covers 1 of 2"),
        (_live_twin, ["identity_unique"], "also reported by live node"),
    ],
    ids=[
        "stale-heartbeat",
        "no-inventory",
        "old-inventory",
        "no-capabilities",
        "protocol",
        "degraded",
        "no-health",
        "telemetry-short",
        "duplicate",
    ],
)
def test_each_check_fails_on_its_own_condition_with_a_next_step(
    stores: MemoryStores, change: Callable[[MemoryStores, Agent], None], failing: list[str], says: str
) -> None:
    agent = _ready_gpu_node(stores)
    change(stores, agent)
    result = readiness.check(stores, SETTINGS, agent.node_id, NOW)
    assert _failing(result) == failing and not result.ready
    first = next(check for check in result.checks if check.name == failing[0])
    assert says in first.detail and first.next_step


def test_a_duplicate_names_the_other_node_and_the_flag_time(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    _live_twin(stores, agent)
    [twin] = stores.nodes.records[agent.node_id].duplicate_partners or set()
    check = next(c for c in readiness.check(stores, SETTINGS, agent.node_id, NOW).checks if c.name == "identity_unique")
    assert twin in check.detail and "flagged since" in check.detail
    assert check.next_step and "revoke-credential" in check.next_step


def test_a_duplicate_that_went_offline_no_longer_fails_identity(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    _live_twin(stores, agent)
    [twin] = stores.nodes.records[agent.node_id].duplicate_partners or set()
    stores.nodes.records[twin].last_heartbeat_at = NOW - SETTINGS.offline_after_seconds
    assert readiness.check(stores, SETTINGS, agent.node_id, NOW).ready


def test_a_cpu_node_without_gpus_or_telemetry_is_ready(stores: MemoryStores) -> None:
    agent = enroll_agent(stores, now=NOW - 30)
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW - 5)
    assert readiness.check(stores, SETTINGS, agent.node_id, NOW).ready


# --- targets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("now", "state"), [(NOW, "pending"), (NOW + 900, "expired")])
def test_an_enrollment_without_a_node_waits_for_its_agent(stores: MemoryStores, now: float, state: str) -> None:
    minted = enrollments.create(
        stores, typed.create_enrollment({"display_name": "GPU Node", "expires_in_seconds": 900}), NOW
    )
    result = readiness.check(stores, SETTINGS, minted.enrollment.enrollment_id, now)
    assert (result.node_id, result.enrollment_id, result.status) == (None, minted.enrollment.enrollment_id, None)
    [check] = result.checks
    assert check.name == "connection" and not check.ok and f"enrollment is {state}" in check.detail
    assert check.next_step and not result.ready


def test_an_enrollment_that_produced_a_node_reports_that_node(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    enrollment_id = stores.nodes.records[agent.node_id].enrollment_id
    result = readiness.check(stores, SETTINGS, enrollment_id, NOW)
    assert result.node_id == agent.node_id and result.enrollment_id == enrollment_id and result.ready


@pytest.mark.parametrize(
    ("target", "code"),
    [
        ("node_" + "f" * 32, "node_not_found"),
        ("enr_" + "f" * 32, "enrollment_not_found"),
        ("something-else", "node_not_found"),
    ],
)
def test_an_unknown_target_is_not_found(stores: MemoryStores, target: str, code: str) -> None:
    with pytest.raises(NotFound) as missing:
        readiness.check(stores, SETTINGS, target, NOW)
    assert missing.value.code == code


def test_readiness_telemetry_needs_a_gpu_node_to_report_every_gpu(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores, gpus=2)
    nodes.heartbeat(
        stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(telemetry=gpu_telemetry(1))), NOW - 1
    )
    assert _failing(readiness.check(stores, SETTINGS, agent.node_id, NOW)) == ["telemetry_age"]


@pytest.mark.parametrize(
    ("worker", "ok", "says", "step"),
    [
        (None, True, "no runtime worker configured", None),
        ({"status": "ok"}, True, "reachable, compatible and healthy", None),
        (
            {"status": "unreachable", "detail": "connection refused"},
            False,
            "unreachable: connection refused",
            "MODELFORGE_AGENT_WORKER_URL",
        ),
        ({"status": "incompatible", "detail": "protocol 9"}, False, "incompatible", "COMPATIBILITY"),
        (
            {"status": "degraded", "unavailable": [{"name": "ocr", "reason": "artifact_quarantined"}]},
            False,
            "ocr (artifact_quarantined)",
            "MODELFORGE_WORKER_QUARANTINE_ROOT",
        ),
    ],
)
def test_the_worker_check_follows_what_the_agent_says_of_its_worker(
    stores: MemoryStores, worker: dict | None, ok: bool, says: str, step: str | None
) -> None:
    agent = _ready_gpu_node(stores)
    node = stores.nodes.records[agent.node_id]
    node.health = {"status": "ok" if ok else "degraded", **({"worker": worker} if worker is not None else {})}
    check = next(c for c in readiness.check(stores, SETTINGS, agent.node_id, NOW).checks if c.name == "worker")
    assert check.ok is ok and says in check.detail
    assert (check.next_step is None) if step is None else (step in (check.next_step or ""))


# --- gpu_health -----------------------------------------------------------------------------------


def _gpu_check(stores: MemoryStores, agent: Agent) -> readiness.Check:
    result = readiness.check(stores, SETTINGS, agent.node_id, NOW)
    return next(check for check in result.checks if check.name == "gpu_health")


def test_gpu_health_names_each_gpus_state_and_passes_while_every_gpu_takes_work(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    check = _gpu_check(stores, agent)
    uuids = gpu_health.inventory_uuids(stores.nodes.get_inventory(agent.node_id))
    assert check.ok and check.detail == "; ".join(f"{uuid}: unknown" for uuid in uuids)  # not reported yet


def test_gpu_health_fails_on_a_latched_gpu_with_its_action_and_the_clear_command(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    first, second = gpu_health.inventory_uuids(stores.nodes.get_inventory(agent.node_id))
    grades = [
        {
            "uuid": first,
            "state": "unschedulable",
            "reasons": [{"code": "xid_48", "action": "reset_gpu", "xid": 48, "since": "2026-12-02T10:00:00Z"}],
        },
        {"uuid": second, "state": "healthy", "reasons": []},
    ]
    body = heartbeat_body(2, boot_id="0b0b0b0b-0000-4000-8000-000000000001", gpu_health={"gpus": grades})
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(body), NOW - 4)
    check = _gpu_check(stores, agent)
    assert not check.ok
    assert (
        f"{first}: unschedulable (latched), action reset_gpu" in check.detail and f"{second}: healthy" in check.detail
    )
    assert (
        check.next_step
        == f"{first}: reset_gpu, then modelforge nodes clear-gpu {agent.node_id} {first} (a reboot clears it too)"
    )


def test_gpu_health_fails_on_a_drained_node(stores: MemoryStores) -> None:
    agent = _ready_gpu_node(stores)
    gpu_health.drain(stores, agent.node_id, None, True, NOW - 3)
    check = _gpu_check(stores, agent)
    assert (check.ok, check.next_step) == (False, f"modelforge nodes undrain {agent.node_id}")


def test_gpu_health_of_a_cpu_node_passes(stores: MemoryStores) -> None:
    agent = enroll_agent(stores, now=NOW - 30)
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body(0)), NOW - 5)
    check = _gpu_check(stores, agent)
    assert (check.ok, check.detail) == (True, "no GPUs")
