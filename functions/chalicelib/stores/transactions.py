"""One place that runs a DynamoDB transaction and turns a failed guard into GuardFailed."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pynamodb.connection import Connection
from pynamodb.exceptions import TransactWriteError
from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

from chalicelib.domain.errors import GuardFailed
from chalicelib.stores.models import OutboxModel
from chalicelib.stores.update_actions import update_actions

#: DynamoDB's limit on the items of one TransactWriteItems.
MAX_TRANSACTION_ITEMS = 100

_connection: Connection | None = None
_lock = threading.Lock()


def connection() -> Connection:
    """The process-wide PynamoDB connection for transactions (created on first use)."""
    global _connection
    with _lock:
        if _connection is None:
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            _connection = Connection(region=region)
        return _connection


def reset_connection() -> None:
    global _connection
    with _lock:
        _connection = None


def run_transaction(build: Callable[[TransactWrite], None]) -> None:
    """Write everything ``build`` adds, atomically; GuardFailed if any condition did not hold."""
    try:
        with TransactWrite(connection=connection()) as transaction:
            build(transaction)
    except TransactWriteError as error:
        reasons = error.cancellation_reasons or []
        failed = tuple(
            index
            for index, reason in enumerate(reasons)
            if reason is not None and reason.code == "ConditionalCheckFailed"
        )
        if failed:
            raise GuardFailed(str(error.cause_response_code), failed=failed) from None
        raise


def update_with_event(
    item: Model,
    values: dict[str, Any],
    condition: Any,
    event: OutboxModel,
    also: Sequence[tuple[Model, list[Any]]] = (),
) -> None:
    """One guarded update of ``item`` and its state-log event (and ``also``: unguarded updates such
    as counters), committed together or not at all."""

    def build(transaction: TransactWrite) -> None:
        transaction.update(item, actions=update_actions(type(item), values), condition=condition)
        for other, actions in also:
            transaction.update(other, actions=actions)
        # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)
