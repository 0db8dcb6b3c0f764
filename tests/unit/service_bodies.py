"""Valid request bodies and stored records for unit tests of the services against the in-memory
stores. Bodies come from the tooling's builders (the ones the integration tests send), so they
satisfy the protocol's schemas; records are what an enroll and heartbeats would have stored."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from chalicelib.config import resources
from chalicelib.config.settings import Settings, load_settings
from chalicelib.domain import requests as typed
from chalicelib.domain.records import Enrollment, Inventory, Node, WorkItem
from chalicelib.services import enrollments
from chalicelib.services.auth import NodeCaller
from chalicelib.stores.contract import Stores
from modelforge_protocol import credentials
from modelforge_protocol import work as work_protocol

from tests.support.api import AgentIdentity, cpu_inventory, enroll_body, gpu_inventory, gpu_telemetry, heartbeat_body

__all__ = [
    # the tooling's builders (the integration tests send the same bodies)
    "AgentIdentity",
    "cpu_inventory",
    "enroll_body",
    "gpu_inventory",
    "gpu_telemetry",
    "heartbeat_body",
    # this module's
    "NOW",
    "SETTINGS",
    "Agent",
    "enroll_agent",
    "enrollment_record",
    "gpu_uuid",
    "inventory_body",
    "inventory_of",
    "inventory_record",
    "new_enrollment_id",
    "new_node_id",
    "node_record",
    "settings_with",
]

#: A fixed "now" (seconds since the epoch): every test passes its times explicitly.
NOW = 1_700_000_000.0

_ENV = {
    **resources.local_names("unit"),
    "MODELFORGE_ADMIN_TOKEN_SHA256": "a" * 64,
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "15",
    "MODELFORGE_INVENTORY_RATE_LIMIT": "3",
}
SETTINGS = load_settings(_ENV)


def settings_with(**env: str) -> Settings:
    """SETTINGS with some variables changed (``MODELFORGE_MASS_STALE_FRACTION="0.5"``)."""
    return load_settings({**_ENV, **env})


def new_node_id() -> str:
    return f"node_{uuid.uuid4().hex}"


def new_enrollment_id() -> str:
    return f"enr_{uuid.uuid4().hex}"


def inventory_body(inventory: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid inventory replacement (two GPUs unless ``inventory`` is given)."""
    return {"protocol_version": 1, "inventory": inventory if inventory is not None else gpu_inventory(2), **overrides}


def inventory_of(uuids: list[str]) -> dict[str, Any]:
    """A valid GPU inventory listing exactly ``uuids``."""
    document = gpu_inventory(len(uuids))
    for gpu, gpu_uuid in zip(document["gpus"], uuids, strict=True):
        gpu["uuid"] = gpu_uuid
    return document


def gpu_uuid() -> str:
    return f"GPU-{secrets.token_hex(8)}"


@dataclass
class Agent:
    """A node's secrets as its agent holds them, and the caller they authenticate as."""

    node_id: str = field(default_factory=new_node_id)
    credential: str = field(default_factory=credentials.new_node_credential)

    @property
    def credential_sha256(self) -> str:
        return credentials.sha256_hex(self.credential)

    @property
    def caller(self) -> NodeCaller:
        return NodeCaller(node_id=self.node_id, credential_sha256=self.credential_sha256)


def node_record(
    agent: Agent | None = None,
    *,
    state: str = "online",
    last_heartbeat_at: float | None = NOW - 5,
    credential_state: str = "active",
    accelerator_mode: str = "cpu",
    **overrides: Any,
) -> Node:
    """A node as enroll and heartbeats store it, persisted ``state``."""
    agent = agent or Agent()
    values: dict[str, Any] = {
        "node_id": agent.node_id,
        "enrollment_id": new_enrollment_id(),
        "display_name": "GPU Node",
        "hostname": "gpu-node-1",
        "accelerator_mode": accelerator_mode,
        "production_eligible": False,
        "created_at": NOW - 3600,
        "agent_version": "1.3.0",
        "protocol_version": 1,
        "credential_sha256": agent.credential_sha256,
        "credential_state": credential_state,
        "credential_issued_at": NOW - 3600,
        "liveness": state,
        "liveness_changed_at": NOW - 3600,
        "last_heartbeat_at": last_heartbeat_at,
        "health": {"status": "ok"} if last_heartbeat_at is not None else None,
        "telemetry": [] if last_heartbeat_at is not None else None,
    }
    values.update(overrides)
    return Node(**values)


def inventory_record(
    node_id: str,
    document: dict[str, Any] | None = None,
    *,
    updated_at: float = NOW - 60,
    revision: str | None = None,
    claimed: bool = True,
    **overrides: Any,
) -> Inventory:
    """An inventory as stored after a replacement whose claims were reconciled (``claimed``)."""
    document = document if document is not None else cpu_inventory()
    uuids = {gpu["uuid"] for gpu in document["gpus"]}
    values: dict[str, Any] = {
        "node_id": node_id,
        "inventory": document,
        "updated_at": updated_at,
        "revision": revision or uuid.uuid4().hex,
        "claimed_uuids": (uuids or None) if claimed else None,
    }
    values.update(overrides)
    return Inventory(**values)


def enrollment_record(
    *,
    token: str | None = None,
    enrollment_id: str | None = None,
    state: str = "pending",
    expires_at: float = NOW + 900,
    **overrides: Any,
) -> tuple[Enrollment, str]:
    """A stored enrollment and its token (``mfe.<id>.<secret>``)."""
    enrollment_id = enrollment_id or new_enrollment_id()
    token = token or credentials.new_enrollment_token(enrollment_id)
    values: dict[str, Any] = {
        "enrollment_id": enrollment_id,
        "token_sha256": credentials.sha256_hex(token),
        "display_name": "GPU Node",
        "state": state,
        "production_eligible": False,
        "created_at": NOW - 100,
        "expires_at": expires_at,
    }
    values.update(overrides)
    return Enrollment(**values), token


def enroll_agent(
    stores: Stores,
    *,
    inventory: dict[str, Any] | None = None,
    accelerator_mode: str = "cpu",
    now: float = NOW,
    settings: Settings = SETTINGS,
) -> Agent:
    """Mint a token and enroll a node with it through the services; the agent's secrets."""
    minted = enrollments.create(
        stores, typed.create_enrollment({"display_name": "GPU Node", "expires_in_seconds": 900}), now
    )
    identity = AgentIdentity()
    body = enroll_body(
        minted.token,
        identity,
        accelerator_mode=accelerator_mode,
        inventory=inventory if inventory is not None else cpu_inventory(),
    )
    node = enrollments.enroll(stores, settings, typed.enroll(body), now).node
    return Agent(node_id=node.node_id, credential=identity.credential)


def work_record(work_id: str, now: float = NOW, **fields: Any) -> WorkItem:
    """A work item as the stores hold it: a queued echo item at ``now`` unless ``fields`` say more."""
    values: dict[str, Any] = {
        "work_id": work_id,
        "capability": work_protocol.ECHO,
        "status": "queued",
        "created_at": now,
        "updated_at": now,
        "attempts": 0,
        "max_attempts": 3,
        "lease_seconds": 60,
        "epoch": 0,
        "input_key": f"work-inputs/{work_id}/x.json",
        "input_sha256": "a" * 64,
        "input_size": 2,
    }
    return WorkItem(**{**values, **fields})
