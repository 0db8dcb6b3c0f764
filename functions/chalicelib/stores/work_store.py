"""The DynamoDB work store: work items, their queue and their leases (stores.WorkStore).

Three sparse indexes serve the three reads that must not scan: ``by_queue`` (capability, then
queue time: the oldest claimable item), ``by_lease`` (every leased item by expiry: the sweep's
expired leases) and ``by_holder`` (a node's leases: released at once when it goes offline). An
item is in an index only while it is in the state the index serves.
"""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from chalicelib.domain.records import Event, WorkItem
from chalicelib.stores.contract import PageKey, WorkGuard
from chalicelib.stores.item_records import item_of, record_of
from chalicelib.stores.models import NodeModel, OutboxModel, WorkModel
from chalicelib.stores.node_store import heartbeat_after as online_since
from chalicelib.stores.node_store import holds_credential as _holds_credential
from chalicelib.stores.state_log import event_item, put_change, update_change
from chalicelib.stores.transactions import run_transaction
from chalicelib.stores.update_actions import update_actions

#: The one partition of the by_lease index (leases are few next to nodes: one per running job).
LEASED = "leased"


def _guard_condition(guard: WorkGuard) -> Any:
    condition = WorkModel.status.is_in(*guard.statuses)
    if guard.epoch is not None:
        condition &= WorkModel.epoch == guard.epoch
    if guard.node_id is not None:
        condition &= WorkModel.lease_holder == guard.node_id
    if guard.lease_expired_by is not None:
        condition &= WorkModel.lease_expires_at <= guard.lease_expired_by
    return condition


class DynamoWorkStore:
    def __init__(self, retention_seconds: int) -> None:
        self._retention = retention_seconds

    def _event(self, event: Event, changes: list[dict[str, Any]]) -> OutboxModel:
        return event_item(event, changes, self._retention)

    def get(self, work_id: str) -> WorkItem | None:
        try:
            return record_of(WorkModel.get(work_id, consistent_read=True), WorkItem)
        except DoesNotExist:
            return None

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]:
        """A page of the table (a Scan, filtered): an admin's listing, not a hot path."""
        condition = None
        if status is not None:
            condition = WorkModel.status == status
        if capability is not None:
            by_capability = WorkModel.capability == capability
            condition = by_capability if condition is None else condition & by_capability
        result = WorkModel.scan(condition, limit=limit, last_evaluated_key=start, page_size=limit)
        items = [record_of(item, WorkItem) for item in result]
        return items, result.last_evaluated_key

    def create(self, item: WorkItem, event: Event) -> None:
        stored = item_of(item, WorkModel)
        outbox = self._event(event, [put_change(stored)])

        def build(transaction: TransactWrite) -> None:
            transaction.save(stored, condition=WorkModel.work_id.does_not_exist())
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def oldest_queued(self, capability: str, limit: int) -> list[WorkItem]:
        query = WorkModel.by_queue.query(capability, scan_index_forward=True, limit=limit)
        return [record_of(item, WorkItem) for item in query]

    def any_queued(self, capability: str) -> bool:
        return any(True for _ in WorkModel.by_queue.query(capability, limit=1))

    def claim(
        self,
        work_id: str,
        read_epoch: int,
        node_id: str,
        credential_sha256: str,
        heartbeat_after: float,
        values: dict[str, Any],
        event: Event,
    ) -> None:
        outbox = self._event(event, [update_change(WorkModel, work_id, values)])

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                WorkModel(work_id),
                actions=update_actions(WorkModel, values),
                # still queued, and nobody claimed it since we read it
                condition=(WorkModel.status == "queued") & (WorkModel.epoch == read_epoch),
            )
            transaction.condition_check(
                NodeModel,
                node_id,
                # the caller is this node, its credential is active, and it is online now: by its
                # persisted state and by the age of its last heartbeat, at the moment of the write
                condition=_holds_credential(credential_sha256) & online_since(heartbeat_after),
            )
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def update(
        self,
        work_id: str,
        guard: WorkGuard,
        values: dict[str, Any],
        event: Event,
        holder_credential_sha256: str | None = None,
    ) -> None:
        outbox = self._event(event, [update_change(WorkModel, work_id, values)])

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                WorkModel(work_id), actions=update_actions(WorkModel, values), condition=_guard_condition(guard)
            )
            if holder_credential_sha256 is not None and guard.node_id is not None:
                transaction.condition_check(
                    NodeModel, guard.node_id, condition=_holds_credential(holder_credential_sha256)
                )
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def expired_leases(self, now: float, limit: int) -> list[WorkItem]:
        query = WorkModel.by_lease.query(LEASED, WorkModel.lease_expires_at <= now, limit=limit)
        return [record_of(item, WorkItem) for item in query]

    def leases_held_by(self, node_id: str) -> list[WorkItem]:
        return [record_of(item, WorkItem) for item in WorkModel.by_holder.query(node_id)]
