"""DynamoDB access for nodes and their inventories."""

from __future__ import annotations

from typing import Any, Iterator

from pynamodb.exceptions import DoesNotExist, UpdateError
from pynamodb.transactions import TransactWrite

from .errors import GuardFailed
from .models import InventoryModel, NodeModel, OutboxModel
from .state_log import update_actions
from .transactions import run_transaction


def _holds_credential(credential_sha256: str) -> Any:
    # the presented credential is the node's credential, and it has not been revoked
    return (NodeModel.credential_sha256 == credential_sha256) & (NodeModel.credential_state == "active")


def get(node_id: str) -> NodeModel | None:
    try:
        return NodeModel.get(node_id, consistent_read=True)
    except DoesNotExist:
        return None


def get_inventory(node_id: str) -> InventoryModel | None:
    try:
        return InventoryModel.get(node_id, consistent_read=True)
    except DoesNotExist:
        return None


def inventories_for(node_ids: list[str]) -> dict[str, InventoryModel]:
    if not node_ids:
        return {}
    return {item.node_id: item for item in InventoryModel.batch_get(node_ids)}


def list_page(limit: int, start_key: dict[str, Any] | None) -> tuple[list[NodeModel], dict | None]:
    result = NodeModel.scan(limit=limit, last_evaluated_key=start_key, page_size=limit)
    items = list(result)
    return items, result.last_evaluated_key


def record_heartbeat(node_id: str, credential_sha256: str, values: dict[str, Any]) -> NodeModel:
    """The steady-state heartbeat: one conditional UpdateItem, nothing else.

    GuardFailed when the credential does not hold or the node is not already online (then
    the caller takes the transition path, which is logged).
    """
    node = NodeModel(node_id)
    try:
        node.update(
            actions=update_actions(NodeModel, values),
            condition=(
                _holds_credential(credential_sha256)
                # an online node stays online: no transition, nothing to log
                & (NodeModel.liveness == "online")
            ),
        )
    except UpdateError as error:
        if error.cause_response_code == "ConditionalCheckFailedException":
            raise GuardFailed("heartbeat guard") from None
        raise
    return node


def record_transition_heartbeat(
    node_id: str,
    credential_sha256: str,
    previous_liveness: str,
    values: dict[str, Any],
    event: OutboxModel,
) -> None:
    """A heartbeat that brings a node online: the update and its state-log event together."""

    def build(transaction: TransactWrite) -> None:
        transaction.update(
            NodeModel(node_id),
            actions=update_actions(NodeModel, values),
            condition=(
                _holds_credential(credential_sha256)
                # nobody changed the liveness since we read it
                & (NodeModel.liveness == previous_liveness)
            ),
        )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def replace_inventory(
    node_id: str, credential_sha256: str, inventory: InventoryModel, event: OutboxModel
) -> None:
    def build(transaction: TransactWrite) -> None:
        transaction.condition_check(NodeModel, node_id, condition=_holds_credential(credential_sha256))
        transaction.save(inventory)
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def revoke_credential(node_id: str, values: dict[str, Any], event: OutboxModel) -> None:
    def build(transaction: TransactWrite) -> None:
        transaction.update(
            NodeModel(node_id),
            actions=update_actions(NodeModel, values),
            # only an active credential can be revoked (and the node must exist)
            condition=NodeModel.credential_state == "active",
        )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def set_liveness(
    node_id: str,
    expected_liveness: str,
    expected_last_heartbeat_at: float | None,
    values: dict[str, Any],
    event: OutboxModel,
) -> None:
    """Persist a liveness transition decided by the sweep, unless the node moved meanwhile."""
    unchanged_heartbeat = (
        NodeModel.last_heartbeat_at.does_not_exist()
        if expected_last_heartbeat_at is None
        else NodeModel.last_heartbeat_at == expected_last_heartbeat_at
    )

    def build(transaction: TransactWrite) -> None:
        transaction.update(
            NodeModel(node_id),
            actions=update_actions(NodeModel, values),
            condition=(
                # still in the state the sweep read
                (NodeModel.liveness == expected_liveness)
                # and no heartbeat arrived since the sweep read it
                & unchanged_heartbeat
            ),
        )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def scan_live_nodes() -> Iterator[NodeModel]:
    """Nodes whose persisted liveness the sweep may have to move (online or stale)."""
    return NodeModel.scan(
        filter_condition=NodeModel.liveness.is_in("online", "stale"),
        attributes_to_get=["node_id", "liveness", "last_heartbeat_at"],
    )

