"""The DynamoDB enrollment store, including the consuming transaction (stores.EnrollmentStore)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from chalicelib.domain.records import Enrollment, Event, Inventory, Node
from chalicelib.stores import changes, node_store
from chalicelib.stores.contract import PageKey
from chalicelib.stores.item_records import item_of, record_of
from chalicelib.stores.models import EnrollmentModel, GpuClaimModel, InventoryModel, NodeModel, OutboxModel
from chalicelib.stores.state_log import event_item, put_change, update_change
from chalicelib.stores.transactions import run_transaction, update_with_event
from chalicelib.stores.update_actions import update_actions


class DynamoEnrollmentStore:
    def __init__(self, retention_seconds: int) -> None:
        self._retention = retention_seconds

    def get(self, enrollment_id: str) -> Enrollment | None:
        try:
            return record_of(EnrollmentModel.get(enrollment_id, consistent_read=True), Enrollment)
        except DoesNotExist:
            return None

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Enrollment], PageKey]:
        result = EnrollmentModel.scan(limit=limit, last_evaluated_key=start, page_size=limit)
        items = [record_of(item, Enrollment) for item in result]
        return items, result.last_evaluated_key

    def create(self, enrollment: Enrollment, event: Event) -> None:
        item = item_of(enrollment, EnrollmentModel)
        outbox = event_item(event, [put_change(item)], self._retention)

        def build(transaction: TransactWrite) -> None:
            # a fresh random id never exists; the guard makes a collision fail instead of overwrite
            transaction.save(item, condition=EnrollmentModel.enrollment_id.does_not_exist())
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def revoke(self, enrollment_id: str, now: float, event: Event) -> None:
        values = changes.enrollment_revoked(now)
        update_with_event(
            EnrollmentModel(enrollment_id),
            values,
            (
                # mutation-equivalent: implied by the state clause (a missing enrollment has no state)
                EnrollmentModel.enrollment_id.exists()
                # only an unused token can be revoked
                & (EnrollmentModel.state == "pending")
            ),
            event_item(event, [update_change(EnrollmentModel, enrollment_id, values)], self._retention),
        )

    def consume(
        self,
        enrollment_id: str,
        token_sha256: str,
        idempotency_key_sha256: str,
        node: Node,
        inventory: Inventory,
        now: float,
    ) -> None:
        """Claim the token and create the node with its one credential, all or nothing: the
        database, not timing, decides which of many concurrent callers wins."""
        enrollment_values = changes.enrollment_consumed(node.node_id, idempotency_key_sha256, now)
        subject = {"enrollment_id": enrollment_id, "node_id": node.node_id}
        claim_uuids = sorted(inventory.claimed_uuids or ())
        node_item = item_of(node, NodeModel)
        # the channel ticket is ephemeral: written with the node, never logged
        unlogged: dict[str, Any] = dict.fromkeys(node_store.EPHEMERAL_ATTRIBUTES)
        logged_node = item_of(dataclasses.replace(node, **unlogged), NodeModel)
        inventory_item = item_of(inventory, InventoryModel)
        claims = [GpuClaimModel(uuid, node.node_id, claimed_at=round(now, 3)) for uuid in claim_uuids]
        logged = {
            "enrollment.consumed": [update_change(EnrollmentModel, enrollment_id, enrollment_values)],
            "node.registered": [put_change(logged_node)],
            "credential.issued": [],  # the credential is part of the node item put above
            "inventory.replaced": [put_change(inventory_item), *(put_change(claim) for claim in claims)],
        }
        events = [event_item(Event(kind, subject, now), changes, self._retention) for kind, changes in logged.items()]

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                EnrollmentModel(enrollment_id),
                actions=update_actions(EnrollmentModel, enrollment_values),
                condition=(
                    # the token is the one this enrollment minted
                    (EnrollmentModel.token_sha256 == token_sha256)
                    # nobody has consumed or revoked it yet
                    & (EnrollmentModel.state == "pending")
                    # and it has not expired
                    & (EnrollmentModel.expires_at > now)
                ),
            )
            transaction.save(node_item, condition=NodeModel.node_id.does_not_exist())
            transaction.save(inventory_item, condition=InventoryModel.node_id.does_not_exist())
            for claim in claims:
                transaction.save(claim)
            for outbox in events:
                # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
                transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)
