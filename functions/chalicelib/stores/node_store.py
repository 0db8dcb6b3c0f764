"""The DynamoDB node store: nodes, their inventories and GPU claims (stores.NodeStore)."""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist, UpdateError
from pynamodb.transactions import TransactWrite

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import Event, Inventory, Node
from chalicelib.stores import fleet_state_store
from chalicelib.stores.contract import PageKey
from chalicelib.stores.item_records import record_of
from chalicelib.stores.models import GpuClaimModel, InventoryModel, NodeModel, OutboxModel
from chalicelib.stores.state_log import delete_change, event_item, put_change, update_change
from chalicelib.stores.transactions import run_transaction, update_with_event
from chalicelib.stores.update_actions import update_actions

#: What a heartbeat that brings a node online logs: its liveness, not the telemetry it carried.
_LOGGED_ON_TRANSITION = ("liveness", "liveness_shard", "liveness_changed_at", "last_heartbeat_at")


def holds_credential(credential_sha256: str) -> Any:
    # the presented credential is the node's credential, and it has not been revoked
    return (NodeModel.credential_sha256 == credential_sha256) & (NodeModel.credential_state == "active")


def online_now(now: float, stale_after: int) -> Any:
    """The condition any write that assigns work to a node must carry: the node is online by
    its persisted state *and* by the age of its last heartbeat at the moment of the write."""
    return heartbeat_after(now - stale_after)


def heartbeat_after(cutoff: float) -> Any:
    """``online_now`` with the cutoff computed: persisted online, last heartbeat after ``cutoff``."""
    return (NodeModel.liveness == "online") & (NodeModel.last_heartbeat_at > cutoff)


def both_sides(node_id: str, partners: list[str]) -> list[tuple[str, set[str]]]:
    """Each node a duplicate flag changes, with the partner ids it gains or loses: ``node_id``
    with all ``partners``, and each partner with ``node_id``."""
    return [(node_id, set(partners)), *((partner, {node_id}) for partner in partners)]


class DynamoNodeStore:
    def __init__(self, retention_seconds: int) -> None:
        self._retention = retention_seconds

    def _event(self, event: Event, changes: list[dict[str, Any]]) -> OutboxModel:
        return event_item(event, changes, self._retention)

    # --- reads ---------------------------------------------------------------------------

    def get(self, node_id: str) -> Node | None:
        try:
            return record_of(NodeModel.get(node_id, consistent_read=True), Node)
        except DoesNotExist:
            return None

    def get_inventory(self, node_id: str) -> Inventory | None:
        try:
            return record_of(InventoryModel.get(node_id, consistent_read=True), Inventory)
        except DoesNotExist:
            return None

    def inventories_for(self, node_ids: list[str]) -> dict[str, Inventory]:
        if not node_ids:
            return {}
        return {item.node_id: record_of(item, Inventory) for item in InventoryModel.batch_get(node_ids)}

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Node], PageKey]:
        result = NodeModel.scan(limit=limit, last_evaluated_key=start, page_size=limit)
        items = [record_of(item, Node) for item in result]
        return items, result.last_evaluated_key

    def claimants(self, gpu_uuid: str) -> list[str]:
        return [claim.node_id for claim in GpuClaimModel.query(gpu_uuid, consistent_read=True)]

    def late_nodes(self, liveness: str, heartbeat_bucket_not_after: float, shards: int) -> list[str]:
        """Reads the keys-only index: only nodes that are late (or within one bucket of it)."""
        found: list[str] = []
        for shard in range(shards):
            query = NodeModel.by_liveness.query(
                f"{liveness}#{shard}", NodeModel.heartbeat_bucket <= heartbeat_bucket_not_after
            )
            found.extend(item.node_id for item in query)
        return found

    def count_in_state(self, liveness: str, shards: int) -> int:
        """How many nodes the index holds in ``liveness`` (reads their index keys)."""
        return sum(NodeModel.by_liveness.count(f"{liveness}#{shard}") for shard in range(shards))

    # --- heartbeats ----------------------------------------------------------------------

    def record_heartbeat(self, node_id: str, credential_sha256: str, values: dict[str, Any]) -> Node:
        """The steady-state heartbeat: one conditional UpdateItem, nothing else (not logged)."""
        node = NodeModel(node_id)
        try:
            node.update(
                actions=update_actions(NodeModel, values),
                condition=(
                    holds_credential(credential_sha256)
                    # an online node stays online: no transition, nothing to log
                    & (NodeModel.liveness == "online")
                ),
            )
        except UpdateError as error:
            if error.cause_response_code == "ConditionalCheckFailedException":
                raise GuardFailed("heartbeat guard") from None
            raise
        return record_of(node, Node)

    def record_transition_heartbeat(
        self, node_id: str, credential_sha256: str, previous_liveness: str, values: dict[str, Any], event: Event
    ) -> None:
        """The update, the online counter and the state-log event together."""
        logged = {key: values[key] for key in _LOGGED_ON_TRANSITION}
        update_with_event(
            NodeModel(node_id),
            values,
            (
                holds_credential(credential_sha256)
                # nobody changed the liveness since we read it
                & (NodeModel.liveness == previous_liveness)
            ),
            self._event(
                event,
                [update_change(NodeModel, node_id, logged), fleet_state_store.online_nodes_log_change(+1)],
            ),
            also=[fleet_state_store.online_nodes_change(+1)],
        )

    def set_liveness(
        self,
        node_id: str,
        expected_liveness: str,
        heartbeat_not_after: float,
        values: dict[str, Any],
        event: Event,
        online_delta: int = 0,
    ) -> None:
        """Persist a liveness transition decided by the sweep, unless the node moved meanwhile."""
        changes = [update_change(NodeModel, node_id, values)]
        if online_delta:
            changes.append(fleet_state_store.online_nodes_log_change(online_delta))
        update_with_event(
            NodeModel(node_id),
            values,
            (
                # still in the state the sweep found it in
                (NodeModel.liveness == expected_liveness)
                # and still silent since the threshold: a heartbeat that arrived meanwhile wins
                & (NodeModel.last_heartbeat_at <= heartbeat_not_after)
            ),
            self._event(event, changes),
            also=[fleet_state_store.online_nodes_change(online_delta)] if online_delta else [],
        )

    # --- inventory and claims ------------------------------------------------------------

    def replace_inventory(
        self,
        node_id: str,
        credential_sha256: str,
        values: dict[str, Any],
        previous_revision: str | None,
        event: Event,
        capabilities: set[str] | None = None,
    ) -> None:
        """Three items, whatever the inventory holds: claims are reconciled afterwards
        (``change_claims``), so a transaction never nears DynamoDB's item limit."""
        unchanged_since_read = (
            InventoryModel.revision.does_not_exist()
            if previous_revision is None
            else InventoryModel.revision == previous_revision
        )
        node_values = {"capabilities": capabilities or None}
        outbox = self._event(
            event, [update_change(InventoryModel, node_id, values), update_change(NodeModel, node_id, node_values)]
        )

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                NodeModel(node_id),
                actions=update_actions(NodeModel, node_values),
                condition=holds_credential(credential_sha256),
            )
            transaction.update(
                InventoryModel(node_id),
                actions=update_actions(InventoryModel, values),
                # nobody replaced the inventory since we read it (this also keeps the rate count exact)
                condition=unchanged_since_read,
            )
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def change_claims(
        self, node_id: str, revision: str, uuids: list[str], adding: bool, now: float, event: Event
    ) -> None:
        part = {"claimed_uuids": set(uuids)}
        changes = {"add": part} if adding else {"delete": part}
        claims = [
            GpuClaimModel(uuid, node_id, claimed_at=round(now, 3)) if adding else GpuClaimModel(uuid, node_id)
            for uuid in uuids
        ]
        outbox = self._event(
            event,
            [
                *map(put_change if adding else delete_change, claims),
                update_change(InventoryModel, node_id, {}, **changes),
            ],
        )

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                InventoryModel(node_id),
                actions=update_actions(InventoryModel, {}, **changes),
                # the claims were computed from this revision of the inventory
                condition=InventoryModel.revision == revision,
            )
            for claim in claims:
                if adding:
                    transaction.save(claim)
                else:
                    transaction.delete(claim)
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    # --- duplicate identity flags --------------------------------------------------------

    def link_duplicates(self, node_id: str, partners: list[str], now: float, event: Event) -> None:
        stamp = round(now, 3)
        changes = {
            target: {"add": {"duplicate_partners": others}, "set_if_absent": {"duplicate_suspected_at": stamp}}
            for target, others in both_sides(node_id, partners)
        }
        self._change_flags(changes, event)

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        changes = {
            target: {"delete": {"duplicate_partners": others}} for target, others in both_sides(node_id, partners)
        }
        self._change_flags(changes, event)

    def _change_flags(self, changes: dict[str, dict[str, Any]], event: Event) -> None:
        outbox = self._event(
            event, [update_change(NodeModel, target, {}, **change) for target, change in changes.items()]
        )

        def build(transaction: TransactWrite) -> None:
            for target, change in changes.items():
                transaction.update(
                    NodeModel(target),
                    actions=update_actions(NodeModel, {}, **change),
                    condition=NodeModel.node_id.exists(),
                )
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def forget_duplicate_time(self, node_id: str, event: Event) -> None:
        values = {"duplicate_suspected_at": None}
        update_with_event(
            NodeModel(node_id),
            values,
            # DynamoDB removes a set with its last element: no partner is left
            NodeModel.node_id.exists() & NodeModel.duplicate_partners.does_not_exist(),
            self._event(event, [update_change(NodeModel, node_id, values)]),
        )

    # --- credentials ---------------------------------------------------------------------

    def revoke_credential(self, node_id: str, values: dict[str, Any], event: Event) -> None:
        # only an active credential can be revoked (and the node must exist)
        update_with_event(
            NodeModel(node_id),
            values,
            NodeModel.credential_state == "active",
            self._event(event, [update_change(NodeModel, node_id, values)]),
        )
