"""The DynamoDB control store: the sweep's mass-outage hold and the online-node counter
(stores.ControlStore).

Every write is guarded by the item's ``revision`` (one more with each write): a writer that
read, decided and then writes changes nothing if anyone wrote the item meanwhile (GuardFailed),
and every write carries its state-log event in the same transaction.
"""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from chalicelib.domain.records import ONLINE_NODES, ControlItem, Event
from chalicelib.stores.item_records import item_of, record_of
from chalicelib.stores.models import ControlModel, OutboxModel
from chalicelib.stores.state_log import event_item, put_change, update_change
from chalicelib.stores.transactions import run_transaction
from chalicelib.stores.update_actions import update_actions


def _unchanged_since(read_revision: int | None) -> Any:
    # nobody wrote the item since we read it: its revision is still the one we saw
    if read_revision is None:
        return ControlModel.revision.does_not_exist()
    return ControlModel.revision == read_revision


def online_nodes_change(delta: int) -> tuple[ControlModel, list[Any]]:
    """The counter update to add to a transition's transaction (ADD: no read, no guard needed)."""
    return ControlModel(ONLINE_NODES), update_actions(ControlModel, {}, add=_counter_adds(delta))


def online_nodes_log_change(delta: int) -> dict[str, Any]:
    """The same change as a state-log entry (replay adds it too)."""
    return update_change(ControlModel, ONLINE_NODES, {}, add=_counter_adds(delta))


def _counter_adds(delta: int) -> dict[str, int]:
    return {"count": delta, "revision": 1}


class DynamoControlStore:
    def __init__(self, retention_seconds: int) -> None:
        self._retention = retention_seconds

    def get(self, name: str) -> ControlItem | None:
        try:
            return record_of(ControlModel.get(name, consistent_read=True), ControlItem)
        except DoesNotExist:
            return None

    def put(self, item: ControlItem, event: Event) -> None:
        if item.revision is None or int(item.revision) < 1:
            raise ValueError("a control item is written with the next revision (the one read, plus one)")
        read_revision = int(item.revision) - 1
        stored = item_of(item, ControlModel)
        outbox = event_item(event, [put_change(stored)], self._retention)

        def build(transaction: TransactWrite) -> None:
            transaction.save(stored, condition=_unchanged_since(read_revision or None))
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def recount_online_nodes(self, read: ControlItem | None, count: int, now: float, event: Event) -> None:
        """Set the counter to ``count`` (a full count of the online index, taken after reading
        ``read``), if no transition moved the counter since ``read``. A count, not a difference:
        the repair also fixes a counter that drifted outside the log (missing after an upgrade, or
        removed by hand), so replay must reach the same number."""
        read_revision = None if read is None or read.revision is None else int(read.revision)
        values = {"count": count, "revision": (read_revision or 0) + 1, "updated_at": round(now, 3)}
        outbox = event_item(event, [update_change(ControlModel, ONLINE_NODES, values)], self._retention)

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                ControlModel(ONLINE_NODES),
                actions=update_actions(ControlModel, values),
                condition=_unchanged_since(read_revision),
            )
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)
