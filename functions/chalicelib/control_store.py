"""Control-plane-wide state items (today: the sweep's mass-outage hold)."""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from .models import ControlModel, OutboxModel
from .transactions import run_transaction

MASS_STALE_HOLD = "mass_stale_hold"
#: How many nodes are persisted online: kept by every transition into or out of online, so the
#: sweep's mass-outage guard reads one item instead of every online node.
ONLINE_NODES = "online_nodes"


def get(name: str) -> ControlModel | None:
    try:
        return ControlModel.get(name, consistent_read=True)
    except DoesNotExist:
        return None


def put(item: ControlModel, event: OutboxModel) -> None:
    def build(transaction: TransactWrite) -> None:
        transaction.save(item)
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def online_nodes() -> int | None:
    item = get(ONLINE_NODES)
    return None if item is None or item.count is None else int(item.count)


def online_nodes_change(delta: int) -> tuple[ControlModel, list[Any]]:
    """The counter update to add to a transition's transaction."""
    return ControlModel(ONLINE_NODES), [ControlModel.count.add(delta)]


def online_nodes_log_change(delta: int) -> dict[str, Any]:
    """The same change as a state-log entry (replay adds it too)."""
    return {"table": "control", "op": "add", "key": {"name": {"S": ONLINE_NODES}}, "add": {"count": {"N": str(delta)}}}


def recount_online_nodes(count: int, now: float) -> None:
    """Repair the counter from a full count (after a replay, or if it ever drifted)."""
    ControlModel(ONLINE_NODES, count=count, updated_at=round(now, 3)).save()
