"""Duplicate identities: two live nodes reporting the same physical GPU.

The seed calls duplicate identities "the one thing the platform cannot untangle for you": a node
whose state volume is not durable comes back as a new node while the old one still looks alive.
Each inventory records one claim per GPU UUID (gpu_claims table, reconciled after every
replacement). After a report, the claims of the node's UUIDs show every other node reporting one
of them: live ones (not offline, credential active) are flagged as partners on both sides, and
partners that no longer share any UUID are unflagged on both sides, each change a set addition or
deletion with its state-log event. Readiness re-checks liveness at read time.
"""

from __future__ import annotations

from typing import Any, Iterator, TypeVar

from . import liveness, node_store
from .errors import GuardFailed
from .models import GpuClaimModel, InventoryModel, NodeModel
from .settings import Settings
from .state_log import delete_change, outbox_item, put_change, update_change
from .transactions import MAX_TRANSACTION_ITEMS

T = TypeVar("T")
#: One transaction updates the node, each partner, and writes the event.
_PARTNERS_PER_TRANSACTION = MAX_TRANSACTION_ITEMS - 2


def claims(node_id: str, inventory: dict[str, Any], now: float) -> list[GpuClaimModel]:
    return [GpuClaimModel(gpu["uuid"], node_id, claimed_at=round(now, 3)) for gpu in inventory["gpus"]]


def gpu_uuids(inventory: dict[str, Any] | None) -> list[str]:
    return sorted(gpu["uuid"] for gpu in (inventory or {}).get("gpus", []))


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def reconcile_claims(settings: Settings, node_id: str, revision: str, uuids: list[str], now: float) -> None:
    """Make the node's claims exactly ``uuids``, as computed for inventory ``revision``.

    Reads what the inventory records as claimed (consistently: it changes only with the claims,
    in one transaction), then writes the difference in transactions of bounded size, each guarded
    by "the inventory is still this revision". A failed guard means a newer replacement moved
    first and reconciles for itself: stop, never overwrite.
    """
    current = node_store.get_inventory(node_id)
    if current is None or current.revision != revision:
        return
    claimed, wanted = set(current.claimed_uuids or ()), set(uuids)
    # additions and deletions go in separate transactions: one update expression cannot both
    # ADD to and DELETE from the same set
    batches = [(uuids_, True) for uuids_ in _chunks(sorted(wanted - claimed), node_store.CLAIM_CHANGES_PER_TRANSACTION)]
    batches += [(uuids_, False) for uuids_ in _chunks(sorted(claimed - wanted), node_store.CLAIM_CHANGES_PER_TRANSACTION)]
    for batch, adding in batches:
        claims_ = [GpuClaimModel(uuid, node_id, claimed_at=round(now, 3)) if adding else GpuClaimModel(uuid, node_id) for uuid in batch]
        part = "add" if adding else "delete"
        record = update_change(InventoryModel, node_id, {}, **{part: {"claimed_uuids": set(batch)}})
        event = outbox_item(
            event_type="gpu_claims.changed",
            now=now,
            subject={"node_id": node_id, part: ",".join(batch)},
            changes=[*map(put_change if adding else delete_change, claims_), record],
            retention_seconds=settings.outbox_retention_seconds,
        )
        try:
            node_store.change_claims(node_id, revision, claims_, adding, event)
        except GuardFailed:
            return


def sharing_nodes(node_id: str, uuids: list[str]) -> dict[str, list[str]]:
    """Other nodes with a claim on one of ``uuids`` (node id -> the shared UUIDs)."""
    shared: dict[str, list[str]] = {}
    for uuid in uuids:
        for other in node_store.claimants(uuid):
            if other != node_id:
                shared.setdefault(other, []).append(uuid)
    return shared


def _is_live(node: NodeModel | None, settings: Settings, now: float) -> bool:
    if node is None or node.credential_state != "active":
        return False
    state = liveness.derive(node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds)
    return state != liveness.OFFLINE


def live_duplicates(settings: Settings, node_id: str, uuids: list[str], now: float) -> dict[str, list[str]]:
    """Other nodes, not offline and with an active credential, that report one of ``uuids``
    (node id -> the shared UUIDs)."""
    return _live(sharing_nodes(node_id, uuids), settings, now)


def _live(shared: dict[str, list[str]], settings: Settings, now: float) -> dict[str, list[str]]:
    return {other: shared[other] for other in sorted(shared) if _is_live(node_store.get(other), settings, now)}


def detect_and_flag(settings: Settings, node_id: str, uuids: list[str], partners_before: set[str], now: float) -> list[str]:
    """After ``node_id`` reported ``uuids``: flag new live duplicates, unflag former partners
    that share no UUID any more (both sides each time). Returns the partners flagged now."""
    shared = sharing_nodes(node_id, uuids)
    live = _live(shared, settings, now)
    new = sorted(set(live) - partners_before)
    gone = sorted(partners_before - set(shared))
    for chunk in _chunks(new, _PARTNERS_PER_TRANSACTION):
        _link(settings, node_id, chunk, {other: live[other] for other in chunk}, now)
    for chunk in _chunks(gone, _PARTNERS_PER_TRANSACTION):
        _unlink(settings, node_id, chunk, now)
    return new


def _link(settings: Settings, node_id: str, partners: list[str], shared: dict[str, list[str]], now: float) -> None:
    stamp = round(now, 3)
    changes = [
        update_change(NodeModel, target, {}, add={"duplicate_partners": others}, set_if_absent={"duplicate_suspected_at": stamp})
        for target, others in node_store.both_sides(node_id, partners)
    ]
    event = outbox_item(
        event_type="node.duplicate_suspected",
        now=now,
        # the reporting node is named: when a node plants another's GPU UUID, the log says which
        subject={
            "node_id": node_id,
            "reported_by": node_id,
            "others": ",".join(partners),
            "gpu_uuids": ",".join(sorted({uuid for uuids in shared.values() for uuid in uuids})),
        },
        changes=changes,
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        node_store.link_duplicates(node_id, partners, stamp, event)
    except GuardFailed:
        pass  # a node was deleted meanwhile: nothing to flag


def _unlink(settings: Settings, node_id: str, partners: list[str], now: float) -> None:
    changes = [
        update_change(NodeModel, target, {}, delete={"duplicate_partners": others})
        for target, others in node_store.both_sides(node_id, partners)
    ]
    event = outbox_item(
        event_type="node.duplicate_cleared",
        now=now,
        subject={"node_id": node_id, "others": ",".join(partners), "cause": "no shared GPU UUID"},
        changes=changes,
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        node_store.unlink_duplicates(node_id, partners, event)
    except GuardFailed:
        return
    for target in (node_id, *partners):
        forget = outbox_item(
            event_type="node.duplicate_flag_cleared",
            now=now,
            subject={"node_id": target},
            changes=[update_change(NodeModel, target, {"duplicate_suspected_at": None})],
            retention_seconds=settings.outbox_retention_seconds,
        )
        try:
            node_store.forget_duplicate_time(target, forget)
        except GuardFailed:
            continue  # another partner remains: the flag and its time stay
