"""Duplicate identities: two live nodes reporting the same physical GPU.

The seed calls duplicate identities "the one thing the platform cannot untangle for you": a node
whose state volume is not durable comes back as a new node while the old one still looks alive.
Each inventory records one claim per GPU UUID (gpu_claims table, reconciled after every
replacement). After a report, the claims of the node's UUIDs show every other node reporting one
of them: live ones (not offline, credential active) are flagged as partners on both sides, and
partners that no longer share any UUID are unflagged on both sides, each change a set addition or
deletion with its state-log event. Readiness re-checks liveness at read time.

Two agents on one identity (a cloned disk or state volume, a leftover agent): each agent process
sends a random ``agent_instance_id``. The heartbeat's one update keeps it, guarded by "the stored
one is this one"; only a heartbeat from another instance fails that guard, and is then judged
(``judge_instance``) and written with what changed: the instance before and when. A restart
changes the instance once; heartbeats that go back to the instance before within
``INSTANCE_WINDOW_INTERVALS`` heartbeat intervals come from two live agents, and the same write
records when (``duplicate_instance_at``). No heartbeat costs an extra write for this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, TypeVar

from chalicelib.config.settings import Settings
from chalicelib.domain import liveness
from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import Event, Heartbeat, Node
from chalicelib.stores.contract import CLAIM_CHANGES_PER_WRITE, PARTNERS_PER_WRITE, Stores

T = TypeVar("T")


#: Heartbeats that go back to the agent instance before within this many heartbeat intervals come
#: from two agents; the flag shows for as long after the last such heartbeat.
INSTANCE_WINDOW_INTERVALS = 3


def instance_window_seconds(settings: Settings) -> float:
    return float(INSTANCE_WINDOW_INTERVALS * settings.heartbeat_interval_seconds)


def judge_instance(beat: Heartbeat, node: Node, settings: Settings, now: float) -> Heartbeat:
    """``beat`` as written over ``node`` (just read): guarded by the stored instance, and, when the
    instance changed, with the one before, the time, and the flag's time when it went back to the
    instance before within the window."""
    new, old = beat.agent_instance_id, node.agent_instance_id
    if new is None:  # an agent older than the field (or its first heartbeat): nothing to judge
        return replace(beat, instance_guard=None)
    if old is None or old == new:
        return replace(beat, instance_guard=new)
    went_back = (
        node.agent_instance_previous == new
        and node.agent_instance_switched_at is not None
        and now - node.agent_instance_switched_at <= instance_window_seconds(settings)
    )
    return replace(
        beat,
        instance_guard=old,
        agent_instance_previous=old,
        agent_instance_switched_at=now,
        duplicate_instance_at=now if went_back else None,
    )


def duplicate_instances_at(node: Node, settings: Settings, now: float) -> float | None:
    """When the node's heartbeats last went back to an earlier agent instance, while that is within
    the window; None otherwise."""
    at = node.duplicate_instance_at
    return at if at is not None and now - at <= instance_window_seconds(settings) else None


def gpu_uuids(inventory: dict[str, Any] | None) -> list[str]:
    return sorted(gpu["uuid"] for gpu in (inventory or {}).get("gpus", []))


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def reconcile_claims(stores: Stores, node_id: str, revision: str, uuids: list[str], now: float) -> None:
    """Make the node's claims exactly ``uuids``, as computed for inventory ``revision``.

    Reads what the inventory records as claimed (consistently: it changes only with the claims,
    in one write), then writes the difference in writes of bounded size, each guarded by "the
    inventory is still this revision". A failed guard means a newer replacement moved first and
    reconciles for itself: stop, never overwrite.
    """
    current = stores.nodes.get_inventory(node_id)
    if current is None or current.revision != revision:
        return
    claimed, wanted = set(current.claimed_uuids or ()), set(uuids)
    # additions and deletions go in separate writes: one update expression cannot both ADD to
    # and DELETE from the same set
    batches = [(batch, True) for batch in _chunks(sorted(wanted - claimed), CLAIM_CHANGES_PER_WRITE)]
    batches += [(batch, False) for batch in _chunks(sorted(claimed - wanted), CLAIM_CHANGES_PER_WRITE)]
    for batch, adding in batches:
        part = "add" if adding else "delete"
        event = Event("gpu_claims.changed", {"node_id": node_id, part: ",".join(batch)}, now)
        try:
            stores.nodes.change_claims(node_id, revision, batch, adding, now, event)
        except GuardFailed:
            return


def sharing_nodes(stores: Stores, node_id: str, uuids: list[str]) -> dict[str, list[str]]:
    """Other nodes with a claim on one of ``uuids`` (node id -> the shared UUIDs)."""
    shared: dict[str, list[str]] = {}
    for uuid in uuids:
        for other in stores.nodes.claimants(uuid):
            if other != node_id:
                shared.setdefault(other, []).append(uuid)
    return shared


def _is_live(node: Node | None, settings: Settings, now: float) -> bool:
    if node is None or node.credential_state != "active":
        return False
    state = liveness.derive(node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds)
    return state != liveness.OFFLINE


def live_duplicates(
    stores: Stores, settings: Settings, node_id: str, uuids: list[str], now: float
) -> dict[str, list[str]]:
    """Other nodes, not offline and with an active credential, that report one of ``uuids``
    (node id -> the shared UUIDs)."""
    return _live(stores, sharing_nodes(stores, node_id, uuids), settings, now)


def _live(stores: Stores, shared: dict[str, list[str]], settings: Settings, now: float) -> dict[str, list[str]]:
    return {other: shared[other] for other in sorted(shared) if _is_live(stores.nodes.get(other), settings, now)}


def detect_and_flag(
    stores: Stores, settings: Settings, node_id: str, uuids: list[str], partners_before: set[str], now: float
) -> list[str]:
    """After ``node_id`` reported ``uuids``: flag new live duplicates, unflag former partners
    that share no UUID any more (both sides each time). Returns the partners flagged now."""
    shared = sharing_nodes(stores, node_id, uuids)
    live = _live(stores, shared, settings, now)
    new = sorted(set(live) - partners_before)
    gone = sorted(partners_before - set(shared))
    for chunk in _chunks(new, PARTNERS_PER_WRITE):
        _link(stores, node_id, chunk, {other: live[other] for other in chunk}, now)
    for chunk in _chunks(gone, PARTNERS_PER_WRITE):
        _unlink(stores, node_id, chunk, now)
    return new


def _link(stores: Stores, node_id: str, partners: list[str], shared: dict[str, list[str]], now: float) -> None:
    event = Event(
        "node.duplicate_suspected",
        # the reporting node is named: when a node plants another's GPU UUID, the log says which
        {
            "node_id": node_id,
            "reported_by": node_id,
            "others": ",".join(partners),
            "gpu_uuids": ",".join(sorted({uuid for uuids in shared.values() for uuid in uuids})),
        },
        now,
    )
    with contextlib.suppress(GuardFailed):  # a node was deleted meanwhile: nothing to flag
        stores.nodes.link_duplicates(node_id, partners, now, event)


def _unlink(stores: Stores, node_id: str, partners: list[str], now: float) -> None:
    event = Event(
        "node.duplicate_cleared", {"node_id": node_id, "others": ",".join(partners), "cause": "no shared GPU UUID"}, now
    )
    try:
        stores.nodes.unlink_duplicates(node_id, partners, event)
    except GuardFailed:
        return
    for target in (node_id, *partners):
        try:
            stores.nodes.forget_duplicate_time(target, Event("node.duplicate_flag_cleared", {"node_id": target}, now))
        except GuardFailed:
            continue  # another partner remains: the flag and its time stay
