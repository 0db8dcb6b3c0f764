"""Nodes: heartbeats, inventory, credential revocation."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from modelforge_protocol import credentials

from chalicelib.config.settings import INVENTORY_RATE_WINDOW_SECONDS, Settings
from chalicelib.domain import liveness, requests
from chalicelib.domain.errors import Conflict, GuardFailed, RateLimited, conflict, not_found
from chalicelib.domain.records import TELEMETRY_COLUMNS, Event, Inventory, Node
from chalicelib.domain.validation import require_unique
from chalicelib.services import duplicate_identity
from chalicelib.services.auth import NodeCaller, require_holder
from chalicelib.services.known_callers import KnownCallers
from chalicelib.stores.contract import Stores

#: A transition heartbeat can lose a race with the sweep, an inventory replacement with another
#: replacement; each then retries from a fresh read.
_TRANSITION_ATTEMPTS = 3


def get(stores: Stores, node_id: str) -> Node:
    node = stores.nodes.get(node_id) if credentials.NODE_ID_RE.fullmatch(node_id) else None
    if node is None:
        raise not_found("node")
    return node


def _telemetry_rows(request: requests.Heartbeat) -> list[list[float]]:
    gpus = sorted(request.telemetry["gpus"], key=lambda gpu: gpu["index"])
    require_unique(gpus, "index", "telemetry/gpus")
    return [[gpu[column] for column in TELEMETRY_COLUMNS] for gpu in gpus]


@dataclass(frozen=True)
class HeartbeatResult:
    node: Node
    transitioned_from: str | None


def heartbeat(
    stores: Stores,
    settings: Settings,
    caller: NodeCaller,
    request: requests.Heartbeat,
    now: float,
    known: KnownCallers | None = None,
) -> HeartbeatResult:
    """Record a heartbeat: one conditional UpdateItem for a caller ``known`` to this instance.

    A caller not yet known is read first (one GetItem) and refused before anything is written:
    an unauthenticated heartbeat costs a read, never a write.
    """
    values = {
        "last_heartbeat_at": round(now, 3),
        "liveness": liveness.ONLINE,
        "liveness_shard": liveness.index_partition(liveness.ONLINE, caller.node_id),
        "heartbeat_bucket": liveness.bucket(now, settings.sweep_bucket_seconds),
        "health": request.health,
        "telemetry": _telemetry_rows(request),
        "agent_version": request.agent_version,
        "protocol_version": request.protocol_version,
    }
    known = known if known is not None else KnownCallers(capacity=1)
    key = (caller.node_id, caller.credential_sha256)
    if key in known:
        try:
            return HeartbeatResult(
                stores.nodes.record_heartbeat(caller.node_id, caller.credential_sha256, values), None
            )
        except GuardFailed:
            known.forget(key)  # revoked, or no longer online: read to answer precisely
    node = require_holder(stores.nodes.get(caller.node_id), caller)
    known.remember(key)
    for _ in range(_TRANSITION_ATTEMPTS):
        try:
            return _record(stores, caller, node, values, now)
        except GuardFailed:
            node = require_holder(stores.nodes.get(caller.node_id), caller)  # moved meanwhile: judge again
    raise Conflict("heartbeat_conflict", "the node changed concurrently; retry the heartbeat")


def _record(stores: Stores, caller: NodeCaller, node: Node, values: dict[str, Any], now: float) -> HeartbeatResult:
    """The steady update for an online node, else the logged transition to online."""
    if node.liveness == liveness.ONLINE:
        return HeartbeatResult(stores.nodes.record_heartbeat(caller.node_id, caller.credential_sha256, values), None)
    previous = node.liveness
    event = Event(
        "node.liveness_changed",
        {"node_id": caller.node_id, "from": previous, "to": liveness.ONLINE, "cause": "heartbeat"},
        now,
    )
    transition = {**values, "liveness_changed_at": round(now, 3)}
    stores.nodes.record_transition_heartbeat(caller.node_id, caller.credential_sha256, previous, transition, event)
    node.liveness = liveness.ONLINE
    return HeartbeatResult(node, previous)


def replace_inventory(
    stores: Stores, settings: Settings, caller: NodeCaller, request: requests.ReplaceInventory, now: float
) -> Inventory:
    """Replace a node's inventory, then reconcile its GPU claims and duplicate flags.

    The caller is read and checked before anything is written (an unknown caller costs one read,
    never a transaction). Each node may replace its inventory ``settings.inventory_rate_limit``
    times per window, so one node cannot write unlimited state-log objects.
    """
    node = require_holder(stores.nodes.get(caller.node_id), caller)
    uuids = duplicate_identity.gpu_uuids(request.inventory)
    for _ in range(_TRANSITION_ATTEMPTS):
        previous = stores.nodes.get_inventory(caller.node_id)
        values = {
            "inventory": request.inventory,
            "updated_at": round(now, 3),
            "revision": uuid.uuid4().hex,
            **_rate_window(settings, previous, now),
        }
        event = Event("inventory.replaced", {"node_id": caller.node_id}, now)
        try:
            stores.nodes.replace_inventory(
                caller.node_id,
                caller.credential_sha256,
                values,
                previous.revision if previous else None,
                event,
                capabilities=set(request.inventory["capabilities"]),
            )
        except GuardFailed:
            node = require_holder(stores.nodes.get(caller.node_id), caller)  # revoked meanwhile: 401
            continue  # another replacement moved first: judge the rate again from a fresh read
        duplicate_identity.reconcile_claims(stores, caller.node_id, values["revision"], uuids, now)
        duplicate_identity.detect_and_flag(
            stores, settings, caller.node_id, uuids, set(node.duplicate_partners or ()), now
        )
        return Inventory(caller.node_id, inventory=request.inventory, updated_at=values["updated_at"])
    raise Conflict("inventory_conflict", "the inventory changed concurrently; retry")


def _rate_window(settings: Settings, previous: Inventory | None, now: float) -> dict[str, Any]:
    """This replacement's place in the node's rate window, or 429 when the window is full."""
    start = previous.rate_window_start if previous else None
    if start is None or now - start >= INVENTORY_RATE_WINDOW_SECONDS or now < start:
        return {"rate_window_start": round(now, 3), "rate_window_count": 1}
    count = int(previous.rate_window_count or 0) if previous else 0
    if count >= settings.inventory_rate_limit:
        raise RateLimited(
            "inventory_rate_limited",
            f"this node replaced its inventory {count} times in {INVENTORY_RATE_WINDOW_SECONDS}s "
            f"(the limit); retry after the window ends",
            math.ceil(start + INVENTORY_RATE_WINDOW_SECONDS - now),
        )
    return {"rate_window_start": start, "rate_window_count": count + 1}


def revoke_credential(stores: Stores, node_id: str, now: float) -> Node:
    get(stores, node_id)
    values = {"credential_state": "revoked", "credential_revoked_at": round(now, 3)}
    try:
        stores.nodes.revoke_credential(node_id, values, Event("credential.revoked", {"node_id": node_id}, now))
    except GuardFailed:
        raise conflict("credential_already_revoked", "the node's credential is already revoked") from None
    return get(stores, node_id)
