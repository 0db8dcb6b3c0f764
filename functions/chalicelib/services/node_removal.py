"""Removing a node: an admin's delete, and the sweep's node retention (``MODELFORGE_NODE_RETENTION_DAYS``).

A node may be removed when its credential is revoked or it is offline (its last heartbeat is
older than the offline threshold); any other node is refused with ``node_not_removable``, which
says why and what to do. Everything keyed by the node goes with it in one logged transaction
(``node.deleted``, which replay applies): the node item (its credential, liveness, channel
connection and ticket, slot counters and GPU block bits), its inventory (the GPU state and its
latches included), its GPU claims, its enrollment record, its park items, and its id from each
duplicate partner's flags. Then its channel connection is closed, and its leases are taken back
as the sweep takes back an offline node's (``work.release_node``): each release is fenced by the
item's epoch, so a late complete from the deleted node changes nothing (its credential no longer
authenticates either: the node is unknown). Should the process stop between the two, the leases
expire and the sweep takes them back.

Node retention: each sweep removes at most ``RETIRED_PER_SWEEP`` nodes that have been persisted
offline for longer than the retention (read from the offline partitions of the sweep's index: a
bounded read), as GitHub removes runners offline for 14 days. Unset, nothing is removed.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from chalicelib.config.settings import Settings
from chalicelib.domain import liveness
from chalicelib.domain.errors import Conflict, GuardFailed, NotFound, conflict
from chalicelib.domain.records import Event, Inventory, Node
from chalicelib.services import dispatch, duplicate_identity, nodes, work
from chalicelib.stores.contract import NODE_DELETE_PARTS, Stores

log = logging.getLogger("modelforge.nodes")

#: The most nodes one sweep removes for retention (the rest wait for the next sweep).
RETIRED_PER_SWEEP = 25
#: How often a delete re-reads and retries when the node changed between its read and its write.
_ATTEMPTS = 3
REVOKED, OFFLINE = "credential_revoked", "offline"


@dataclass(frozen=True)
class Removed:
    node_id: str
    #: why it could be removed: credential_revoked | offline
    reason: str
    #: leases it held that went back to the queue (or died)
    leases_released: int


def removable_reason(node: Node, settings: Settings, now: float) -> str | None:
    """Why ``node`` may be removed now (its credential is revoked, or it is offline); None: it may not."""
    if node.credential_state == "revoked":
        return REVOKED
    status = liveness.derive(node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds)
    return OFFLINE if status == liveness.OFFLINE else None


def delete(
    stores: Stores, settings: Settings, node_id: str, now: float, *, offline_before: float | None = None
) -> Removed:
    """Remove the node and everything of it (an admin's delete; ``offline_before``: the sweep's
    retention, which removes only a node persisted offline since then)."""
    for _ in range(_ATTEMPTS):
        node = nodes.get(stores, node_id)
        reason = removable_reason(node, settings, now)
        if reason is None:
            status = liveness.derive(
                node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds
            )
            raise conflict(
                "node_not_removable",
                f"the node is {status} and its credential is active: revoke its credential first "
                "(modelforge nodes revoke-credential), or wait until it is offline",
            )
        if offline_before is not None and not (
            node.liveness == liveness.OFFLINE and node.liveness_changed_at <= offline_before
        ):
            raise conflict("node_not_removable", "the node has not been offline for the whole retention")
        inventory = _within_limit(stores, node, now)
        event = Event("node.deleted", {"node_id": node_id, "reason": reason}, now)
        try:
            stores.nodes.delete_node(node, inventory, now - settings.offline_after_seconds, event)
        except GuardFailed:
            continue  # it heartbeated, reported an inventory or was flagged meanwhile: read again
        dispatch.close(stores, node)
        released = work.release_node(stores, node_id, now)
        log.info(
            "node deleted",
            extra={"event": "node_deleted", "node_id": node_id, "reason": reason, "leases_released": released},
        )
        return Removed(node_id, reason, released)
    raise Conflict("node_conflict", "the node changed while it was being deleted; retry")


def _within_limit(stores: Stores, node: Node, now: float) -> Inventory | None:
    """The node's inventory, once its claims and partners fit one deletion: a node past the limit
    first drops its claims (``reconcile_claims`` to none), then unflags partners, in bounded writes."""
    inventory = stores.nodes.get_inventory(node.node_id)
    claimed = len(inventory.claimed_uuids or ()) if inventory else 0
    partners = sorted(node.duplicate_partners or ())
    if claimed + len(partners) <= NODE_DELETE_PARTS:
        return inventory
    if inventory is not None and inventory.revision is not None and claimed:
        duplicate_identity.reconcile_claims(stores, node.node_id, inventory.revision, [], now)
    excess = max(0, len(partners) - NODE_DELETE_PARTS)
    for start in range(0, excess, NODE_DELETE_PARTS):
        batch = partners[start : min(excess, start + NODE_DELETE_PARTS)]
        event = Event("node.duplicate_cleared", {"node_id": node.node_id, "cause": "node deleted"}, now)
        with contextlib.suppress(GuardFailed):  # a partner went away meanwhile: the deletion's guard reads again
            stores.nodes.unlink_duplicates(node.node_id, batch, event)
    node.duplicate_partners = set(partners[excess:]) or None
    return stores.nodes.get_inventory(node.node_id)


def retire_offline(stores: Stores, settings: Settings, now: float) -> int:
    """The sweep's node retention: remove up to ``RETIRED_PER_SWEEP`` nodes offline for longer than
    ``settings.node_retention_days``; how many were removed (none when the retention is unset)."""
    if settings.node_retention_days is None:
        return 0
    cutoff = now - settings.node_retention_days * 86400
    removed = 0
    for node_id in stores.nodes.offline_since(cutoff, RETIRED_PER_SWEEP):
        try:
            delete(stores, settings, node_id, now, offline_before=cutoff)
        except (Conflict, NotFound):
            continue  # back online, or removed by an admin or another sweep meanwhile
        removed += 1
    return removed
