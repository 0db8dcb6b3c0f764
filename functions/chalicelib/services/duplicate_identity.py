"""Duplicate identities: two live nodes reporting the same physical GPU.

The seed calls duplicate identities "the one thing the platform cannot untangle for you": a node
whose state volume is not durable comes back as a new node while the old one still looks alive.
Each inventory records one claim per GPU UUID (gpu_claims table, reconciled after every
replacement). After a report, the claims of the node's UUIDs show every other node reporting one
of them: live ones (not offline, credential active) are flagged as partners on both sides, and
partners that no longer share any UUID are unflagged on both sides, each change a set addition or
deletion with its state-log event. Readiness re-checks liveness at read time.

Two agents on one identity (a cloned disk or state volume, a leftover agent): each agent process
sends a random ``agent_instance_id``. The node item keeps a short ``InstanceState``; the steady
heartbeat's one update writes none of it and is guarded by "the stored instance starts with this
one's fingerprint". Only a heartbeat from another instance (or a caller this Lambda instance has
not seen) fails or skips that guard; it is judged after the read it already costs
(``judge_instance``) and its one write records what changed. A restart changes the instance once;
heartbeats that go back to the instance before within ``INSTANCE_WINDOW_INTERVALS`` heartbeat
intervals come from two live agents, and the same write records when. No heartbeat costs an extra
write, and a node with one agent stores 10 bytes for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
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
#: The node item keeps this much of an instance id (32 bits: two agents look alike once in 4e9).
FINGERPRINT_CHARS = 8


@dataclass(frozen=True)
class InstanceState:
    """What the node item keeps of its agent processes, as one short string: the current one's
    fingerprint, and after a change the one before, when (whole seconds) and when heartbeats last
    went back to that one within the window."""

    current: str
    previous: str | None = None
    switched_at: int | None = None
    flagged_at: int | None = None

    def stored(self) -> str:
        if self.previous is None:
            return self.current
        flagged = "" if self.flagged_at is None else f".{self.flagged_at}"
        return f"{self.current}.{self.previous}.{self.switched_at}{flagged}"

    @staticmethod
    def of(stored: str | None) -> InstanceState | None:
        if not stored:
            return None
        parts = stored.split(".")
        times = [int(part) for part in parts[2:4] if part.isdigit()]
        return InstanceState(
            parts[0],
            parts[1] if len(parts) > 1 else None,
            times[0] if times else None,
            times[1] if len(times) > 1 else None,
        )


def fingerprint(instance_id: str | None) -> str | None:
    return None if instance_id is None else instance_id[:FINGERPRINT_CHARS]


def instance_window_seconds(settings: Settings) -> float:
    return float(INSTANCE_WINDOW_INTERVALS * settings.heartbeat_interval_seconds)


def _recent(at: int | None, window: float, now: float) -> bool:
    return at is not None and now - at <= window


def judge_instance(beat: Heartbeat, node: Node, settings: Settings, now: float) -> Heartbeat:
    """``beat`` as written over ``node`` (just read), with what ``node.agent_instance`` becomes.
    The same instance keeps it (cleared to its fingerprint once the window passed); another
    records the change; going back to the one before within the window sets the flag's time."""
    new = beat.instance_fingerprint
    if new is None:  # an agent older than the field (or its first heartbeat): nothing to judge
        return beat
    window, state = instance_window_seconds(settings), InstanceState.of(node.agent_instance)
    if state is None or state.current == new:
        settled = state is None or not (
            _recent(state.switched_at, window, now) or _recent(state.flagged_at, window, now)
        )
        kept = InstanceState(new) if settled or state is None else state
        return _judged(beat, kept)
    went_back = state.previous == new and _recent(state.switched_at, window, now)
    flagged = int(now) if went_back else (state.flagged_at if _recent(state.flagged_at, window, now) else None)
    return _judged(beat, InstanceState(new, state.current, int(now), flagged))


def _judged(beat: Heartbeat, state: InstanceState) -> Heartbeat:
    """Written after a read: no fingerprint guard (the read decided), the state set."""
    return replace(beat, instance_fingerprint=None, agent_instance=state.stored())


def duplicate_instances_at(node: Node, settings: Settings, now: float) -> float | None:
    """When the node's heartbeats last went back to an earlier agent instance, while that is within
    the window; None otherwise."""
    state = InstanceState.of(node.agent_instance)
    flagged = None if state is None else state.flagged_at
    return float(flagged) if flagged is not None and _recent(flagged, instance_window_seconds(settings), now) else None


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
