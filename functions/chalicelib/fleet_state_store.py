"""Fleet-wide state items: the sweep's mass-outage hold and the online-node counter.

Every write is guarded by the item's ``revision`` (one more with each write): a writer that
read, decided and then writes changes nothing if anyone wrote the item meanwhile (GuardFailed),
and every write carries its state-log event in the same transaction.
"""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from .models import FleetStateModel, OutboxModel
from .state_log import update_change
from .update_actions import update_actions
from .transactions import run_transaction

MASS_STALE_HOLD = "mass_stale_hold"
#: How many nodes are persisted online: kept by every transition into or out of online, so the
#: sweep's mass-outage guard reads one item instead of every online node.
ONLINE_NODES = "online_nodes"


def get(name: str) -> FleetStateModel | None:
    try:
        return FleetStateModel.get(name, consistent_read=True)
    except DoesNotExist:
        return None


def revision_of(item: FleetStateModel | None) -> int | None:
    """The revision a guarded write must find (None: the item, or its revision, is absent)."""
    return None if item is None or item.revision is None else int(item.revision)


def _unchanged_since(read_revision: int | None) -> Any:
    # nobody wrote the item since we read it: its revision is still the one we saw
    if read_revision is None:
        return FleetStateModel.revision.does_not_exist()
    return FleetStateModel.revision == read_revision


def put(item: FleetStateModel, event: OutboxModel) -> None:
    """Write ``item`` whole with its event, if the stored revision is still ``item.revision - 1``
    (GuardFailed otherwise: another writer moved first, and nothing is written)."""
    if item.revision is None or int(item.revision) < 1:
        raise ValueError("a control item is written with the next revision (the one read, plus one)")
    read_revision = int(item.revision) - 1

    def build(transaction: TransactWrite) -> None:
        transaction.save(item, condition=_unchanged_since(read_revision or None))
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def online_nodes() -> int | None:
    item = get(ONLINE_NODES)
    return None if item is None or item.count is None else int(item.count)


def online_nodes_change(delta: int) -> tuple[FleetStateModel, list[Any]]:
    """The counter update to add to a transition's transaction (ADD: no read, no guard needed)."""
    return FleetStateModel(ONLINE_NODES), update_actions(FleetStateModel, {}, add=_counter_adds(delta))


def online_nodes_log_change(delta: int) -> dict[str, Any]:
    """The same change as a state-log entry (replay adds it too)."""
    return update_change(FleetStateModel, ONLINE_NODES, {}, add=_counter_adds(delta))


def _counter_adds(delta: int) -> dict[str, int]:
    return {"count": delta, "revision": 1}


def online_nodes_repair_change(read: FleetStateModel | None, count: int, now: float) -> dict[str, Any]:
    """The state-log entry of a repair that read ``read`` and then counted ``count`` online nodes."""
    return update_change(FleetStateModel, ONLINE_NODES, _repair(read, count, now))


def recount_online_nodes(read: FleetStateModel | None, count: int, now: float, event: OutboxModel) -> None:
    """Set the counter to ``count`` (a full count of the online index, taken after reading
    ``read``) with its event, if no transition moved the counter since ``read`` (GuardFailed
    otherwise: the transition's own ADD stands, and nothing is written)."""

    def build(transaction: TransactWrite) -> None:
        transaction.update(
            FleetStateModel(ONLINE_NODES),
            actions=update_actions(FleetStateModel, _repair(read, count, now)),
            condition=_unchanged_since(revision_of(read)),
        )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def _repair(read: FleetStateModel | None, count: int, now: float) -> dict[str, Any]:
    # a count, not a difference: the repair also fixes a counter that drifted outside the log
    # (missing after an upgrade, or removed by hand), so replay must reach the same number
    return {"count": count, "revision": (revision_of(read) or 0) + 1, "updated_at": round(now, 3)}
