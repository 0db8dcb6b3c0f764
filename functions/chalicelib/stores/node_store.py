"""The DynamoDB node store: nodes, their inventories and GPU claims (stores.NodeStore).

The sweep reads the keys-only ``by_liveness`` index: online and stale nodes, partitioned by state
and shard (``liveness_shard``: "<liveness>#<shard>") and sorted by ``heartbeat_bucket``, the start
of the bucket of the heartbeat that brought the node online. This store sets both with each
transition and never with a steady heartbeat, so a heartbeat writes the node item and nothing else
(one write unit while the item is under 1 KB). The entry's sort key is then a lower bound of the
node's last heartbeat: the index finds every late node (and the on-time nodes online since before
the cutoff), and the node items it names are read (keys, liveness and last heartbeat, eventually
consistent) to keep the late ones. Reading a node item costs a twentieth of moving its index entry,
so the sweep reads where the heartbeat used to write (bench/README.md, "cost.py"). Offline nodes
are in the index too (``offline#<shard>``), sorted by the bucket of their move to offline: what the
sweep's node retention reads (``offline_since``).
"""

from __future__ import annotations

from typing import Any

from pynamodb.exceptions import DoesNotExist, UpdateError
from pynamodb.transactions import TransactWrite

from chalicelib.domain import liveness
from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import Event, Heartbeat, Inventory, Node
from chalicelib.stores import changes, control_store
from chalicelib.stores.contract import Holder, PageKey
from chalicelib.stores.item_records import record_of
from chalicelib.stores.models import (
    ControlModel,
    EnrollmentModel,
    GpuClaimModel,
    InventoryModel,
    NodeModel,
    OutboxModel,
)
from chalicelib.stores.state_log import delete_change, event_item, put_change, update_change
from chalicelib.stores.transactions import run_transaction, update_with_event
from chalicelib.stores.update_actions import update_actions

#: What a heartbeat that brings a node online logs: its liveness, not the telemetry it carried.
_LOGGED_ON_TRANSITION = (
    "liveness",
    "liveness_shard",
    "heartbeat_bucket",
    "liveness_changed_at",
    "last_heartbeat_at",
)
#: Node attributes that only heartbeats change: not in the state log (only transitions are), so a
#: table rebuilt by replay has them as of the last logged transition.
HEARTBEAT_ATTRIBUTES = (
    "last_heartbeat_at",
    "health",
    "telemetry",
    "agent_version",
    "protocol_version",
    "slots",
    "slots_schedulable",
)
#: What the sweep reads of a node its index names: whether it is still late.
_SILENCE_ATTRIBUTES = ["node_id", "liveness", "last_heartbeat_at"]
#: Node attributes of the push channel and of parking: ephemeral state, never in the state log (not
#: even in a logged write's changes) and left out of replay equality, like the heartbeat's.
EPHEMERAL_ATTRIBUTES = (
    "channel_ticket_sha256",
    "channel_ticket_expires_at",
    "channel_connection_id",
    "channel_connected_at",
    "channel_state",
    "channel_reason",
    "parked_at",
)
#: The same attributes as a scan of the nodes table names them (short names: see models.NodeModel).
EPHEMERAL_ITEM_NAMES = tuple(NodeModel.get_attributes()[name].attr_name for name in EPHEMERAL_ATTRIBUTES)
#: The heartbeat's attributes as a scan of the nodes table names them.
HEARTBEAT_ITEM_NAMES = tuple(NodeModel.get_attributes()[name].attr_name for name in HEARTBEAT_ATTRIBUTES)
#: Partitions of the sweep's index per liveness state, so heartbeats of a large fleet do not all
#: write to one index partition.
SHARDS = 4


def shard_of(node_id: str) -> int:
    return int(node_id[-8:], 16) % SHARDS


def index_partition(state: str, node_id: str) -> str | None:
    """The index partition of a node in this state; None (not indexed) unless online, stale or
    offline (offline: what the sweep's node retention reads)."""
    if state not in (liveness.ONLINE, liveness.STALE, liveness.OFFLINE):
        return None
    return f"{state}#{shard_of(node_id)}"


def bucket(timestamp: float, width_seconds: int) -> int:
    """Start of the bucket holding ``timestamp`` (buckets are ``width_seconds`` wide)."""
    return int(timestamp // width_seconds) * width_seconds


def holds_credential(credential_sha256: str) -> Any:
    # the presented credential is the node's credential, and it has not been revoked
    return (NodeModel.credential_sha256 == credential_sha256) & (NodeModel.credential_state == "active")


def online_node_item(node_id: str, last_heartbeat_at: float, created_at: float, bucket_seconds: int) -> dict[str, Any]:
    """The wire item of an enrolled node that is online and last heartbeated then (see
    ``instance.online_node_item``)."""
    import secrets

    beat, created = round(last_heartbeat_at, 3), round(created_at, 3)
    item: dict[str, Any] = NodeModel(
        node_id,
        enrollment_id="enr_" + node_id[5:],
        display_name=f"seeded {node_id[-6:]}",
        hostname=f"seeded-{node_id[-12:]}",
        accelerator_mode="nvidia",
        production_eligible=False,
        created_at=created,
        agent_version="1.3.0",
        protocol_version=1,
        credential_sha256=secrets.token_hex(32),
        credential_state="active",
        credential_issued_at=created,
        liveness=liveness.ONLINE,
        liveness_changed_at=created,
        last_heartbeat_at=beat,
        health={"status": "ok"},
        telemetry=[[index, 87.5, 101234567890, 143771336704, 64, 612.4] for index in range(8)],
        liveness_shard=index_partition(liveness.ONLINE, node_id),
        # the bucket of the heartbeat that brought it online (when it was created, or this one if
        # earlier): steady heartbeats since then left the index entry where it was
        heartbeat_bucket=bucket(min(beat, created), bucket_seconds),
    ).serialize()
    return item


def _with_instance_guard(condition: Any, fingerprint: str | None) -> Any:
    """``condition``, and the stored agent instance starts with ``fingerprint`` (None: any)."""
    if fingerprint is None:
        return condition
    return condition & NodeModel.agent_instance.startswith(fingerprint)


def heartbeat_after(cutoff: float) -> Any:
    """The condition any write that assigns work to a node must carry: the node is online by its
    persisted state *and* by the age of its last heartbeat (after ``cutoff``) at the moment of the
    write."""
    return (NodeModel.liveness == "online") & (NodeModel.last_heartbeat_at > cutoff)


def both_sides(node_id: str, partners: list[str]) -> list[tuple[str, set[str]]]:
    """Each node a duplicate flag changes, with the partner ids it gains or loses: ``node_id``
    with all ``partners``, and each partner with ``node_id``."""
    return [(node_id, set(partners)), *((partner, {node_id}) for partner in partners)]


class DynamoNodeStore:
    def __init__(self, retention_seconds: int, bucket_seconds: int) -> None:
        self._retention = retention_seconds
        self._bucket_seconds = bucket_seconds

    def _event(self, event: Event, changed: list[dict[str, Any]]) -> OutboxModel:
        return event_item(event, changed, self._retention)

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

    def late_nodes(self, liveness: str, cutoff: float) -> list[str]:
        """The keys-only index names the nodes in ``liveness`` since a bucket that starts by
        ``cutoff`` (every late node among them: the bucket starts at or before each heartbeat
        since); their items' last heartbeats keep the late ones. Both reads are eventually
        consistent: a heartbeat they miss makes a node look late, and the sweep's guarded write
        then skips it."""
        candidates: list[str] = []
        for shard in range(SHARDS):
            query = NodeModel.by_liveness.query(f"{liveness}#{shard}", NodeModel.heartbeat_bucket <= cutoff)
            candidates.extend(item.node_id for item in query)
        if not candidates:
            return []
        late = {
            item.node_id
            for item in NodeModel.batch_get(candidates, attributes_to_get=_SILENCE_ATTRIBUTES)
            if item.liveness == liveness and item.last_heartbeat_at is not None and item.last_heartbeat_at <= cutoff
        }
        return [node_id for node_id in candidates if node_id in late]

    def count_in_state(self, liveness: str) -> int:
        """How many nodes the index holds in ``liveness`` (reads their index keys)."""
        return sum(NodeModel.by_liveness.count(f"{liveness}#{shard}") for shard in range(SHARDS))

    def _heartbeat_values(self, heartbeat: Heartbeat, now: float) -> dict[str, Any]:
        """What every heartbeat sets on the node item (a steady one sets nothing else)."""
        return changes.heartbeat(heartbeat, now)

    def _index_keys(self, node_id: str, state: str, now: float) -> dict[str, Any]:
        """The sweep index entry of a node that enters ``state`` at ``now`` (set on transitions only)."""
        return {
            "liveness_shard": index_partition(state, node_id),
            "heartbeat_bucket": bucket(now, self._bucket_seconds),
        }

    # --- heartbeats ----------------------------------------------------------------------

    def record_heartbeat(self, holder: Holder, heartbeat: Heartbeat, now: float) -> Node:
        """The steady-state heartbeat: one conditional UpdateItem of the node item, nothing else
        (not logged; the sweep's index entry stays as the transition to online wrote it)."""
        node = NodeModel(holder.node_id)
        try:
            node.update(
                actions=update_actions(NodeModel, self._heartbeat_values(heartbeat, now)),
                condition=_with_instance_guard(
                    holds_credential(holder.credential_sha256)
                    # an online node stays online: no transition, nothing to log
                    & (NodeModel.liveness == "online"),
                    # the same agent process as the last heartbeat's (another: the service judges it)
                    heartbeat.instance_fingerprint,
                ),
            )
        except UpdateError as error:
            if error.cause_response_code == "ConditionalCheckFailedException":
                raise GuardFailed("heartbeat guard") from None
            raise
        return record_of(node, Node)

    def bring_online(
        self, holder: Holder, previous_liveness: str, heartbeat: Heartbeat, now: float, event: Event
    ) -> None:
        """The update, the online counter and the state-log event together."""
        node_id = holder.node_id
        values = {
            **self._heartbeat_values(heartbeat, now),
            **self._index_keys(node_id, liveness.ONLINE, now),
            "liveness_changed_at": round(now, 3),
        }
        logged = {key: values[key] for key in _LOGGED_ON_TRANSITION}
        update_with_event(
            NodeModel(node_id),
            values,
            (
                holds_credential(holder.credential_sha256)
                # nobody changed the liveness since we read it
                & (NodeModel.liveness == previous_liveness)
            ),
            self._event(
                event,
                [update_change(NodeModel, node_id, logged), control_store.online_nodes_log_change(+1)],
            ),
            also=[control_store.online_nodes_change(+1)],
        )

    def change_liveness(
        self, node_id: str, source: str, target: str, silent_since: float, now: float, event: Event
    ) -> None:
        """Persist a liveness transition decided by the sweep, unless the node moved meanwhile."""
        values = {**changes.liveness_changed(target, now), "liveness_shard": index_partition(target, node_id)}
        if target == liveness.OFFLINE:  # offline nodes sort by when they went offline (node retention)
            values["heartbeat_bucket"] = bucket(now, self._bucket_seconds)
        online_delta = changes.online_delta(source, target)
        logged = [update_change(NodeModel, node_id, values)]
        if online_delta:
            logged.append(control_store.online_nodes_log_change(online_delta))
        update_with_event(
            NodeModel(node_id),
            values,
            (
                # still in the state the sweep found it in
                (NodeModel.liveness == source)
                # and still silent since the threshold: a heartbeat that arrived meanwhile wins
                & (NodeModel.last_heartbeat_at <= silent_since)
            ),
            self._event(event, logged),
            also=[control_store.online_nodes_change(online_delta)] if online_delta else [],
        )

    # --- inventory and claims ------------------------------------------------------------

    def replace_inventory(
        self, holder: Holder, inventory: Inventory, previous_revision: str | None, capabilities: set[str], event: Event
    ) -> None:
        """Three items, whatever the inventory holds: claims are reconciled afterwards
        (``change_claims``), so a transaction never nears DynamoDB's item limit."""
        unchanged_since_read = (
            InventoryModel.revision.does_not_exist()
            if previous_revision is None
            else InventoryModel.revision == previous_revision
        )
        node_id, credential_sha256 = holder.node_id, holder.credential_sha256
        values = changes.inventory_replaced(inventory)
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
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def change_claims(
        self, node_id: str, revision: str, uuids: list[str], adding: bool, now: float, event: Event
    ) -> None:
        part = {"claimed_uuids": set(uuids)}
        set_change = {"add": part} if adding else {"delete": part}
        claims = [
            GpuClaimModel(uuid, node_id, claimed_at=round(now, 3)) if adding else GpuClaimModel(uuid, node_id)
            for uuid in uuids
        ]
        outbox = self._event(
            event,
            [
                *map(put_change if adding else delete_change, claims),
                update_change(InventoryModel, node_id, {}, **set_change),
            ],
        )

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                InventoryModel(node_id),
                actions=update_actions(InventoryModel, {}, **set_change),
                # the claims were computed from this revision of the inventory
                condition=InventoryModel.revision == revision,
            )
            for claim in claims:
                if adding:
                    transaction.save(claim)
                else:
                    transaction.delete(claim)
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    # --- duplicate identity flags --------------------------------------------------------

    def link_duplicates(self, node_id: str, partners: list[str], now: float, event: Event) -> None:
        stamp = round(now, 3)
        flags = {
            target: {"add": {"duplicate_partners": others}, "set_if_absent": {"duplicate_suspected_at": stamp}}
            for target, others in both_sides(node_id, partners)
        }
        self._change_flags(flags, event)

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        flags = {target: {"delete": {"duplicate_partners": others}} for target, others in both_sides(node_id, partners)}
        self._change_flags(flags, event)

    def _change_flags(self, flags: dict[str, dict[str, Any]], event: Event) -> None:
        outbox = self._event(
            event, [update_change(NodeModel, target, {}, **change) for target, change in flags.items()]
        )

        def build(transaction: TransactWrite) -> None:
            for target, change in flags.items():
                transaction.update(
                    NodeModel(target),
                    actions=update_actions(NodeModel, {}, **change),
                    condition=NodeModel.node_id.exists(),
                )
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
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

    def revoke_credential(self, node_id: str, now: float, event: Event) -> None:
        values = changes.credential_revoked(now)
        # only an active credential can be revoked (and the node must exist)
        update_with_event(
            NodeModel(node_id),
            values,
            NodeModel.credential_state == "active",
            self._event(event, [update_change(NodeModel, node_id, values)]),
        )

    def write_gpu_state(
        self, node_id: str, state: dict[str, Any], revision: int, blocks: int, holder: Holder | None, event: Event
    ) -> None:
        values = changes.gpu_state_written(state, revision)
        node_values = changes.gpu_blocks_set(blocks)
        unchanged_since_read = (
            InventoryModel.gpu_revision.does_not_exist()
            if revision == 1
            else InventoryModel.gpu_revision == revision - 1
        )
        node_condition = (
            holds_credential(holder.credential_sha256) if holder is not None else NodeModel.node_id.exists()
        )
        outbox = self._event(
            event, [update_change(InventoryModel, node_id, values), update_change(NodeModel, node_id, node_values)]
        )

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                NodeModel(node_id), actions=update_actions(NodeModel, node_values), condition=node_condition
            )
            transaction.update(
                InventoryModel(node_id),
                actions=update_actions(InventoryModel, values),
                condition=InventoryModel.node_id.exists() & unchanged_since_read,
            )
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    # --- removal ---------------------------------------------------------------------------

    def delete_node(self, node: Node, inventory: Inventory | None, silent_since: float, event: Event) -> None:
        """Everything keyed by the node in one transaction (node, inventory, claims, enrollment,
        partners' flags, counter, event; park items unlogged, as parking is)."""
        from chalicelib.stores.park_store import park_name  # park_store reads this module's guard

        node_id = node.node_id
        claims = [
            GpuClaimModel(uuid, node_id) for uuid in sorted((inventory.claimed_uuids if inventory else None) or ())
        ]
        partners = {
            partner: {"delete": {"duplicate_partners": {node_id}}} for partner in sorted(node.duplicate_partners or ())
        }
        parks = [ControlModel(park_name(capability, node_id)) for capability in sorted(node.capabilities or ())]
        gone = [NodeModel(node_id), *([InventoryModel(node_id)] if inventory else []), *claims]
        gone.append(EnrollmentModel(node.enrollment_id))
        logged = [delete_change(item) for item in gone]
        logged += [update_change(NodeModel, partner, {}, **change) for partner, change in partners.items()]
        counter = node.liveness == liveness.ONLINE
        if counter:
            logged.append(control_store.online_nodes_log_change(-1))
        outbox = self._event(event, logged)
        # revoked, or silent since the offline threshold (as node_removal.removable_reason judges it,
        # from the heartbeat's age: a node persisted offline is silent since then too)
        removable = (NodeModel.credential_state == "revoked") | (NodeModel.last_heartbeat_at <= silent_since)
        unchanged_inventory = (
            InventoryModel.node_id.does_not_exist()
            if inventory is None
            else InventoryModel.revision.does_not_exist()
            if inventory.revision is None
            else InventoryModel.revision == inventory.revision
        )

        def build(transaction: TransactWrite) -> None:
            # still in the liveness read (a node that came back online meanwhile stays)
            transaction.delete(NodeModel(node_id), condition=(NodeModel.liveness == node.liveness) & removable)
            # no inventory (and so no claim) was written since it was read
            transaction.delete(InventoryModel(node_id), condition=unchanged_inventory)
            for claim in claims:
                transaction.delete(claim)
            # its own enrollment record only (a simulated or seeded node may have none)
            transaction.delete(
                EnrollmentModel(node.enrollment_id),
                condition=EnrollmentModel.enrollment_id.does_not_exist() | (EnrollmentModel.node_id == node_id),
            )
            for partner, change in partners.items():
                transaction.update(
                    NodeModel(partner),
                    actions=update_actions(NodeModel, {}, **change),
                    # mutation-equivalent: moto cancels it unguarded too; on DynamoDB it stops a bare partner item
                    condition=NodeModel.node_id.exists(),
                )
            for park in parks:
                transaction.delete(park)
            if counter:
                item, actions = control_store.online_nodes_change(-1)
                transaction.update(item, actions=actions)
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def offline_since(self, cutoff: float, limit: int) -> list[str]:
        """The index's offline partitions hold each offline node under the bucket of its move to
        offline: nodes offline since ``cutoff`` are read there (``limit`` a shard at most), and their
        items (eventually consistent) keep those still offline since then."""
        candidates: list[str] = []
        for shard in range(SHARDS):
            query = NodeModel.by_liveness.query(
                f"{liveness.OFFLINE}#{shard}", NodeModel.heartbeat_bucket <= cutoff, limit=limit
            )
            candidates.extend(item.node_id for item in query)
        if not candidates:
            return []
        still = {
            item.node_id
            for item in NodeModel.batch_get(
                candidates, attributes_to_get=["node_id", "liveness", "liveness_changed_at"]
            )
            if item.liveness == liveness.OFFLINE and item.liveness_changed_at <= cutoff
        }
        return sorted(node_id for node_id in candidates if node_id in still)[:limit]

    # --- the push channel (ephemeral: not logged) ----------------------------------------

    def connect_channel(self, node_id: str, ticket_sha256: str, connection_id: str, now: float) -> None:
        """One conditional UpdateItem: the connection recorded, the ticket used up."""
        self._update_or_guard(
            node_id,
            changes.channel_connected(connection_id, now),
            (
                # the ticket presented is the node's unused ticket
                (NodeModel.channel_ticket_sha256 == ticket_sha256)
                # and it has not expired
                & (NodeModel.channel_ticket_expires_at > round(now, 3))
                # and the node's credential is still active
                & (NodeModel.credential_state == "active")
            ),
        )

    def disconnect_channel(self, node_id: str, connection_id: str) -> None:
        # only the connection that closed is forgotten: a newer one is kept
        self._update_or_guard(node_id, changes.channel_disconnected(), NodeModel.channel_connection_id == connection_id)

    def node_of_connection(self, connection_id: str) -> str | None:
        for item in NodeModel.by_channel.query(connection_id, limit=1):
            return str(item.node_id)
        return None

    def _update_or_guard(self, node_id: str, values: dict[str, Any], condition: Any) -> None:
        """One conditional UpdateItem that is not logged; GuardFailed when the condition fails."""
        node = NodeModel(node_id)
        try:
            node.update(actions=update_actions(NodeModel, values), condition=condition)
        except UpdateError as error:
            if error.cause_response_code == "ConditionalCheckFailedException":
                raise GuardFailed("channel guard") from None
            raise
