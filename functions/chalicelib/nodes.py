"""Nodes: heartbeats, inventory, credential revocation."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from modelforge_protocol import credentials
from modelforge_protocol.versions import Component

from . import control_store, duplicates, liveness, node_store
from .auth import NodeCaller, credential_invalid, credential_revoked
from .errors import ApiError, GuardFailed, conflict, not_found
from .models import TELEMETRY_COLUMNS, GpuClaimModel, InventoryModel, NodeModel
from .protocol_check import require_compatible
from .settings import Settings
from .state_log import delete_change, outbox_item, put_change, update_change
from .validation import require_unique, validate, validate_inventory

#: A transition heartbeat can lose a race with the sweep; it then retries from a fresh read.
_TRANSITION_ATTEMPTS = 3


def get(node_id: str) -> NodeModel:
    node = node_store.get(node_id) if credentials.NODE_ID_RE.fullmatch(node_id) else None
    if node is None:
        raise not_found("node")
    return node


def _telemetry_rows(body: dict[str, Any]) -> list[list[float]]:
    gpus = sorted(body["telemetry"]["gpus"], key=lambda gpu: gpu["index"])
    require_unique(gpus, "index", "telemetry/gpus")
    return [[gpu[column] for column in TELEMETRY_COLUMNS] for gpu in gpus]


def _require_holder(node: NodeModel | None, caller: NodeCaller) -> NodeModel:
    """The node exists and the caller holds its active credential; else say which is wrong."""
    if node is None or not hmac.compare_digest(node.credential_sha256, caller.credential_sha256):
        raise credential_invalid()
    if node.credential_state != "active":
        raise credential_revoked()
    return node


@dataclass(frozen=True)
class HeartbeatResult:
    node: NodeModel
    transitioned_from: str | None


def heartbeat(settings: Settings, caller: NodeCaller, body: dict[str, Any], now: float) -> HeartbeatResult:
    protocol_version = require_compatible(Component.AGENT, body)
    validate(body, "HEARTBEAT")
    values = {
        "last_heartbeat_at": round(now, 3),
        "liveness": liveness.ONLINE,
        "liveness_shard": liveness.index_partition(liveness.ONLINE, caller.node_id),
        "heartbeat_bucket": liveness.bucket(now, settings.sweep_bucket_seconds),
        "health": body["health"],
        "telemetry": _telemetry_rows(body),
        "agent_version": body["agent_version"],
        "protocol_version": protocol_version,
    }
    try:
        return HeartbeatResult(node_store.record_heartbeat(caller.node_id, caller.credential_sha256, values), None)
    except GuardFailed:
        pass
    for _ in range(_TRANSITION_ATTEMPTS):
        previous = _require_holder(node_store.get(caller.node_id), caller).liveness
        transition = {**values, "liveness_changed_at": round(now, 3)}
        event = outbox_item(
            event_type="node.liveness_changed",
            now=now,
            subject={"node_id": caller.node_id, "from": previous, "to": liveness.ONLINE, "cause": "heartbeat"},
            changes=[
                update_change(NodeModel, caller.node_id, _logged_liveness(transition)),
                control_store.online_nodes_log_change(+1),
            ],
            retention_seconds=settings.outbox_retention_seconds,
        )
        try:
            node_store.record_transition_heartbeat(
                caller.node_id, caller.credential_sha256, previous, transition, event
            )
        except GuardFailed:
            continue
        return HeartbeatResult(_require_holder(node_store.get(caller.node_id), caller), previous)
    raise ApiError(409, "heartbeat_conflict", "the node changed concurrently; retry the heartbeat")


def _logged_liveness(values: dict[str, Any]) -> dict[str, Any]:
    """What a liveness transition puts in the state log: not the telemetry it carried."""
    return {key: values[key] for key in ("liveness", "liveness_shard", "liveness_changed_at", "last_heartbeat_at")}


def replace_inventory(settings: Settings, caller: NodeCaller, body: dict[str, Any], now: float) -> InventoryModel:
    require_compatible(Component.AGENT, body)
    validate(body, "REPLACE_INVENTORY")
    validate_inventory(body["inventory"])
    inventory = InventoryModel(caller.node_id, inventory=body["inventory"], updated_at=round(now, 3))
    previous = node_store.get_inventory(caller.node_id)
    old_uuids = set(duplicates.gpu_uuids(previous.inventory if previous else None))
    new_claims = duplicates.claims(caller.node_id, body["inventory"], now)
    added = [claim for claim in new_claims if claim.gpu_uuid not in old_uuids]
    kept = {claim.gpu_uuid for claim in new_claims}
    removed = [GpuClaimModel(uuid, caller.node_id) for uuid in sorted(old_uuids - kept)]
    event = outbox_item(
        event_type="inventory.replaced",
        now=now,
        subject={"node_id": caller.node_id},
        changes=[put_change(inventory), *map(put_change, added), *map(delete_change, removed)],
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        node_store.replace_inventory(caller.node_id, caller.credential_sha256, inventory, added, removed, event)
    except GuardFailed:
        _require_holder(node_store.get(caller.node_id), caller)
        raise credential_revoked() from None  # revoked between the guard and the read
    duplicates.detect_and_flag(settings, caller.node_id, sorted(kept), now)
    return inventory


def revoke_credential(settings: Settings, node_id: str, now: float) -> NodeModel:
    get(node_id)
    values = {"credential_state": "revoked", "credential_revoked_at": round(now, 3)}
    event = outbox_item(
        event_type="credential.revoked",
        now=now,
        subject={"node_id": node_id},
        changes=[update_change(NodeModel, node_id, values)],
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        node_store.revoke_credential(node_id, values, event)
    except GuardFailed:
        raise conflict("credential_already_revoked", "the node's credential is already revoked") from None
    return get(node_id)
