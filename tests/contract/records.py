"""Records for the contract tests: each a fresh id, in the state a guard reads."""

from __future__ import annotations

import secrets
from typing import Any

from chalicelib.domain.records import Enrollment, Event, Heartbeat, Inventory, Node, WorkItem
from chalicelib.stores.contract import Holder

NOW = 1_700_000_000.0
#: A lease goes to a node that heartbeated after this (its seeded heartbeat is 30 s before NOW).
HEARTBEAT_CUTOFF = NOW - 60
HEARTBEAT = Heartbeat(
    health={"status": "ok"}, telemetry=[[0, 50.0, 1, 2, 40, 100.0]], agent_version="1.3.0", protocol_version=1
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def event(kind: str = "contract.test") -> Event:
    return Event(kind, {"test": "contract"}, NOW)


def node(liveness: str = "online", **fields: Any) -> Node:
    values: dict[str, Any] = {
        "node_id": new_id("node"),
        "enrollment_id": new_id("enr"),
        "display_name": "contract node",
        "hostname": "contract-host",
        "accelerator_mode": "nvidia",
        "production_eligible": False,
        "created_at": NOW - 1000,
        "agent_version": "1.3.0",
        "protocol_version": 1,
        "credential_sha256": secrets.token_hex(32),
        "credential_state": "active",
        "credential_issued_at": NOW - 1000,
        "liveness": liveness,
        "liveness_changed_at": NOW - 500,
        "last_heartbeat_at": NOW - 30,
    }
    values.update(fields)
    return Node(**values)


def holder(of: Node) -> Holder:
    return Holder(of.node_id, of.credential_sha256)


def inventory(node_id: str, revision: str | None = "rev-1", **fields: Any) -> Inventory:
    values: dict[str, Any] = {"node_id": node_id, "inventory": {"gpus": []}, "updated_at": NOW - 100}
    values.update(revision=revision, **fields)
    return Inventory(**values)


def enrollment(**fields: Any) -> Enrollment:
    values: dict[str, Any] = {
        "enrollment_id": new_id("enr"),
        "token_sha256": secrets.token_hex(32),
        "display_name": "contract enrollment",
        "state": "pending",
        "production_eligible": False,
        "created_at": NOW - 100,
        "expires_at": NOW + 3600,
    }
    values.update(fields)
    return Enrollment(**values)


def work(status: str = "queued", **fields: Any) -> WorkItem:
    leased = status == "leased"
    values: dict[str, Any] = {
        "work_id": new_id("work"),
        "capability": "echo",
        "status": status,
        "created_at": NOW - 100,
        "updated_at": NOW - 50,
        "attempts": 1 if leased else 0,
        "max_attempts": 3,
        "lease_seconds": 300,
        "epoch": 1 if leased else 0,
        "input_key": "work-inputs/contract.json",
        "input_sha256": "a" * 64,
        "input_size": 10,
        "lease_expires_at": NOW + 100 if leased else None,
        "queued_at": NOW - 100 if status == "queued" else None,
    }
    values.update(fields)
    return WorkItem(**values)
