"""The scheduled liveness sweep: load, decide, then apply each transition with a guarded write.

Access pattern: the node store reads only the nodes that are late (``late_nodes``: an index read,
not the whole fleet); the mass-outage guard reads one counter item. A failed guard means the node
moved first (a heartbeat arrived): skip it, never overwrite.

Work leases: each sweep takes back leases that expired (``expired_leases``: one query), and a
node it marks offline loses its leases at once (``work.release_node``); each release is fenced by
the item's epoch, so a holder that renewed or finished first wins.

Node retention: with ``MODELFORGE_NODE_RETENTION_DAYS`` set, each sweep also removes up to
``node_removal.RETIRED_PER_SWEEP`` nodes offline for longer than that (``node_removal.retire_offline``).

Mass-outage guard: when more than ``mass_stale_fraction`` of the online nodes (and at least
``MASS_STALE_MIN_NODES`` of them) would go stale in one sweep, the likely cause is on the
control-plane side (its network, a missed schedule). The sweep then holds every transition,
records the hold (node reads show it) and logs ``mass_stale_held`` once; it releases when the
condition clears. The hold item and the online-node counter are read, decided on, then written
only if their revision is still the one read: when two sweeps overlap, the first write wins and
the other skips (a sweep that lost a release to another sweep's hold holds too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chalicelib.config.settings import Settings
from chalicelib.domain import liveness
from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import MASS_STALE_HOLD, ONLINE_NODES, ControlItem, Event
from chalicelib.services import node_removal, work
from chalicelib.stores.contract import Stores

log = logging.getLogger("modelforge.sweep")

MASS_STALE_MIN_NODES = 10


@dataclass(frozen=True)
class SweepReport:
    items_read: int
    stale_candidates: int
    offline_candidates: int
    transitioned: int
    skipped: int
    held: bool
    #: work leases that expired and were taken back (re-queued or dead)
    leases_expired: int = 0
    #: work leases taken from nodes this sweep marked offline
    leases_released: int = 0
    #: nodes removed for being offline longer than MODELFORGE_NODE_RETENTION_DAYS (node_removal.py)
    nodes_removed: int = 0


def run(stores: Stores, settings: Settings, now: float, *, clock: Callable[[], float] = time.time) -> SweepReport:
    """One sweep at ``now``. ``clock`` stamps the events of the control items (hold, counter)
    with the time of their write, so that replay orders them after every change they read."""
    stale_cutoff = now - settings.stale_after_seconds
    offline_cutoff = now - settings.offline_after_seconds
    to_stale = stores.nodes.late_nodes(liveness.ONLINE, stale_cutoff)
    to_offline = stores.nodes.late_nodes(liveness.STALE, offline_cutoff)
    items_read = len(to_stale) + len(to_offline)

    decided, online_count = False, None
    if len(to_stale) >= MASS_STALE_MIN_NODES:
        online_count, read = _online_nodes(stores, now, clock, at_least=len(to_stale))
        items_read += read
        decided = len(to_stale) > settings.mass_stale_fraction * online_count
    held = _record_hold(stores, now, clock, decided, {"would_go_stale": len(to_stale), "online": online_count})
    if held:
        # leases too: renewals failed for the same reason heartbeats did, so the holders may be
        # working still; their leases are taken back once the hold is released
        return SweepReport(items_read, len(to_stale), len(to_offline), 0, 0, True)

    transitioned = skipped = released = 0
    for node_ids, source, target, cutoff in (
        (to_stale, liveness.ONLINE, liveness.STALE, stale_cutoff),
        (to_offline, liveness.STALE, liveness.OFFLINE, offline_cutoff),
    ):
        for node_id in node_ids:
            if _transition(stores, now, node_id, source, target, cutoff):
                transitioned += 1
                if target == liveness.OFFLINE:
                    released += work.release_node(stores, node_id, now)
            else:
                skipped += 1
    expired = work.release_expired(stores, now)
    removed = node_removal.retire_offline(stores, settings, now)
    return SweepReport(
        items_read, len(to_stale), len(to_offline), transitioned, skipped, False, expired, released, removed
    )


def _online_nodes(stores: Stores, now: float, clock: Callable[[], float], at_least: int) -> tuple[int, int]:
    """(online nodes, items read): one counter item; a full recount only if the counter is
    missing or cannot be right (fewer online nodes than are about to go stale)."""
    counter = stores.control.get(ONLINE_NODES)
    counted = None if counter is None or counter.count is None else int(counter.count)
    if counted is not None and counted >= at_least:
        return counted, 1
    recount = stores.nodes.count_in_state(liveness.ONLINE)
    _repair_online_counter(stores, now, clock, counter, recount)
    return recount, 1 + recount


def repair_online_counter(stores: Stores, now: float, *, clock: Callable[[], float] = time.time) -> int:
    """Count the online nodes and set the counter to it (e.g. after nodes were written straight
    into the table); the count, whether or not the repair was written."""
    counter = stores.control.get(ONLINE_NODES)
    recount = stores.nodes.count_in_state(liveness.ONLINE)
    _repair_online_counter(stores, now, clock, counter, recount)
    return recount


def _repair_online_counter(
    stores: Stores, now: float, clock: Callable[[], float], counter: ControlItem | None, recount: int
) -> bool:
    """Apply the repair, guarded by the counter's revision as read before the count; False when
    a transition moved the counter meanwhile (its own ADD keeps it right: skip)."""
    was = None if counter is None or counter.count is None else int(counter.count)
    event = Event("sweep.online_counter_repaired", {"control": ONLINE_NODES}, _write_time(now, clock))
    try:
        stores.control.recount_online_nodes(counter, recount, now, event)
    except GuardFailed:
        log.info(
            "online node counter moved during the recount; repair skipped",
            extra={"event": "online_counter_repair_skipped"},
        )
        return False
    log.warning("online node counter repaired", extra={"event": "online_counter_repaired", "was": was, "now": recount})
    return True


def _transition(stores: Stores, now: float, node_id: str, source: str, target: str, cutoff: float) -> bool:
    event = Event("node.liveness_changed", {"node_id": node_id, "from": source, "to": target, "cause": "sweep"}, now)
    try:
        stores.nodes.change_liveness(node_id, source, target, cutoff, now, event)
    except GuardFailed:
        return False  # a heartbeat arrived (or another sweep moved it) first
    log.info(
        "liveness transition",
        extra={"event": "node_liveness_changed", "node_id": node_id, "from": source, "to": target},
    )
    return True


def _record_hold(stores: Stores, now: float, clock: Callable[[], float], held: bool, detail: dict[str, Any]) -> bool:
    """Write the hold item only when it changes, guarded by the revision read; log the change once.

    Whether the hold is in force: ``held``, or another sweep's hold that moved first."""
    current = stores.control.get(MASS_STALE_HOLD)
    if bool(current and current.active) == held:
        return held
    read_revision = None if current is None or current.revision is None else int(current.revision)
    item = ControlItem(
        MASS_STALE_HOLD,
        active=held,
        since=round(now, 3) if held else None,
        detail=detail,
        updated_at=round(now, 3),
        revision=(read_revision or 0) + 1,
    )
    event_type = "sweep.mass_stale_held" if held else "sweep.mass_stale_released"
    event = Event(event_type, {"control": MASS_STALE_HOLD}, _write_time(now, clock))
    try:
        stores.control.put(item, event)
    except GuardFailed:
        # another sweep wrote the hold since we read it: its write stands, ours is skipped
        latest = stores.control.get(MASS_STALE_HOLD)
        log.info("mass stale hold moved by another sweep; skipped", extra={"event": "mass_stale_hold_skipped"})
        return held or bool(latest and latest.active)
    log.warning(
        "mass stale held: liveness transitions paused" if held else "mass stale released",
        extra={"event": "mass_stale_held" if held else "mass_stale_released", **detail},
    )
    return held


def _write_time(now: float, clock: Callable[[], float]) -> float:
    """When a read-decide-write of a control item is written: replay applies events by time, and
    this event must come after every change the sweep read (which may be later than ``now``)."""
    return max(now, clock())


def report_dict(report: SweepReport) -> dict[str, Any]:
    return asdict(report)
