"""What each store must do: the only way services read and change state.

Services take a ``Stores`` and never import a store module. Production passes the DynamoDB
stores (``dynamodb.py``); unit tests pass in-memory fakes with the same guard semantics
(``tests/support/memory_stores.py``). Each write says what happens in domain terms (a lease, a
requeue, a heartbeat): the store decides which attributes that changes and derives its own index
keys, shards and partitions. Every write that changes state is guarded and atomic: when its guard
does not hold it changes nothing and raises ``errors.GuardFailed``, and the service decides what
that means. Every logged write takes the ``Event`` it records; the store adds the changes it made
and writes the event in the same transaction. The writes that return a record return it as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from chalicelib.domain.records import ControlItem, Enrollment, Event, Heartbeat, Inventory, Node, Parked, WorkItem

#: An opaque position in a paged listing (None: the first page, or no more pages).
PageKey = dict[str, Any] | None


@dataclass(frozen=True)
class Holder:
    """A node writing as itself: the write also checks it still holds this active credential."""

    node_id: str
    credential_sha256: str


class EnrollmentStore(Protocol):
    def get(self, enrollment_id: str) -> Enrollment | None: ...

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Enrollment], PageKey]: ...

    def create(self, enrollment: Enrollment, event: Event) -> None:
        """Write a new enrollment (GuardFailed if its id exists)."""

    def revoke(self, enrollment_id: str, now: float, event: Event) -> None:
        """Mark the enrollment revoked at ``now`` if it exists and is still pending (GuardFailed
        otherwise)."""

    def consume(
        self,
        enrollment_id: str,
        token_sha256: str,
        idempotency_key_sha256: str,
        node: Node,
        inventory: Inventory,
        now: float,
    ) -> None:
        """All or nothing: mark the enrollment consumed by ``node`` (with the agent's idempotency
        key) while its token is ``token_sha256``, it is pending and ``expires_at > now``; create
        ``node``, ``inventory`` and a GPU claim per UUID in ``inventory.claimed_uuids``; log
        enrollment.consumed, node.registered, credential.issued and inventory.replaced. GuardFailed
        when the enrollment guard does not hold."""


class NodeStore(Protocol):
    def get(self, node_id: str) -> Node | None: ...

    def get_inventory(self, node_id: str) -> Inventory | None: ...

    def inventories_for(self, node_ids: list[str]) -> dict[str, Inventory]: ...

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Node], PageKey]: ...

    def record_heartbeat(self, holder: Holder, heartbeat: Heartbeat, now: float) -> Node:
        """Record ``heartbeat`` at ``now`` (not logged) if the node holds this active credential
        and is persisted online; the node as written. GuardFailed otherwise."""

    def bring_online(
        self, holder: Holder, previous_liveness: str, heartbeat: Heartbeat, now: float, event: Event
    ) -> None:
        """Record ``heartbeat`` and bring the node online at ``now`` (one more online node), if the
        node holds this active credential and its liveness is still ``previous_liveness``. Logs the
        liveness fields and the counter change, not the telemetry."""

    def replace_inventory(
        self, holder: Holder, inventory: Inventory, previous_revision: str | None, capabilities: set[str], event: Event
    ) -> None:
        """Write ``inventory`` (its document, time, revision and rate window; not its claims) and
        the node's ``capabilities`` (empty: none) if the node holds this active credential and the
        stored inventory's revision is still ``previous_revision`` (None: it has none)."""

    def change_claims(
        self, node_id: str, revision: str, uuids: list[str], adding: bool, now: float, event: Event
    ) -> None:
        """Create (``adding``) or delete the node's claims on ``uuids`` and record them in the
        inventory's ``claimed_uuids``, while the inventory is still ``revision``. At most
        ``CLAIM_CHANGES_PER_WRITE`` UUIDs."""

    def claimants(self, gpu_uuid: str) -> list[str]:
        """Every node holding a claim on this GPU UUID."""

    def link_duplicates(self, node_id: str, partners: list[str], now: float, event: Event) -> None:
        """Add each partner to ``node_id``'s duplicate partners and ``node_id`` to each partner's
        (concurrent reports never lose a flag); keep the first flag time. GuardFailed when one of
        the nodes does not exist."""

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        """The reverse of ``link_duplicates``."""

    def forget_duplicate_time(self, node_id: str, event: Event) -> None:
        """Drop the flag time once no partner is left (GuardFailed while one is)."""

    def revoke_credential(self, node_id: str, now: float, event: Event) -> None:
        """Revoke the node's credential at ``now`` if it is active (GuardFailed otherwise)."""

    def write_gpu_state(
        self, node_id: str, state: dict[str, Any], revision: int, blocks: int, holder: Holder | None, event: Event
    ) -> None:
        """One transaction: the node's GPU state (its inventory's ``gpu_state``) at ``revision`` if
        the stored revision is ``revision - 1`` (none stored for 1), and the node's block bits
        (0 removes them). With a ``holder`` (the agent's own report), the node must also hold that
        active credential; without (an admin's change), it must exist. GuardFailed otherwise."""

    def change_liveness(
        self, node_id: str, source: str, target: str, silent_since: float, now: float, event: Event
    ) -> None:
        """The sweep's transition from ``source`` to ``target`` at ``now`` (moving the online
        counter when it leaves or enters online), if the node is still ``source`` and its last
        heartbeat is at or before ``silent_since``."""

    def late_nodes(self, liveness: str, cutoff: float) -> list[str]:
        """Ids of nodes persisted in ``liveness`` (online or stale) that may have been silent since
        ``cutoff``: every such node, and some that heartbeated shortly after it."""

    def count_in_state(self, liveness: str) -> int:
        """How many nodes are persisted in ``liveness`` (online or stale)."""

    def delete_node(self, node: Node, inventory: Inventory | None, silent_since: float, event: Event) -> None:
        """One transaction: delete ``node`` (as read) and everything of it: its inventory (GPU
        state included), its GPU claims (``inventory.claimed_uuids``), its enrollment record, its
        park items, and its id from each duplicate partner's flags (moving the online counter when
        it was persisted online). Only if its liveness is still the one read, its credential is
        revoked or it is persisted offline or its last heartbeat is at or before ``silent_since``,
        and its inventory's revision is still the one read (none: it still has none). At most
        ``NODE_DELETE_PARTS`` claims and partners together. GuardFailed otherwise."""

    def offline_since(self, cutoff: float, limit: int) -> list[str]:
        """Up to ``limit`` ids of nodes persisted offline since ``cutoff`` or earlier (reads only
        offline nodes; a node that went offline before the index held offline nodes is not found)."""

    # --- the push channel (ephemeral state: not logged) ---

    def connect_channel(self, node_id: str, ticket_sha256: str, connection_id: str, now: float) -> None:
        """Record ``connection_id`` as the node's channel connection at ``now`` and use up its ticket,
        if the node's unused ticket is ``ticket_sha256``, unexpired at ``now``, and its credential
        is active. GuardFailed otherwise."""

    def disconnect_channel(self, node_id: str, connection_id: str) -> None:
        """Forget the node's channel connection if it is still ``connection_id`` (GuardFailed
        otherwise: a newer connection is kept)."""

    def node_of_connection(self, connection_id: str) -> str | None:
        """The node whose channel connection is ``connection_id`` (None: none; may lag a fresh
        connection by a moment)."""


class ParkStore(Protocol):
    """Idle nodes waiting on their channel, by capability (ephemeral: not logged)."""

    def park(self, holder: Holder, connection_id: str, capabilities: set[str], now: float) -> None:
        """Park the node for ``capabilities`` (one write) if it holds this active credential, its
        channel connection is still ``connection_id`` and it is not parked. GuardFailed otherwise."""

    def parked(self, capability: str, limit: int) -> list[Parked]:
        """Up to ``limit`` nodes parked for ``capability``, longest parked first (reads only the
        parked nodes of that capability)."""

    def unpark(self, parked: Parked) -> None:
        """Un-park the node if it is still parked as ``parked`` says (GuardFailed otherwise: one
        waker wins each node)."""


class ChannelStore(Protocol):
    """Sending on the nodes' channel connections (API Gateway's management API)."""

    def send(self, connection_id: str, message: dict[str, Any]) -> bool:
        """Send ``message`` as one JSON text frame; False when the connection is gone."""

    def close(self, connection_id: str) -> None:
        """Close the connection (nothing when it is gone already)."""


class ControlStore(Protocol):
    """The control table: one item per name (the mass-outage hold, the online-node counter)."""

    def get(self, name: str) -> ControlItem | None: ...

    def put(self, item: ControlItem, event: Event) -> None:
        """Write ``item`` whole if the stored revision is ``item.revision - 1`` (absent for 1)."""

    def recount_online_nodes(self, read: ControlItem | None, count: int, now: float, event: Event) -> None:
        """Set the online counter to ``count`` if its revision is still the one ``read`` had."""


@dataclass(frozen=True)
class LeaseCheck:
    """Who may end or extend a lease, besides "it is still leased at the epoch read" (every given
    part must hold)."""

    #: the lease holder is this node
    node_id: str | None = None
    #: and it still holds this active credential
    credential_sha256: str | None = None
    #: the lease expired at or before this time
    expired_by: float | None = None

    @staticmethod
    def of(holder: Holder) -> LeaseCheck:
        return LeaseCheck(node_id=holder.node_id, credential_sha256=holder.credential_sha256)


class WorkStore(Protocol):
    """Every write takes the item as read and returns it as written. A lease write is guarded by
    "still leased at the read epoch" and its ``LeaseCheck``; an ``error`` is appended to the
    item's errors."""

    def get(self, work_id: str) -> WorkItem | None: ...

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]: ...

    def create(self, item: WorkItem, event: Event) -> None:
        """Write a new item (GuardFailed if its id exists: a retried submit)."""

    def queue_front(self, capability: str, limit: int) -> list[WorkItem]:
        """Up to ``limit`` queued items of ``capability`` from the front of the queue, oldest first.
        The store may keep a queue in parts and answer from one part that holds items, chosen at
        random (so concurrent claimers spread out); empty only when no item of ``capability`` is
        queued."""

    def any_queued(self, capability: str) -> bool:
        """Whether any item of ``capability`` is queued (cheap while one is; the store's parts
        are each read once to say none is)."""

    def lease(
        self,
        item: WorkItem,
        holder: Holder,
        heartbeat_after: float,
        until: float,
        now: float,
        event: Event,
        parked_at: float | None = None,
    ) -> WorkItem:
        """One transaction: lease the item to the holder until ``until`` (one more epoch and
        attempt) if it is still queued at the read epoch, and check that the node holds this
        active credential, is persisted online and heartbeated after ``heartbeat_after``, still
        serves the item's capability, and is parked at ``parked_at`` (None: not parked). So a
        claim may act on a remembered view of its node: the write checks every fact it used.
        GuardFailed when any does not hold; its ``failed`` names ``"work"`` (the item moved on)
        and/or ``"node"`` (the node's check failed: the service reads the node to tell why)."""

    def renew(self, item: WorkItem, holder: Holder, until: float, now: float, event: Event) -> WorkItem:
        """Extend the holder's lease to ``until``."""

    def complete(self, item: WorkItem, holder: Holder, result: dict[str, Any], now: float, event: Event) -> WorkItem:
        """The holder's attempt succeeded with ``result``: the item is succeeded."""

    def requeue(
        self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event, counted: bool = True
    ) -> WorkItem:
        """The attempt failed and may be retried: back to the queue at ``now``; not ``counted``:
        ``attempts`` goes back down by one (the node failed, not the item)."""

    def bury(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        """The attempt failed for good: the item is dead."""

    def cancel(self, item: WorkItem, now: float, event: Event) -> WorkItem:
        """Cancel the item if its status and epoch are still the ones read."""

    def expired_leases(self, now: float, limit: int) -> list[WorkItem]:
        """Leased items whose lease expired at or before ``now``, soonest first."""

    def leases_held_by(self, node_id: str) -> list[WorkItem]: ...


class ObjectStore(Protocol):
    """Work inputs and results in the bucket."""

    def put(self, key: str, body: bytes, content_type: str) -> None: ...

    def presigned_get(self, key: str, expires_seconds: int) -> str: ...

    def presigned_put(self, key: str, expires_seconds: int) -> str: ...

    def digest(self, key: str, max_bytes: int) -> tuple[str | None, int] | None:
        """(sha256 hex, size) of the object; the digest is None when it is over ``max_bytes``;
        None when there is no such object."""

    def copy(self, source_key: str, key: str) -> bool:
        """Copy the object at ``source_key`` to ``key`` (in the bucket); False when there is none."""

    def read(self, key: str, max_bytes: int) -> bytes | int | None:
        """The object's bytes; its size instead when it is over ``max_bytes``; None when there is
        no such object."""


#: One claim write changes at most this many GPU claims (DynamoDB allows 100 items in a
#: transaction; the inventory and the event take two).
CLAIM_CHANGES_PER_WRITE = 98
#: One duplicate-flag write changes at most this many partners (plus the node and the event).
PARTNERS_PER_WRITE = 98
#: A node's deletion changes at most this many GPU claims and duplicate partners together (plus the
#: node, its inventory, its enrollment, its park items, the online counter and the event).
NODE_DELETE_PARTS = 64


@dataclass(frozen=True)
class Stores:
    """One of each store: what every service takes."""

    enrollments: EnrollmentStore
    nodes: NodeStore
    control: ControlStore
    work: WorkStore
    objects: ObjectStore
    parking: ParkStore
    channel: ChannelStore
