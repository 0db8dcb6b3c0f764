"""What each store must do: the only way services read and change state.

Services take a ``Stores`` and never import a store module. Production passes the DynamoDB
stores (``dynamodb_stores.py``); unit tests pass in-memory fakes with the same guard semantics
(``tests/support/memory_stores.py``). Every write that changes state is guarded and atomic:
when its guard does not hold it changes nothing and raises ``errors.GuardFailed``, and the
service decides what that means. Every logged write takes the ``Event`` it records; the store
adds the changes it made and writes the event in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from chalicelib.domain.records import Enrollment, Event, FleetState, Inventory, Node, WorkItem

#: An opaque position in a paged listing (None: the first page, or no more pages).
PageKey = dict[str, Any] | None


class EnrollmentStore(Protocol):
    def get(self, enrollment_id: str) -> Enrollment | None: ...

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Enrollment], PageKey]: ...

    def create(self, enrollment: Enrollment, event: Event) -> None:
        """Write a new enrollment (GuardFailed if its id exists)."""

    def revoke(self, enrollment_id: str, values: dict[str, Any], event: Event) -> None:
        """Set ``values`` if the enrollment exists and is still pending (GuardFailed otherwise)."""

    def consume(
        self,
        enrollment_id: str,
        token_sha256: str,
        enrollment_values: dict[str, Any],
        node: Node,
        inventory: Inventory,
        claim_uuids: list[str],
        subject: dict[str, str],
        now: float,
    ) -> None:
        """All or nothing: set ``enrollment_values`` on the enrollment while its token is
        ``token_sha256``, it is pending and ``expires_at > now``; create ``node``, ``inventory`` and
        a GPU claim per UUID; log enrollment.consumed, node.registered, credential.issued and
        inventory.replaced with ``subject``. GuardFailed when the enrollment guard does not hold."""


class NodeStore(Protocol):
    def get(self, node_id: str) -> Node | None: ...

    def get_inventory(self, node_id: str) -> Inventory | None: ...

    def inventories_for(self, node_ids: list[str]) -> dict[str, Inventory]: ...

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Node], PageKey]: ...

    def record_heartbeat(self, node_id: str, credential_sha256: str, values: dict[str, Any]) -> Node:
        """Set ``values`` (not logged) if the node holds this active credential and is persisted
        online; the node as written. GuardFailed otherwise."""

    def record_transition_heartbeat(
        self, node_id: str, credential_sha256: str, previous_liveness: str, values: dict[str, Any], event: Event
    ) -> None:
        """Set ``values`` (bringing the node online) and add one to the online counter, if the node
        holds this active credential and its liveness is still ``previous_liveness``. Logs the
        liveness fields and the counter change, not the telemetry."""

    def replace_inventory(
        self,
        node_id: str,
        credential_sha256: str,
        values: dict[str, Any],
        previous_revision: str | None,
        event: Event,
        capabilities: set[str] | None = None,
    ) -> None:
        """Set the inventory's ``values`` and the node's ``capabilities`` (empty or None: none) if
        the node holds this active credential and the inventory's revision is still
        ``previous_revision`` (None: it has none)."""

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
        (set additions: concurrent reports never lose a flag); keep the first flag time. GuardFailed
        when one of the nodes does not exist."""

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        """The reverse of ``link_duplicates`` (set deletions)."""

    def forget_duplicate_time(self, node_id: str, event: Event) -> None:
        """Drop the flag time once no partner is left (GuardFailed while one is)."""

    def revoke_credential(self, node_id: str, values: dict[str, Any], event: Event) -> None:
        """Set ``values`` if the node's credential is active (GuardFailed otherwise)."""

    def set_liveness(
        self,
        node_id: str,
        expected_liveness: str,
        heartbeat_not_after: float,
        values: dict[str, Any],
        event: Event,
        online_delta: int = 0,
    ) -> None:
        """The sweep's transition: set ``values`` (and move the online counter) if the node is
        still ``expected_liveness`` and silent since ``heartbeat_not_after``."""

    def late_nodes(self, liveness: str, heartbeat_bucket_not_after: float, shards: int) -> list[str]:
        """Ids of nodes persisted in ``liveness`` whose heartbeat bucket starts by the cutoff."""

    def count_in_state(self, liveness: str, shards: int) -> int: ...


class FleetStateStore(Protocol):
    def get(self, name: str) -> FleetState | None: ...

    def put(self, item: FleetState, event: Event) -> None:
        """Write ``item`` whole if the stored revision is ``item.revision - 1`` (absent for 1)."""

    def recount_online_nodes(self, read: FleetState | None, count: int, now: float, event: Event) -> None:
        """Set the online counter to ``count`` if its revision is still the one ``read`` had."""


@dataclass(frozen=True)
class WorkGuard:
    """What a work item must still be for a write to apply (every given part must hold)."""

    #: its status is one of these
    statuses: tuple[str, ...]
    #: its epoch is exactly this (the fencing token the writer read or was given)
    epoch: int | None = None
    #: its lease holder is this node
    node_id: str | None = None
    #: its lease expired at or before this time
    lease_expired_by: float | None = None


class WorkStore(Protocol):
    def get(self, work_id: str) -> WorkItem | None: ...

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]: ...

    def create(self, item: WorkItem, event: Event) -> None:
        """Write a new item (GuardFailed if its id exists: a retried submit)."""

    def oldest_queued(self, capability: str, limit: int) -> list[WorkItem]:
        """Up to ``limit`` queued items of ``capability``, oldest first."""

    def any_queued(self, capability: str) -> bool:
        """Whether any item of ``capability`` is queued (one key read at most)."""

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
        """One transaction: set ``values`` on the item if it is still queued at ``read_epoch``, and
        check that the node holds this active credential, is persisted online and heartbeated
        after ``heartbeat_after``. GuardFailed when either does not hold (the service reads the
        node again to tell which)."""

    def update(
        self,
        work_id: str,
        guard: WorkGuard,
        values: dict[str, Any],
        event: Event,
        holder_credential_sha256: str | None = None,
    ) -> None:
        """Set ``values`` (None removes) if ``guard`` holds and, when given, the holder
        (``guard.node_id``) still has this active credential; logs ``event`` in the same
        transaction. GuardFailed otherwise."""

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


#: One claim write changes at most this many GPU claims (DynamoDB allows 100 items in a
#: transaction; the inventory and the event take two).
CLAIM_CHANGES_PER_WRITE = 98
#: One duplicate-flag write changes at most this many partners (plus the node and the event).
PARTNERS_PER_WRITE = 98


@dataclass(frozen=True)
class Stores:
    enrollments: EnrollmentStore
    nodes: NodeStore
    fleet: FleetStateStore
    work: WorkStore
    objects: ObjectStore
