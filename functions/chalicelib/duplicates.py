"""Duplicate identities: two live nodes reporting the same physical GPU.

The seed calls duplicate identities "the one thing the platform cannot untangle for you": a node
whose state volume is not durable comes back as a new node while the old one still looks alive.
Each inventory write records one claim per GPU UUID (gpu_claims table); after the write, the
claims of the node's UUIDs show any other node that is not offline, and both are flagged, with
the transition in the state log. Readiness re-checks at read time.
"""

from __future__ import annotations

from typing import Any

from . import liveness, node_store
from .errors import GuardFailed
from .models import GpuClaimModel, NodeModel
from .settings import Settings
from .state_log import outbox_item, update_change


def claims(node_id: str, inventory: dict[str, Any], now: float) -> list[GpuClaimModel]:
    return [GpuClaimModel(gpu["uuid"], node_id, claimed_at=round(now, 3)) for gpu in inventory["gpus"]]


def gpu_uuids(inventory: dict[str, Any] | None) -> list[str]:
    return sorted(gpu["uuid"] for gpu in (inventory or {}).get("gpus", []))


def live_duplicates(settings: Settings, node_id: str, uuids: list[str], now: float) -> dict[str, list[str]]:
    """Other nodes, not offline and with an active credential, that report one of ``uuids``
    (node id -> the shared UUIDs)."""
    shared: dict[str, list[str]] = {}
    for uuid in uuids:
        for other in node_store.claimants(uuid):
            if other != node_id:
                shared.setdefault(other, []).append(uuid)
    live = {}
    for other, other_uuids in sorted(shared.items()):
        node = node_store.get(other)
        if node is None or node.credential_state != "active":
            continue
        state = liveness.derive(node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds)
        if state != liveness.OFFLINE:
            live[other] = other_uuids
    return live


def detect_and_flag(settings: Settings, node_id: str, uuids: list[str], now: float) -> list[str]:
    """Flag this node and each live duplicate of it; clear this node's flag when none is left."""
    live = live_duplicates(settings, node_id, uuids, now)
    node = node_store.get(node_id)
    if node is None:
        return []
    current = sorted(node.duplicate_suspected or [])
    if sorted(live) == current:
        return current
    updates = {node_id: {"duplicate_suspected": sorted(live) or None}}
    for other in live:
        partner = node_store.get(other)
        if partner is not None and node_id not in (partner.duplicate_suspected or []):
            updates[other] = {"duplicate_suspected": sorted({*(partner.duplicate_suspected or []), node_id})}
    event = outbox_item(
        event_type="node.duplicate_suspected" if live else "node.duplicate_cleared",
        now=now,
        subject={"node_id": node_id, "others": ",".join(sorted(live)), "gpu_uuids": ",".join(sorted({u for us in live.values() for u in us}))},
        changes=[update_change(NodeModel, key, values) for key, values in updates.items()],
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        node_store.flag_duplicates(updates, event)
    except GuardFailed:
        return current
    return sorted(live)
