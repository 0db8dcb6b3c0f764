"""The scheduled liveness sweep: load, decide, then apply each transition with a guarded write.

Access pattern: the keys-only ``by_liveness`` index, partitioned by state and shard and sorted
by heartbeat bucket. The sweep queries only buckets older than each threshold, so it reads the
nodes that are late, not the whole fleet; the mass-outage guard reads one counter item. A failed guard means the node moved first (a heartbeat
arrived): skip it, never overwrite.

Mass-outage guard: when more than ``mass_stale_fraction`` of the online nodes (and at least
``MASS_STALE_MIN_NODES`` of them) would go stale in one sweep, the likely cause is on the
control-plane side (its network, a missed schedule). The sweep then holds every transition,
records the hold (node reads show it) and logs ``mass_stale_held`` once; it releases when the
condition clears.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from . import control_store, liveness, node_store
from .errors import GuardFailed
from .models import ControlModel, NodeModel
from .settings import Settings
from .state_log import outbox_item, put_change, update_change

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


def run(settings: Settings, now: float) -> SweepReport:
    stale_cutoff = now - settings.stale_after_seconds
    offline_cutoff = now - settings.offline_after_seconds
    to_stale = node_store.late_nodes(liveness.ONLINE, stale_cutoff, liveness.SHARDS)
    to_offline = node_store.late_nodes(liveness.STALE, offline_cutoff, liveness.SHARDS)
    items_read = len(to_stale) + len(to_offline)

    held, online_count = False, None
    if len(to_stale) >= MASS_STALE_MIN_NODES:
        online_count, read = _online_nodes(now, at_least=len(to_stale))
        items_read += read
        held = len(to_stale) > settings.mass_stale_fraction * online_count
    _record_hold(settings, now, held, {"would_go_stale": len(to_stale), "online": online_count})
    if held:
        return SweepReport(items_read, len(to_stale), len(to_offline), 0, 0, True)

    transitioned = skipped = 0
    for node_ids, source, target, cutoff in (
        (to_stale, liveness.ONLINE, liveness.STALE, stale_cutoff),
        (to_offline, liveness.STALE, liveness.OFFLINE, offline_cutoff),
    ):
        for node_id in node_ids:
            if _transition(settings, now, node_id, source, target, cutoff):
                transitioned += 1
            else:
                skipped += 1
    return SweepReport(items_read, len(to_stale), len(to_offline), transitioned, skipped, False)


def _online_nodes(now: float, at_least: int) -> tuple[int, int]:
    """(online nodes, items read): one counter item; a full recount only if the counter is
    missing or cannot be right (fewer online nodes than are about to go stale)."""
    counted = control_store.online_nodes()
    if counted is not None and counted >= at_least:
        return counted, 1
    recount = node_store.count_in_state(liveness.ONLINE, liveness.SHARDS)
    control_store.recount_online_nodes(recount, now)
    log.warning("online node counter repaired", extra={"event": "online_counter_repaired", "was": counted, "now": recount})
    return recount, 1 + recount


def _transition(settings: Settings, now: float, node_id: str, source: str, target: str, cutoff: float) -> bool:
    online_delta = -1 if source == liveness.ONLINE else 0
    values = {
        "liveness": target,
        "liveness_shard": liveness.index_partition(target, node_id),
        "liveness_changed_at": round(now, 3),
    }
    event = outbox_item(
        event_type="node.liveness_changed",
        now=now,
        subject={"node_id": node_id, "from": source, "to": target, "cause": "sweep"},
        changes=[update_change(NodeModel, node_id, values)]
        + ([control_store.online_nodes_log_change(online_delta)] if online_delta else []),
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        node_store.set_liveness(node_id, source, cutoff, values, event, online_delta)
    except GuardFailed:
        return False  # a heartbeat arrived (or another sweep moved it) first
    log.info(
        "liveness transition",
        extra={"event": "node_liveness_changed", "node_id": node_id, "from": source, "to": target},
    )
    return True


def _record_hold(settings: Settings, now: float, held: bool, detail: dict[str, Any]) -> None:
    """Write the hold item only when it changes; log the change once."""
    current = control_store.get(control_store.MASS_STALE_HOLD)
    if bool(current and current.active) == held:
        return
    item = ControlModel(
        control_store.MASS_STALE_HOLD,
        active=held,
        since=round(now, 3) if held else None,
        detail=detail,
        updated_at=round(now, 3),
    )
    event_type = "sweep.mass_stale_held" if held else "sweep.mass_stale_released"
    event = outbox_item(
        event_type=event_type,
        now=now,
        subject={"control": control_store.MASS_STALE_HOLD},
        changes=[put_change(item)],
        retention_seconds=settings.outbox_retention_seconds,
    )
    control_store.put(item, event)
    log.warning(
        "mass stale held: liveness transitions paused" if held else "mass stale released",
        extra={"event": "mass_stale_held" if held else "mass_stale_released", **detail},
    )


def report_dict(report: SweepReport) -> dict[str, Any]:
    return asdict(report)
