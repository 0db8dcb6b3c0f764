"""The scheduled liveness sweep: load, decide, then apply each transition with a guarded write.

A failed guard means the node moved first (a heartbeat arrived): skip it, never overwrite.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from . import liveness, node_store
from .errors import GuardFailed
from .models import NodeModel
from .settings import Settings
from .state_log import outbox_item, update_change

log = logging.getLogger("modelforge.sweep")


@dataclass(frozen=True)
class SweepReport:
    examined: int
    transitioned: int
    skipped: int


def run(settings: Settings, now: float) -> SweepReport:
    examined = transitioned = skipped = 0
    for node in node_store.scan_live_nodes():
        examined += 1
        target = liveness.derive(
            node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds
        )
        if target == node.liveness:
            continue
        values = {"liveness": target, "liveness_changed_at": round(now, 3)}
        event = outbox_item(
            event_type="node.liveness_changed",
            now=now,
            sequence=0,
            subject={"node_id": node.node_id, "from": node.liveness, "to": target, "cause": "sweep"},
            changes=[update_change(NodeModel, node.node_id, values)],
            retention_seconds=settings.outbox_retention_seconds,
        )
        try:
            node_store.set_liveness(node.node_id, node.liveness, node.last_heartbeat_at, values, event)
        except GuardFailed:
            skipped += 1
            continue
        transitioned += 1
        log.info(
            "liveness transition",
            extra={"event": "node_liveness_changed", "node_id": node.node_id, "from": node.liveness, "to": target},
        )
    return SweepReport(examined=examined, transitioned=transitioned, skipped=skipped)
