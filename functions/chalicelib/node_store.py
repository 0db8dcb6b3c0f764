"""DynamoDB access for nodes and their inventories."""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist, UpdateError
from pynamodb.transactions import TransactWrite

from . import fleet_state_store
from .errors import GuardFailed
from .models import GpuClaimModel, InventoryModel, NodeModel, OutboxModel
from .update_actions import update_actions
from .transactions import MAX_TRANSACTION_ITEMS, run_transaction, update_with_event


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
    """A heartbeat that brings a node online: the update, the online counter and the state-log
    event together."""
    update_with_event(
        NodeModel(node_id),
        values,
        (
            _holds_credential(credential_sha256)
            # nobody changed the liveness since we read it
            & (NodeModel.liveness == previous_liveness)
        ),
        event,
        also=[fleet_state_store.online_nodes_change(+1)],
    )


def replace_inventory(
    node_id: str,
    credential_sha256: str,
    values: dict[str, Any],
    previous_revision: str | None,
    event: OutboxModel,
) -> None:
    """Replace the inventory document (an update: the claims it records stay as they are).

    GuardFailed when the credential no longer holds, or another replacement moved first.
    Three items, whatever the inventory holds: claims are reconciled afterwards
    (``change_claims``), so a transaction never nears DynamoDB's item limit.
    """
    unchanged_since_read = (
        InventoryModel.revision.does_not_exist()
        if previous_revision is None
        else InventoryModel.revision == previous_revision
    )

    def build(transaction: TransactWrite) -> None:
        transaction.condition_check(NodeModel, node_id, condition=_holds_credential(credential_sha256))
        transaction.update(
            InventoryModel(node_id),
            actions=update_actions(InventoryModel, values),
            # nobody replaced the inventory since we read it (this also keeps the rate count exact)
            condition=unchanged_since_read,
        )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def change_claims(node_id: str, revision: str, claims: list[GpuClaimModel], adding: bool, event: OutboxModel) -> None:
    """Write (``adding``) or delete ``claims`` together with the inventory's record of them, while
    the inventory is still the revision they were computed from (GuardFailed otherwise: a newer
    replacement reconciles). Callers keep ``len(claims)`` within CLAIM_CHANGES_PER_TRANSACTION."""
    uuids = {"claimed_uuids": {claim.gpu_uuid for claim in claims}}

    def build(transaction: TransactWrite) -> None:
        transaction.update(
            InventoryModel(node_id),
            actions=update_actions(InventoryModel, {}, **({"add": uuids} if adding else {"delete": uuids})),
            # the claims were computed from this revision of the inventory
            condition=InventoryModel.revision == revision,
        )
        for claim in claims:
            if adding:
                transaction.save(claim)
            else:
                transaction.delete(claim)
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


#: DynamoDB's limit is 100 items a transaction; change_claims adds the inventory and the event.
CLAIM_CHANGES_PER_TRANSACTION = MAX_TRANSACTION_ITEMS - 2


def claimants(gpu_uuid: str) -> list[str]:
    """Every node that has reported this GPU UUID in its current inventory."""
    return [claim.node_id for claim in GpuClaimModel.query(gpu_uuid, consistent_read=True)]


def both_sides(node_id: str, partners: list[str]) -> list[tuple[str, set[str]]]:
    """Each node a duplicate flag changes, with the partner ids it gains or loses: ``node_id``
    with all ``partners``, and each partner with ``node_id``."""
    return [(node_id, set(partners)), *((partner, {node_id}) for partner in partners)]


def link_duplicates(node_id: str, partners: list[str], now: float, event: OutboxModel) -> None:
    """Flag ``node_id`` and each partner as duplicates of each other: set additions (no read,
    so concurrent reports never lose a flag); ``duplicate_suspected_at`` keeps the first time."""

    def build(transaction: TransactWrite) -> None:
        for target, others in both_sides(node_id, partners):
            transaction.update(
                NodeModel(target),
                actions=update_actions(
                    NodeModel, {}, add={"duplicate_partners": others}, set_if_absent={"duplicate_suspected_at": now}
                ),
                condition=NodeModel.node_id.exists(),
            )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def unlink_duplicates(node_id: str, partners: list[str], event: OutboxModel) -> None:
    """Take ``node_id`` and each partner out of each other's duplicate flags (set deletions)."""

    def build(transaction: TransactWrite) -> None:
        for target, others in both_sides(node_id, partners):
            transaction.update(
                NodeModel(target),
                actions=update_actions(NodeModel, {}, delete={"duplicate_partners": others}),
                condition=NodeModel.node_id.exists(),
            )
        transaction.save(event, condition=OutboxModel.event_id.does_not_exist())

    run_transaction(build)


def forget_duplicate_time(node_id: str, event: OutboxModel) -> None:
    """Drop the flag's time once no partner is left (GuardFailed while one is)."""
    update_with_event(
        NodeModel(node_id),
        {"duplicate_suspected_at": None},
        # DynamoDB removes a set with its last element: no partner is left
        NodeModel.node_id.exists() & NodeModel.duplicate_partners.does_not_exist(),
        event,
    )


def revoke_credential(node_id: str, values: dict[str, Any], event: OutboxModel) -> None:
    # only an active credential can be revoked (and the node must exist)
    update_with_event(NodeModel(node_id), values, NodeModel.credential_state == "active", event)


def online_now(now: float, stale_after: int) -> Any:
    """The condition any write that assigns work to a node must carry: the node is online by
    its persisted state *and* by the age of its last heartbeat at the moment of the write."""
    return (NodeModel.liveness == "online") & (NodeModel.last_heartbeat_at > now - stale_after)


def set_liveness(
    node_id: str,
    expected_liveness: str,
    heartbeat_not_after: float,
    values: dict[str, Any],
    event: OutboxModel,
    online_delta: int = 0,
) -> None:
    """Persist a liveness transition decided by the sweep, unless the node moved meanwhile."""
    update_with_event(
        NodeModel(node_id),
        values,
        (
            # still in the state the sweep found it in
            (NodeModel.liveness == expected_liveness)
            # and still silent since the threshold: a heartbeat that arrived meanwhile wins
            & (NodeModel.last_heartbeat_at <= heartbeat_not_after)
        ),
        event,
        also=[fleet_state_store.online_nodes_change(online_delta)] if online_delta else [],
    )


def late_nodes(liveness: str, heartbeat_bucket_not_after: float, shards: int) -> list[str]:
    """Node ids in ``liveness`` whose heartbeat bucket starts at or before the cutoff.

    Reads the keys-only index: only nodes that are late (or within one bucket of it) are read.
    """
    found: list[str] = []
    for shard in range(shards):
        query = NodeModel.by_liveness.query(
            f"{liveness}#{shard}", NodeModel.heartbeat_bucket <= heartbeat_bucket_not_after
        )
        found.extend(item.node_id for item in query)
    return found


def count_in_state(liveness: str, shards: int) -> int:
    """How many nodes the index holds in ``liveness`` (reads their index keys)."""
    return sum(NodeModel.by_liveness.count(f"{liveness}#{shard}") for shard in range(shards))
