"""Control-plane-wide state items (today: the sweep's mass-outage hold)."""

from __future__ import annotations

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from .models import ControlModel, OutboxModel
from .transactions import run_transaction

MASS_STALE_HOLD = "mass_stale_hold"


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
