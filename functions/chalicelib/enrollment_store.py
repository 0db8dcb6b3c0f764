"""DynamoDB access for enrollments, including the consuming transaction."""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from .models import EnrollmentModel, GpuClaimModel, InventoryModel, NodeModel, OutboxModel
from .update_actions import update_actions
from .transactions import run_transaction, update_with_event


def get(enrollment_id: str) -> EnrollmentModel | None:
    try:
        return EnrollmentModel.get(enrollment_id, consistent_read=True)
    except DoesNotExist:
        return None


def list_page(limit: int, start_key: dict[str, Any] | None) -> tuple[list[EnrollmentModel], dict | None]:
    result = EnrollmentModel.scan(limit=limit, last_evaluated_key=start_key, page_size=limit)
    items = list(result)
    return items, result.last_evaluated_key


def create(enrollment: EnrollmentModel, event: OutboxModel) -> None:
    def build(transaction: TransactWrite) -> None:
        # a fresh random id never exists; the guard makes a collision fail instead of overwrite
        transaction.save(enrollment, condition=EnrollmentModel.enrollment_id.does_not_exist())
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def revoke(enrollment_id: str, values: dict[str, Any], event: OutboxModel) -> None:
    """Revoke a token that has not been used. GuardFailed if it is not pending any more."""
    update_with_event(
        EnrollmentModel(enrollment_id),
        values,
        (
            EnrollmentModel.enrollment_id.exists()
            # only an unused token can be revoked
            & (EnrollmentModel.state == "pending")
        ),
        event,
    )


def consume(
    *,
    enrollment_id: str,
    token_sha256: str,
    now: float,
    enrollment_values: dict[str, Any],
    node: NodeModel,
    inventory: InventoryModel,
    claims: list[GpuClaimModel],
    events: list[OutboxModel],
) -> None:
    """Claim the token and create the node with its one credential, all or nothing.

    GuardFailed when the token was not pending and unexpired at the moment of the write:
    the database, not timing, decides which of many concurrent callers wins.
    """

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
        transaction.save(node, condition=NodeModel.node_id.does_not_exist())
        transaction.save(inventory, condition=InventoryModel.node_id.does_not_exist())
        for claim in claims:
            transaction.save(claim)
        for event in events:
            transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)
