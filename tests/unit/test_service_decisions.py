"""Decisions the services make from what they read, without any store: readiness checks and the
per-node inventory rate window, on plain records. The services' reads and writes are tested
against the in-memory stores (test_*_service.py), and the emulator tests prove the wire."""

from __future__ import annotations

import pytest
from chalicelib.config import resources
from chalicelib.config.settings import INVENTORY_RATE_WINDOW_SECONDS, load_settings
from chalicelib.domain.errors import RateLimited
from chalicelib.domain.records import Inventory, Node
from chalicelib.services import nodes, readiness

SETTINGS = load_settings(
    {
        **resources.local_names("unit"),
        "MODELFORGE_ADMIN_TOKEN_SHA256": "a" * 64,
        "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
        "MODELFORGE_INVENTORY_RATE_LIMIT": "3",
    }
)
NOW = 1_000_000.0
GPU = {
    "index": 0,
    "uuid": "GPU-00000000-aaaa",
    "name": "H200",
    "memory_total_bytes": 1,
    "driver_version": "1",
    "cuda_version": "1",
}


def _node(**values: object) -> Node:
    defaults: dict[str, object] = {
        "display_name": "gpu-1",
        "hostname": "gpu-1",
        "production_eligible": False,
        "created_at": NOW - 100,
        "agent_version": "1.3.0",
        "credential_sha256": "0" * 64,
        "credential_state": "active",
        "credential_issued_at": NOW - 100,
        "liveness": "online",
        "liveness_changed_at": NOW - 100,
        "accelerator_mode": "nvidia",
        "protocol_version": 1,
        "last_heartbeat_at": NOW - 5,
        "health": {"status": "ok"},
        "telemetry": [[0, 50.0, 1, 2, 40.0, 100.0]],
        "enrollment_id": "enr_" + "0" * 32,
    }
    return Node(node_id="node_" + "0" * 32, **{**defaults, **values})  # type: ignore[arg-type]


def _inventory(
    gpus: list[dict[str, object]] | None = None, age: float = 10, capabilities: list[str] | None = None
) -> Inventory:
    document = {
        "gpus": [GPU] if gpus is None else gpus,
        "capabilities": ["cuda"] if capabilities is None else capabilities,
    }
    return Inventory(node_id="node_" + "0" * 32, inventory=document, updated_at=NOW - age)


# --- readiness checks ------------------------------------------------------------------------


def test_connection_never_heartbeated_fails_with_a_next_step() -> None:
    check = readiness._connection(_node(last_heartbeat_at=None), SETTINGS, NOW)
    assert not check.ok and "never sent a heartbeat" in check.detail and check.next_step


@pytest.mark.parametrize(("age", "ok"), [(59.9, True), (60, False), (61, False)])
def test_connection_is_ok_only_below_the_stale_threshold(age: float, ok: bool) -> None:
    check = readiness._connection(_node(last_heartbeat_at=NOW - age), SETTINGS, NOW)
    assert check.ok is ok and (check.next_step is None) is ok


@pytest.mark.parametrize(
    ("inventory", "ok", "says"),
    [
        (None, False, "no inventory"),
        (_inventory(age=SETTINGS.readiness_inventory_max_age_seconds + 1), False, "older than"),
        (_inventory(gpus=[]), False, "no GPU in nvidia mode"),
        (_inventory(capabilities=[]), False, "no capabilities"),
        (_inventory(), True, "1 GPU(s)"),
    ],
    ids=["missing", "too-old", "nvidia-without-gpus", "no-capabilities", "fresh"],
)
def test_inventory_age_decisions(inventory: Inventory | None, ok: bool, says: str) -> None:
    check = readiness._inventory_age(_node(), inventory, SETTINGS, NOW)
    assert check.ok is ok and says in check.detail


def test_a_cpu_node_without_gpus_has_a_fine_inventory() -> None:
    assert readiness._inventory_age(_node(accelerator_mode="cpu"), _inventory(gpus=[]), SETTINGS, NOW).ok


@pytest.mark.parametrize(("version", "ok"), [(1, True), (0, False), (2, False)])
def test_protocol_check_follows_the_verdict(version: int, ok: bool) -> None:
    check = readiness._protocol(_node(protocol_version=version))
    assert check.ok is ok and ("COMPATIBLE" in check.detail) is ok


@pytest.mark.parametrize(
    ("health", "ok"),
    [(None, False), ({"status": "ok"}, True), ({"status": "degraded"}, False), ({"status": "unhealthy"}, False)],
)
def test_agent_health_is_ok_only_when_the_agent_says_ok(health: dict[str, str] | None, ok: bool) -> None:
    assert readiness._health(_node(health=health)).ok is ok


@pytest.mark.parametrize(
    ("node", "ok", "says"),
    [
        (_node(telemetry=None), False, "no telemetry"),
        (_node(last_heartbeat_at=NOW - 60), False, "older than 60s"),
        (_node(telemetry=[]), False, "covers 0 of 1"),
        (_node(), True, "for 1 GPU(s)"),
    ],
    ids=["none", "stale", "missing-gpu", "fresh"],
)
def test_telemetry_age_decisions(node: Node, ok: bool, says: str) -> None:
    check = readiness._telemetry_age(node, _inventory(), SETTINGS, NOW)
    assert check.ok is ok and says in check.detail


def test_readiness_is_ready_only_when_every_check_passes() -> None:
    passing = readiness.Check("a", True, "", None)
    failing = readiness.Check("b", False, "", "do this")
    assert readiness.Readiness("n", "e", [passing, passing]).ready
    assert not readiness.Readiness("n", "e", [passing, failing]).ready


# --- the inventory rate window -----------------------------------------------------------------


def _previous(start: float | None, count: int | None) -> Inventory:
    item = _inventory()
    item.rate_window_start, item.rate_window_count = start, count
    return item


def test_rate_window_opens_on_the_first_replacement() -> None:
    assert nodes._rate_window(SETTINGS, None, NOW) == {"rate_window_start": NOW, "rate_window_count": 1}
    assert nodes._rate_window(SETTINGS, _previous(None, None), NOW)["rate_window_count"] == 1


def test_rate_window_counts_up_to_the_limit_then_refuses_with_the_time_left() -> None:
    start = NOW - 100
    assert nodes._rate_window(SETTINGS, _previous(start, 2), NOW) == {
        "rate_window_start": start,
        "rate_window_count": 3,
    }
    with pytest.raises(RateLimited) as refused:
        nodes._rate_window(SETTINGS, _previous(start, 3), NOW)
    assert refused.value.code == "inventory_rate_limited"
    assert refused.value.retry_after_seconds == INVENTORY_RATE_WINDOW_SECONDS - 100


@pytest.mark.parametrize(
    "start", [NOW - INVENTORY_RATE_WINDOW_SECONDS, NOW + 5], ids=["window-over", "clock-went-back"]
)
def test_rate_window_starts_again_when_it_is_over_or_lies_in_the_future(start: float) -> None:
    assert nodes._rate_window(SETTINGS, _previous(start, 3), NOW) == {"rate_window_start": NOW, "rate_window_count": 1}
