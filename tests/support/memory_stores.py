"""In-memory stores with the DynamoDB stores' guard semantics, for unit tests of the services.

Each write checks exactly the guard its DynamoDB store's condition expresses; when the guard does
not hold it changes nothing and raises ``GuardFailed``. Multi-item writes (a transaction in
DynamoDB) check every guard before changing anything, under one lock shared by the three stores.
Records go in and come out as copies: a caller mutating a record it passed or got changes nothing
stored.

A shared ``Journal`` records what the services did: every event written, how many reads and
successful writes, and every store call by name. ``Journal.before_next`` runs an action inside a
coming write, before its guards are checked: a concurrent writer that moved first.

DynamoDB behaviours kept on purpose:

* an update creates its item when the guard allows a missing one (``replace_inventory`` with no
  previous revision, the online counter's ADD, ``recount_online_nodes``);
* a comparison with a missing attribute is false (``set_liveness`` on a node with no heartbeat);
* a string set emptied by a delete is removed (None), and an empty set cannot be written
  (ValueError, as DynamoDB's validation error);
* the sweep index holds only nodes with both ``liveness_shard`` and ``heartbeat_bucket``;
* the work indexes hold an item only while it has its index key: ``queue_key`` (by_queue),
  ``lease_partition`` (by_lease), ``lease_holder`` (by_holder);
* a work page key is the last evaluated key as DynamoDB gives it (``{"work_id": {"S": id}}``),
  so it makes the same ``paging`` token; a filtered work page holds up to ``limit`` matches.

``MemoryObjectStore`` stands for the bucket: presigned URLs are fake https URLs that name the
key and expiry; ``upload`` is the agent's PUT to one. Its calls are journalled by name but are
not DynamoDB reads or writes, and run no ``before_next`` hook.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import ONLINE_NODES, Enrollment, Event, FleetState, Inventory, Node, WorkItem
from chalicelib.stores.contract import CLAIM_CHANGES_PER_WRITE, PARTNERS_PER_WRITE, PageKey, Stores, WorkGuard

R = TypeVar("R")

#: (store method name, action): see Journal.before_next.
Hook = Callable[[str], None]


@dataclass
class Journal:
    """What the services did with the stores (shared by the three fakes)."""

    #: every event written, in order
    events: list[Event] = field(default_factory=list)
    #: successful writes (one per store write call: one UpdateItem or one transaction)
    writes: int = 0
    #: read calls (one per get, get_inventory, inventories_for, list_page, claimants,
    #: late_nodes, count_in_state, oldest_queued, any_queued, expired_leases, leases_held_by)
    reads: int = 0
    #: every store call by method name ("nodes.record_heartbeat"), failed writes included (and
    #: the object store's, "objects.put", which are neither reads nor writes)
    calls: list[str] = field(default_factory=list)
    #: called with the method name inside every write, before its guards are checked
    before_write: list[Hook] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _in_hook: bool = field(default=False, repr=False)

    def event_types(self) -> list[str]:
        return [event.type for event in self.events]

    def events_of(self, event_type: str) -> list[Event]:
        return [event for event in self.events if event.type == event_type]

    def before_next(self, method: str, action: Callable[[], object], times: int = 1) -> None:
        """Run ``action`` inside the next ``times`` writes of ``method`` ("nodes.set_liveness"),
        before their guards are checked: someone else wrote first. Writes the action makes run
        no hooks."""
        left = [times]

        def hook(called: str) -> None:
            if called != method:
                return
            left[0] -= 1
            if left[0] <= 0:
                self.before_write.remove(hook)
            action()

        self.before_write.append(hook)

    def reset_counts(self) -> None:
        """Forget what was done so far (after a test's setup)."""
        self.events.clear()
        self.calls.clear()
        self.writes = self.reads = 0

    # --- used by the fakes ---------------------------------------------------------------

    def read(self, method: str) -> None:
        self.calls.append(method)
        self.reads += 1

    def start_write(self, method: str) -> None:
        self.calls.append(method)
        if self._in_hook:
            return
        self._in_hook = True
        try:
            for hook in list(self.before_write):
                hook(method)
        finally:
            self._in_hook = False

    def wrote(self, *events: Event) -> None:
        self.writes += 1
        self.events.extend(copy.deepcopy(events))


def _copy(record: R) -> R:
    return copy.deepcopy(record)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise GuardFailed(what)


def _no_empty_sets(record: Any) -> None:
    for spec in dataclasses.fields(record):
        value = getattr(record, spec.name)
        if isinstance(value, set) and not value:
            raise ValueError(f"{type(record).__name__}.{spec.name}: DynamoDB cannot store an empty set")


def _apply(record: Any, values: dict[str, Any]) -> None:
    """SET each value (None: REMOVE the attribute). Unknown names are a programming error."""
    names = {spec.name for spec in dataclasses.fields(record)}
    for name, value in values.items():  # all checked before anything changes
        if name not in names:
            raise KeyError(f"{type(record).__name__} has no attribute {name!r}")
        if isinstance(value, set) and not value:
            raise ValueError(f"{name}: DynamoDB cannot store an empty set")
    for name, value in values.items():
        setattr(record, name, copy.deepcopy(value))


def _add_to_set(current: set[str] | None, added: set[str]) -> set[str]:
    if not added:
        raise ValueError("DynamoDB cannot ADD an empty set")
    return set(current or ()) | added


def _delete_from_set(current: set[str] | None, deleted: set[str]) -> set[str] | None:
    if not deleted:
        raise ValueError("DynamoDB cannot DELETE an empty set")
    remaining = set(current or ()) - deleted
    return remaining or None  # DynamoDB removes a set with its last element


def _start_id(start: PageKey, key_name: str) -> str | None:
    if start is None:
        return None
    value = start[key_name]
    return str(value["S"] if isinstance(value, dict) else value)


def _page(
    records: dict[str, R],
    key_name: str,
    limit: int,
    start: PageKey,
    keep: Callable[[R], bool] = lambda _: True,
    typed: bool = False,
) -> tuple[list[R], PageKey]:
    """Up to ``limit`` records that ``keep`` keeps, by id after ``start``; the key of the last one
    returned while any record (kept or not) is left after it (a filtered Scan's pages). A
    ``typed`` key is DynamoDB's (``{"work_id": {"S": id}}``, what ``paging`` encodes)."""
    after = _start_id(start, key_name)
    ids = [record_id for record_id in sorted(records) if after is None or record_id > after]
    page: list[str] = []
    for record_id in ids:
        if keep(records[record_id]):
            page.append(record_id)
            if len(page) == limit:
                break
    more = bool(page) and page[-1] != ids[-1] and len(page) == limit
    if not more:
        return [_copy(records[record_id]) for record_id in page], None
    return [_copy(records[record_id]) for record_id in page], {key_name: {"S": page[-1]} if typed else page[-1]}


class MemoryFleetStateStore:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        #: by name
        self.records: dict[str, FleetState] = {}

    def seed(self, item: FleetState) -> None:
        """Store ``item`` as it is (test setup: no guard, no event, not counted)."""
        with self.journal.lock:
            self.records[item.name] = _copy(item)

    def get(self, name: str) -> FleetState | None:
        with self.journal.lock:
            self.journal.read("fleet.get")
            stored = self.records.get(name)
            return _copy(stored) if stored else None

    def _revision(self, name: str) -> int | None:
        stored = self.records.get(name)
        return None if stored is None else stored.revision

    def put(self, item: FleetState, event: Event) -> None:
        if item.revision is None or int(item.revision) < 1:
            raise ValueError("a fleet-state item is written with the next revision (the one read, plus one)")
        with self.journal.lock:
            self.journal.start_write("fleet.put")
            # revision 1: the item, or its revision, is absent
            _require(self._revision(item.name) == ((int(item.revision) - 1) or None), "fleet item revision")
            _no_empty_sets(item)
            self.records[item.name] = _copy(item)
            self.journal.wrote(event)

    def recount_online_nodes(self, read: FleetState | None, count: int, now: float, event: Event) -> None:
        read_revision = None if read is None or read.revision is None else int(read.revision)
        with self.journal.lock:
            self.journal.start_write("fleet.recount_online_nodes")
            _require(self._revision(ONLINE_NODES) == read_revision, "online counter revision")
            stored = self.records.setdefault(ONLINE_NODES, FleetState(ONLINE_NODES))
            stored.count, stored.revision, stored.updated_at = count, (read_revision or 0) + 1, round(now, 3)
            self.journal.wrote(event)

    def add_online(self, delta: int) -> None:
        """The online counter's ADD (count delta, revision 1), inside a caller's write; creates
        the item when absent."""
        stored = self.records.setdefault(ONLINE_NODES, FleetState(ONLINE_NODES))
        stored.count = (stored.count or 0) + delta
        stored.revision = (stored.revision or 0) + 1


class MemoryNodeStore:
    def __init__(self, journal: Journal, fleet: MemoryFleetStateStore) -> None:
        self.journal = journal
        self._fleet = fleet
        #: by node id
        self.records: dict[str, Node] = {}
        #: by node id
        self.inventories: dict[str, Inventory] = {}
        #: GPU UUID -> {node id: claimed_at}
        self.claims: dict[str, dict[str, float]] = {}

    # --- test setup and inspection (no guard, no event, not counted) -----------------------

    def seed(self, node: Node, inventory: Inventory | None = None) -> None:
        """Store ``node`` (and ``inventory``, with a claim per UUID in its ``claimed_uuids``)."""
        with self.journal.lock:
            _no_empty_sets(node)
            self.records[node.node_id] = _copy(node)
            if inventory is not None:
                self.seed_inventory(inventory)

    def seed_inventory(self, inventory: Inventory) -> None:
        with self.journal.lock:
            _no_empty_sets(inventory)
            self.inventories[inventory.node_id] = _copy(inventory)
            for uuid in inventory.claimed_uuids or ():
                self.claims.setdefault(uuid, {})[inventory.node_id] = inventory.updated_at

    def claimed_by(self, node_id: str) -> set[str]:
        """The GPU UUIDs ``node_id`` holds a claim on (what the gpu_claims table says)."""
        with self.journal.lock:
            return {uuid for uuid, holders in self.claims.items() if node_id in holders}

    # --- reads ---------------------------------------------------------------------------

    def get(self, node_id: str) -> Node | None:
        with self.journal.lock:
            self.journal.read("nodes.get")
            stored = self.records.get(node_id)
            return _copy(stored) if stored else None

    def get_inventory(self, node_id: str) -> Inventory | None:
        with self.journal.lock:
            self.journal.read("nodes.get_inventory")
            stored = self.inventories.get(node_id)
            return _copy(stored) if stored else None

    def inventories_for(self, node_ids: list[str]) -> dict[str, Inventory]:
        if not node_ids:
            return {}
        with self.journal.lock:
            self.journal.read("nodes.inventories_for")
            return {node_id: _copy(self.inventories[node_id]) for node_id in node_ids if node_id in self.inventories}

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Node], PageKey]:
        with self.journal.lock:
            self.journal.read("nodes.list_page")
            return _page(self.records, "node_id", limit, start)

    def claimants(self, gpu_uuid: str) -> list[str]:
        with self.journal.lock:
            self.journal.read("nodes.claimants")
            return sorted(self.claims.get(gpu_uuid, {}))

    def _indexed(self, liveness: str, shards: int) -> list[Node]:
        # the keys-only index holds a node only while it has both of its keys
        partitions = {f"{liveness}#{shard}": shard for shard in range(shards)}
        found = [
            node
            for node in self.records.values()
            if node.liveness_shard in partitions and node.heartbeat_bucket is not None
        ]
        return sorted(
            found, key=lambda node: (partitions[node.liveness_shard or ""], node.heartbeat_bucket or 0, node.node_id)
        )

    def late_nodes(self, liveness: str, heartbeat_bucket_not_after: float, shards: int) -> list[str]:
        with self.journal.lock:
            self.journal.read("nodes.late_nodes")
            return [
                node.node_id
                for node in self._indexed(liveness, shards)
                if (node.heartbeat_bucket or 0) <= heartbeat_bucket_not_after
            ]

    def count_in_state(self, liveness: str, shards: int) -> int:
        with self.journal.lock:
            self.journal.read("nodes.count_in_state")
            return len(self._indexed(liveness, shards))

    # --- writes --------------------------------------------------------------------------

    def _holds_credential(self, node_id: str, credential_sha256: str) -> Node:
        node = self.records.get(node_id)
        _require(
            node is not None and node.credential_sha256 == credential_sha256 and node.credential_state == "active",
            "credential",
        )
        assert node is not None
        return node

    def record_heartbeat(self, node_id: str, credential_sha256: str, values: dict[str, Any]) -> Node:
        with self.journal.lock:
            self.journal.start_write("nodes.record_heartbeat")
            node = self._holds_credential(node_id, credential_sha256)
            _require(node.liveness == "online", "online")
            _apply(node, values)
            self.journal.wrote()
            return _copy(node)

    def record_transition_heartbeat(
        self, node_id: str, credential_sha256: str, previous_liveness: str, values: dict[str, Any], event: Event
    ) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.record_transition_heartbeat")
            node = self._holds_credential(node_id, credential_sha256)
            _require(node.liveness == previous_liveness, "liveness unchanged")
            _apply(node, values)
            self._fleet.add_online(+1)
            self.journal.wrote(event)

    def set_liveness(
        self,
        node_id: str,
        expected_liveness: str,
        heartbeat_not_after: float,
        values: dict[str, Any],
        event: Event,
        online_delta: int = 0,
    ) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.set_liveness")
            node = self.records.get(node_id)
            _require(node is not None and node.liveness == expected_liveness, "liveness unchanged")
            assert node is not None
            # a comparison with a missing attribute is false
            _require(node.last_heartbeat_at is not None and node.last_heartbeat_at <= heartbeat_not_after, "silent")
            _apply(node, values)
            if online_delta:
                self._fleet.add_online(online_delta)
            self.journal.wrote(event)

    def replace_inventory(
        self,
        node_id: str,
        credential_sha256: str,
        values: dict[str, Any],
        previous_revision: str | None,
        event: Event,
        capabilities: set[str] | None = None,
    ) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.replace_inventory")
            node = self._holds_credential(node_id, credential_sha256)
            stored = self.inventories.get(node_id)
            _require((stored.revision if stored else None) == previous_revision, "inventory revision")
            if stored is None:
                # an update creates the item: its values must make a whole inventory
                stored = Inventory(
                    node_id=node_id, **{name: value for name, value in values.items() if value is not None}
                )
                _apply(stored, values)
                self.inventories[node_id] = stored
            else:
                _apply(stored, values)
            node.capabilities = set(capabilities) if capabilities else None
            self.journal.wrote(event)

    def change_claims(
        self, node_id: str, revision: str, uuids: list[str], adding: bool, now: float, event: Event
    ) -> None:
        if len(uuids) > CLAIM_CHANGES_PER_WRITE:
            raise ValueError(f"at most {CLAIM_CHANGES_PER_WRITE} claim changes a write")
        with self.journal.lock:
            self.journal.start_write("nodes.change_claims")
            inventory = self.inventories.get(node_id)
            _require(inventory is not None and inventory.revision == revision, "inventory revision")
            assert inventory is not None
            if adding:
                inventory.claimed_uuids = _add_to_set(inventory.claimed_uuids, set(uuids))
                for uuid in uuids:
                    self.claims.setdefault(uuid, {})[node_id] = round(now, 3)
            else:
                inventory.claimed_uuids = _delete_from_set(inventory.claimed_uuids, set(uuids))
                for uuid in uuids:
                    holders = self.claims.get(uuid, {})
                    holders.pop(node_id, None)
                    if not holders:
                        self.claims.pop(uuid, None)
            self.journal.wrote(event)

    def _both_sides(self, node_id: str, partners: list[str]) -> list[tuple[Node, set[str]]]:
        if len(partners) > PARTNERS_PER_WRITE:
            raise ValueError(f"at most {PARTNERS_PER_WRITE} partners a write")
        if node_id in partners or len(set(partners)) != len(partners):
            raise ValueError("one transaction cannot change the same node twice")
        targets = [(node_id, set(partners)), *((partner, {node_id}) for partner in partners)]
        _require(all(target in self.records for target, _ in targets), "every node exists")
        return [(self.records[target], others) for target, others in targets]

    def link_duplicates(self, node_id: str, partners: list[str], now: float, event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.link_duplicates")
            for node, others in self._both_sides(node_id, partners):
                node.duplicate_partners = _add_to_set(node.duplicate_partners, others)
                if node.duplicate_suspected_at is None:  # keep the first flag time
                    node.duplicate_suspected_at = round(now, 3)
            self.journal.wrote(event)

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.unlink_duplicates")
            for node, others in self._both_sides(node_id, partners):
                node.duplicate_partners = _delete_from_set(node.duplicate_partners, others)
            self.journal.wrote(event)

    def forget_duplicate_time(self, node_id: str, event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.forget_duplicate_time")
            node = self.records.get(node_id)
            _require(node is not None and node.duplicate_partners is None, "no partner left")
            assert node is not None
            node.duplicate_suspected_at = None
            self.journal.wrote(event)

    def revoke_credential(self, node_id: str, values: dict[str, Any], event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("nodes.revoke_credential")
            node = self.records.get(node_id)
            _require(node is not None and node.credential_state == "active", "credential active")
            assert node is not None
            _apply(node, values)
            self.journal.wrote(event)


class MemoryEnrollmentStore:
    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        self.journal = journal
        self._nodes = nodes
        #: by enrollment id
        self.records: dict[str, Enrollment] = {}

    def seed(self, enrollment: Enrollment) -> None:
        """Store ``enrollment`` as it is (test setup: no guard, no event, not counted)."""
        with self.journal.lock:
            self.records[enrollment.enrollment_id] = _copy(enrollment)

    def get(self, enrollment_id: str) -> Enrollment | None:
        with self.journal.lock:
            self.journal.read("enrollments.get")
            stored = self.records.get(enrollment_id)
            return _copy(stored) if stored else None

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Enrollment], PageKey]:
        with self.journal.lock:
            self.journal.read("enrollments.list_page")
            return _page(self.records, "enrollment_id", limit, start)

    def create(self, enrollment: Enrollment, event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("enrollments.create")
            _require(enrollment.enrollment_id not in self.records, "new enrollment id")
            self.records[enrollment.enrollment_id] = _copy(enrollment)
            self.journal.wrote(event)

    def revoke(self, enrollment_id: str, values: dict[str, Any], event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("enrollments.revoke")
            stored = self.records.get(enrollment_id)
            _require(stored is not None and stored.state == "pending", "pending")
            assert stored is not None
            _apply(stored, values)
            self.journal.wrote(event)

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
        with self.journal.lock:
            self.journal.start_write("enrollments.consume")
            stored = self.records.get(enrollment_id)
            _require(
                stored is not None
                and stored.token_sha256 == token_sha256
                and stored.state == "pending"
                and stored.expires_at > now,
                "pending, unexpired token",
            )
            assert stored is not None
            _require(node.node_id not in self._nodes.records, "new node id")
            _require(inventory.node_id not in self._nodes.inventories, "new inventory")
            _no_empty_sets(node)
            _no_empty_sets(inventory)
            _apply(stored, enrollment_values)
            self._nodes.records[node.node_id] = _copy(node)
            self._nodes.inventories[inventory.node_id] = _copy(inventory)
            for uuid in claim_uuids:
                self._nodes.claims.setdefault(uuid, {})[node.node_id] = round(now, 3)
            kinds = ("enrollment.consumed", "node.registered", "credential.issued", "inventory.replaced")
            self.journal.wrote(*(Event(kind, dict(subject), now) for kind in kinds))


class MemoryWorkStore:
    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        self.journal = journal
        self._nodes = nodes
        #: by work id
        self.records: dict[str, WorkItem] = {}

    def seed(self, item: WorkItem) -> None:
        """Store ``item`` as it is (test setup: no guard, no event, not counted)."""
        with self.journal.lock:
            self.records[item.work_id] = _copy(item)

    # --- reads ---------------------------------------------------------------------------

    def get(self, work_id: str) -> WorkItem | None:
        with self.journal.lock:
            self.journal.read("work.get")
            stored = self.records.get(work_id)
            return _copy(stored) if stored else None

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]:
        def keep(item: WorkItem) -> bool:
            return (status is None or item.status == status) and (capability is None or item.capability == capability)

        with self.journal.lock:
            self.journal.read("work.list_page")
            return _page(self.records, "work_id", limit, start, keep, typed=True)

    def _queued(self, capability: str) -> list[WorkItem]:
        # by_queue: only items with a queue_key (and its sort key, queued_at)
        found = [item for item in self.records.values() if item.queue_key == capability and item.queued_at is not None]
        return sorted(found, key=lambda item: (item.queued_at or 0.0, item.work_id))

    def oldest_queued(self, capability: str, limit: int) -> list[WorkItem]:
        with self.journal.lock:
            self.journal.read("work.oldest_queued")
            return [_copy(item) for item in self._queued(capability)[:limit]]

    def any_queued(self, capability: str) -> bool:
        with self.journal.lock:
            self.journal.read("work.any_queued")
            return bool(self._queued(capability))

    def expired_leases(self, now: float, limit: int) -> list[WorkItem]:
        with self.journal.lock:
            self.journal.read("work.expired_leases")
            found = [
                item
                for item in self.records.values()
                if item.lease_partition == "leased"
                and item.lease_expires_at is not None
                and item.lease_expires_at <= now
            ]
            found.sort(key=lambda item: (item.lease_expires_at or 0.0, item.work_id))
            return [_copy(item) for item in found[:limit]]

    def leases_held_by(self, node_id: str) -> list[WorkItem]:
        with self.journal.lock:
            self.journal.read("work.leases_held_by")
            found = sorted(
                (item for item in self.records.values() if item.lease_holder == node_id), key=lambda item: item.work_id
            )
            return [_copy(item) for item in found]

    # --- writes --------------------------------------------------------------------------

    def create(self, item: WorkItem, event: Event) -> None:
        with self.journal.lock:
            self.journal.start_write("work.create")
            _require(item.work_id not in self.records, "new work id")
            _no_empty_sets(item)
            self.records[item.work_id] = _copy(item)
            self.journal.wrote(event)

    def _node_holds(self, node_id: str, credential_sha256: str) -> bool:
        node = self._nodes.records.get(node_id)
        return node is not None and node.credential_sha256 == credential_sha256 and node.credential_state == "active"

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
        with self.journal.lock:
            self.journal.start_write("work.claim")
            item = self.records.get(work_id)
            node = self._nodes.records.get(node_id)
            failed: list[str] = []
            if item is None or item.status != "queued" or item.epoch != read_epoch:
                failed.append("work")
            if not (
                self._node_holds(node_id, credential_sha256)
                and node is not None
                and node.liveness == "online"
                and node.last_heartbeat_at is not None  # a comparison with a missing attribute is false
                and node.last_heartbeat_at > heartbeat_after
            ):
                failed.append("node")
            if failed:
                raise GuardFailed("claim", failed=tuple(failed))
            assert item is not None
            _apply(item, values)
            self.journal.wrote(event)

    def update(
        self,
        work_id: str,
        guard: WorkGuard,
        values: dict[str, Any],
        event: Event,
        holder_credential_sha256: str | None = None,
    ) -> WorkItem:
        with self.journal.lock:
            self.journal.start_write("work.update")
            item = self.records.get(work_id)
            _require(
                item is not None
                and item.status in guard.statuses
                and (guard.epoch is None or item.epoch == guard.epoch)
                and (guard.node_id is None or item.lease_holder == guard.node_id)
                and (
                    guard.lease_expired_by is None
                    or (item.lease_expires_at is not None and item.lease_expires_at <= guard.lease_expired_by)
                ),
                "work guard",
            )
            assert item is not None
            # the store checks the holder's credential only with a holder to check (as DynamoDB's)
            if holder_credential_sha256 is not None and guard.node_id is not None:
                _require(self._node_holds(guard.node_id, holder_credential_sha256), "holder credential")
            _apply(item, values)
            self.journal.wrote(event)
            return _copy(item)


class MemoryObjectStore:
    """The work bucket: key -> (body, content type)."""

    #: fake presigned URLs (https, so they pass the claim answer's URL schema)
    URL_BASE = "https://objects.memory.invalid"

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.objects: dict[str, tuple[bytes, str]] = {}

    def upload(self, key: str, body: bytes, content_type: str = "application/json") -> None:
        """The agent's PUT to a presigned URL (test setup: not journalled)."""
        with self.journal.lock:
            self.objects[key] = (bytes(body), content_type)

    def body(self, key: str) -> bytes:
        with self.journal.lock:
            return self.objects[key][0]

    def put(self, key: str, body: bytes, content_type: str) -> None:
        with self.journal.lock:
            self.journal.calls.append("objects.put")
            self.objects[key] = (bytes(body), content_type)

    def presigned_get(self, key: str, expires_seconds: int) -> str:
        with self.journal.lock:
            self.journal.calls.append("objects.presigned_get")
        return f"{self.URL_BASE}/get/{key}?expires={int(expires_seconds)}"

    def presigned_put(self, key: str, expires_seconds: int) -> str:
        with self.journal.lock:
            self.journal.calls.append("objects.presigned_put")
        return f"{self.URL_BASE}/put/{key}?expires={int(expires_seconds)}"

    def digest(self, key: str, max_bytes: int) -> tuple[str | None, int] | None:
        with self.journal.lock:
            self.journal.calls.append("objects.digest")
            stored = self.objects.get(key)
        if stored is None:
            return None
        body = stored[0]
        if len(body) > max_bytes:
            return None, len(body)
        return hashlib.sha256(body).hexdigest(), len(body)


@dataclass(frozen=True)
class MemoryStores(Stores):
    """``Stores`` over the fakes, with their journal at hand."""

    enrollments: MemoryEnrollmentStore
    nodes: MemoryNodeStore
    fleet: MemoryFleetStateStore
    work: MemoryWorkStore
    objects: MemoryObjectStore
    journal: Journal


def memory_stores() -> MemoryStores:
    """Empty stores sharing one lock and one journal."""
    journal = Journal()
    fleet = MemoryFleetStateStore(journal)
    nodes = MemoryNodeStore(journal, fleet)
    return MemoryStores(
        enrollments=MemoryEnrollmentStore(journal, nodes),
        nodes=nodes,
        fleet=fleet,
        work=MemoryWorkStore(journal, nodes),
        objects=MemoryObjectStore(journal),
        journal=journal,
    )
