"""In-memory stores: plain records behind the DynamoDB stores' guards, for unit tests of the services.

Each write checks exactly the guard its DynamoDB store's condition expresses; when the guard does
not hold it changes nothing and raises ``GuardFailed``. A write changes its records as
``chalicelib.stores.changes`` says (what the DynamoDB stores write too). Every write checks all
its guards before changing anything, under one lock shared by the stores. Records go in and come
out as copies.

A shared ``Journal`` records what the services did: every event written, how many reads and
successful writes, and every store call by name. ``Journal.before_next`` runs an action inside a
coming write, before its guards are checked: a concurrent writer that moved first.

``MemoryObjectStore`` stands for the bucket: presigned URLs are fake https URLs that name the
key and expiry; ``upload`` is the agent's PUT to one. Its calls are journalled by name but are
not reads or writes, and run no ``before_next`` hook.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import ONLINE_NODES, ControlItem, Enrollment, Event, Heartbeat, Inventory, Node, WorkItem
from chalicelib.stores import changes
from chalicelib.stores.contract import CLAIM_CHANGES_PER_WRITE, PARTNERS_PER_WRITE, Holder, LeaseCheck, PageKey, Stores

R = TypeVar("R")
Hook = Callable[[str], None]


@dataclass
class Journal:
    """What the services did with the stores (shared by the fakes)."""

    #: every event written, in order
    events: list[Event] = field(default_factory=list)
    #: successful writes (one per store write call: one UpdateItem or one transaction)
    writes: int = 0
    #: read calls (one per get, list_page, claimants, late_nodes, oldest_queued and the like)
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
        """Run ``action`` inside the next ``times`` writes of ``method`` ("nodes.change_liveness"),
        before their guards are checked: someone else wrote first. Its own writes run no hooks."""
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


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise GuardFailed(what)


def _bounded(items: list[str], most: int) -> None:
    """One transaction's item limit; DynamoDB refuses an empty set change."""
    if not 0 < len(items) <= most or len(set(items)) != len(items):
        raise ValueError(f"1 to {most} distinct items a write")


def _set_or_none(values: set[str]) -> set[str] | None:
    return values or None  # DynamoDB removes a set with its last element


class _Store:
    #: the prefix of this store's calls in the journal, and the records' key
    name, key_name = "", ""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.records: dict[str, Any] = {}

    def seed(self, record: Any) -> None:
        """Store ``record`` as it is (test setup: no guard, no event, not counted)."""
        with self.journal.lock:
            self.records[getattr(record, self.key_name)] = copy.deepcopy(record)

    @contextmanager
    def _reading(self, method: str) -> Iterator[None]:
        with self.journal.lock:
            self.journal.calls.append(f"{self.name}.{method}")
            self.journal.reads += 1
            yield

    def get(self, key: str) -> Any:
        with self._reading("get"):
            return copy.deepcopy(self.records.get(key))

    def _found(self, keep: Callable[[Any], bool], order: Callable[[Any], Any]) -> list[Any]:
        return [copy.deepcopy(record) for record in sorted(filter(keep, self.records.values()), key=order)]

    @contextmanager
    def _writing(self, method: str, *events: Event) -> Iterator[None]:
        """A write: its hooks run, then its body checks its guards and changes records; the events
        are recorded only when it does not raise."""
        journal = self.journal
        with journal.lock:
            journal.calls.append(f"{self.name}.{method}")
            if not journal._in_hook:
                journal._in_hook = True
                try:
                    for hook in list(journal.before_write):
                        hook(f"{self.name}.{method}")
                finally:
                    journal._in_hook = False
            yield
            journal.writes += 1
            journal.events.extend(copy.deepcopy(events))

    def _change(self, key: str, values: dict[str, Any]) -> Any:
        self.records[key] = dataclasses.replace(self.records[key], **copy.deepcopy(values))
        return copy.deepcopy(self.records[key])

    def _page(self, limit: int, start: PageKey, keep: Callable[[Any], bool] = bool, typed: bool = False) -> Any:
        """Up to ``limit`` kept records by key after ``start``; the key of the last one while any
        record (kept or not) is left after it (a filtered Scan's pages). A ``typed`` key is
        DynamoDB's (``{"work_id": {"S": id}}``, what ``paging`` encodes)."""
        with self._reading("list_page"):
            after = None if start is None else start[self.key_name]
            after = after["S"] if isinstance(after, dict) else after
            ids = [key for key in sorted(self.records) if after is None or key > after]
            page = [key for key in ids if keep(self.records[key])][:limit]
            records = [copy.deepcopy(self.records[key]) for key in page]
            if not page or page[-1] == ids[-1] or len(page) < limit:
                return records, None
            return records, {self.key_name: {"S": page[-1]} if typed else page[-1]}


class MemoryControlStore(_Store):
    name, key_name = "control", "name"
    records: dict[str, ControlItem]

    def _revision(self, name: str) -> int | None:
        stored = self.records.get(name)
        return None if stored is None else stored.revision

    def put(self, item: ControlItem, event: Event) -> None:
        if item.revision is None or int(item.revision) < 1:
            raise ValueError("a control item is written with the next revision (the one read, plus one)")
        with self._writing("put", event):
            # revision 1: the item, or its revision, is absent
            _require(self._revision(item.name) == ((int(item.revision) - 1) or None), "control item revision")
            self.records[item.name] = copy.deepcopy(item)

    def recount_online_nodes(self, read: ControlItem | None, count: int, now: float, event: Event) -> None:
        read_revision = None if read is None or read.revision is None else int(read.revision)
        with self._writing("recount_online_nodes", event):
            _require(self._revision(ONLINE_NODES) == read_revision, "online counter revision")
            stored = self.records.setdefault(ONLINE_NODES, ControlItem(ONLINE_NODES))
            stored.count, stored.revision, stored.updated_at = count, (read_revision or 0) + 1, round(now, 3)

    def add_online(self, delta: int) -> None:
        """The online counter's ADD (inside a caller's write); creates the item when absent."""
        stored = self.records.setdefault(ONLINE_NODES, ControlItem(ONLINE_NODES))
        stored.count, stored.revision = (stored.count or 0) + delta, (stored.revision or 0) + 1


class MemoryNodeStore(_Store):
    name, key_name = "nodes", "node_id"
    records: dict[str, Node]

    def __init__(self, journal: Journal, control: MemoryControlStore, bucket_seconds: int) -> None:
        super().__init__(journal)
        self._control, self._bucket_seconds = control, bucket_seconds
        self.inventories: dict[str, Inventory] = {}
        #: GPU UUID -> {node id: claimed_at}
        self.claims: dict[str, dict[str, float]] = {}

    def seed(self, node: Node, inventory: Inventory | None = None) -> None:
        """Store ``node`` (and ``inventory``, with a claim per UUID in its ``claimed_uuids``)."""
        super().seed(node)
        if inventory is not None:
            self.seed_inventory(inventory)

    def seed_inventory(self, inventory: Inventory) -> None:
        with self.journal.lock:
            self.inventories[inventory.node_id] = copy.deepcopy(inventory)
            for uuid in inventory.claimed_uuids or ():
                self.claims.setdefault(uuid, {})[inventory.node_id] = inventory.updated_at

    def claimed_by(self, node_id: str) -> set[str]:
        """The GPU UUIDs ``node_id`` holds a claim on (what the gpu_claims table says)."""
        with self.journal.lock:
            return {uuid for uuid, holders in self.claims.items() if node_id in holders}

    def get_inventory(self, node_id: str) -> Inventory | None:
        with self._reading("get_inventory"):
            return copy.deepcopy(self.inventories.get(node_id))

    def inventories_for(self, node_ids: list[str]) -> dict[str, Inventory]:
        if not node_ids:
            return {}
        with self._reading("inventories_for"):
            return {key: copy.deepcopy(self.inventories[key]) for key in node_ids if key in self.inventories}

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Node], PageKey]:
        return self._page(limit, start)  # type: ignore[no-any-return]

    def claimants(self, gpu_uuid: str) -> list[str]:
        with self._reading("claimants"):
            return sorted(self.claims.get(gpu_uuid, {}))

    def _bucket(self, node: Node) -> float | None:
        beat = node.last_heartbeat_at
        return None if beat is None else beat // self._bucket_seconds * self._bucket_seconds

    def late_nodes(self, liveness: str, cutoff: float) -> list[str]:
        """By heartbeat bucket, as the index reads: nodes up to one bucket past ``cutoff`` too."""
        with self._reading("late_nodes"):

            def late(node: Node) -> bool:
                bucket = self._bucket(node)
                return node.liveness == liveness and bucket is not None and bucket <= cutoff

            return [node.node_id for node in self._found(late, lambda node: (self._bucket(node), node.node_id))]

    def count_in_state(self, liveness: str) -> int:
        with self._reading("count_in_state"):
            return sum(
                1 for node in self.records.values() if node.liveness == liveness and self._bucket(node) is not None
            )

    def _holds(self, holder: Holder) -> Node:
        node = self.records.get(holder.node_id)
        _require(node is not None and node.credential_sha256 == holder.credential_sha256, "credential")
        assert node is not None
        _require(node.credential_state == "active", "credential active")
        return node

    def record_heartbeat(self, holder: Holder, heartbeat: Heartbeat, now: float) -> Node:
        with self._writing("record_heartbeat"):
            _require(self._holds(holder).liveness == "online", "online")
            return self._change(holder.node_id, changes.heartbeat(heartbeat, now))  # type: ignore[no-any-return]

    def bring_online(
        self, holder: Holder, previous_liveness: str, heartbeat: Heartbeat, now: float, event: Event
    ) -> None:
        with self._writing("bring_online", event):
            _require(self._holds(holder).liveness == previous_liveness, "liveness unchanged")
            values = {**changes.heartbeat(heartbeat, now), "liveness_changed_at": round(now, 3)}
            self._change(holder.node_id, values)
            self._control.add_online(+1)

    def change_liveness(
        self, node_id: str, source: str, target: str, silent_since: float, now: float, event: Event
    ) -> None:
        with self._writing("change_liveness", event):
            node = self.records.get(node_id)
            _require(node is not None and node.liveness == source, "liveness unchanged")
            assert node is not None
            # a comparison with a missing attribute is false
            _require(node.last_heartbeat_at is not None and node.last_heartbeat_at <= silent_since, "silent")
            self._change(node_id, changes.liveness_changed(target, now))
            if changes.online_delta(source, target):
                self._control.add_online(changes.online_delta(source, target))

    def replace_inventory(
        self, holder: Holder, inventory: Inventory, previous_revision: str | None, capabilities: set[str], event: Event
    ) -> None:
        with self._writing("replace_inventory", event):
            node = self._holds(holder)
            stored = self.inventories.get(holder.node_id)
            _require((stored.revision if stored else None) == previous_revision, "inventory revision")
            claimed = stored.claimed_uuids if stored else None
            self.inventories[holder.node_id] = dataclasses.replace(copy.deepcopy(inventory), claimed_uuids=claimed)
            node.capabilities = set(capabilities) or None

    def change_claims(
        self, node_id: str, revision: str, uuids: list[str], adding: bool, now: float, event: Event
    ) -> None:
        _bounded(uuids, CLAIM_CHANGES_PER_WRITE)
        with self._writing("change_claims", event):
            inventory = self.inventories.get(node_id)
            _require(inventory is not None and inventory.revision == revision, "inventory revision")
            assert inventory is not None
            claimed = set(inventory.claimed_uuids or ())
            inventory.claimed_uuids = _set_or_none(claimed | set(uuids) if adding else claimed - set(uuids))
            for uuid in uuids:
                holders = self.claims.setdefault(uuid, {})
                if adding:
                    holders[node_id] = round(now, 3)
                elif holders.pop(node_id, None) is not None and not holders:
                    self.claims.pop(uuid)

    def _both_sides(self, node_id: str, partners: list[str]) -> list[tuple[Node, set[str]]]:
        _bounded([node_id, *partners], PARTNERS_PER_WRITE + 1)
        targets = [(node_id, set(partners)), *((partner, {node_id}) for partner in partners)]
        _require(all(target in self.records for target, _ in targets), "every node exists")
        return [(self.records[target], others) for target, others in targets]

    def link_duplicates(self, node_id: str, partners: list[str], now: float, event: Event) -> None:
        with self._writing("link_duplicates", event):
            for node, others in self._both_sides(node_id, partners):
                node.duplicate_partners = set(node.duplicate_partners or ()) | others
                if node.duplicate_suspected_at is None:  # keep the first flag time
                    node.duplicate_suspected_at = round(now, 3)

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        with self._writing("unlink_duplicates", event):
            for node, others in self._both_sides(node_id, partners):
                node.duplicate_partners = _set_or_none(set(node.duplicate_partners or ()) - others)

    def forget_duplicate_time(self, node_id: str, event: Event) -> None:
        with self._writing("forget_duplicate_time", event):
            node = self.records.get(node_id)
            _require(node is not None and node.duplicate_partners is None, "no partner left")
            self._change(node_id, {"duplicate_suspected_at": None})

    def revoke_credential(self, node_id: str, now: float, event: Event) -> None:
        with self._writing("revoke_credential", event):
            node = self.records.get(node_id)
            _require(node is not None and node.credential_state == "active", "credential active")
            self._change(node_id, changes.credential_revoked(now))


class MemoryEnrollmentStore(_Store):
    name, key_name = "enrollments", "enrollment_id"
    records: dict[str, Enrollment]

    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        super().__init__(journal)
        self._nodes = nodes

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Enrollment], PageKey]:
        return self._page(limit, start)  # type: ignore[no-any-return]

    def create(self, enrollment: Enrollment, event: Event) -> None:
        with self._writing("create", event):
            _require(enrollment.enrollment_id not in self.records, "new enrollment id")
            self.records[enrollment.enrollment_id] = copy.deepcopy(enrollment)

    def revoke(self, enrollment_id: str, now: float, event: Event) -> None:
        with self._writing("revoke", event):
            stored = self.records.get(enrollment_id)
            _require(stored is not None and stored.state == "pending", "pending")
            self._change(enrollment_id, changes.enrollment_revoked(now))

    def consume(
        self,
        enrollment_id: str,
        token_sha256: str,
        idempotency_key_sha256: str,
        node: Node,
        inventory: Inventory,
        now: float,
    ) -> None:
        subject = {"enrollment_id": enrollment_id, "node_id": node.node_id}
        kinds = ("enrollment.consumed", "node.registered", "credential.issued", "inventory.replaced")
        with self._writing("consume", *(Event(kind, subject, now) for kind in kinds)):
            stored = self.records.get(enrollment_id)
            _require(stored is not None and stored.token_sha256 == token_sha256, "the token")
            assert stored is not None
            _require(stored.state == "pending" and stored.expires_at > now, "pending, unexpired")
            _require(node.node_id not in self._nodes.records, "new node id")
            _require(inventory.node_id not in self._nodes.inventories, "new inventory")
            self._change(enrollment_id, changes.enrollment_consumed(node.node_id, idempotency_key_sha256, now))
            self._nodes.records[node.node_id] = copy.deepcopy(node)
            self._nodes.inventories[inventory.node_id] = copy.deepcopy(inventory)
            for uuid in inventory.claimed_uuids or ():
                self._nodes.claims.setdefault(uuid, {})[node.node_id] = round(now, 3)


class MemoryWorkStore(_Store):
    name, key_name = "work", "work_id"
    records: dict[str, WorkItem]

    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        super().__init__(journal)
        self._nodes = nodes

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]:
        def keep(item: WorkItem) -> bool:
            return (status is None or item.status == status) and (capability is None or item.capability == capability)

        return self._page(limit, start, keep, typed=True)  # type: ignore[no-any-return]

    def oldest_queued(self, capability: str, limit: int) -> list[WorkItem]:
        with self._reading("oldest_queued"):
            return self._queued(capability)[:limit]

    def any_queued(self, capability: str) -> bool:
        with self._reading("any_queued"):
            return bool(self._queued(capability))

    def _queued(self, capability: str) -> list[WorkItem]:
        def queued(item: WorkItem) -> bool:
            return item.status == changes.QUEUED and item.capability == capability

        return self._found(queued, lambda item: (item.queued_at or 0.0, item.work_id))

    def expired_leases(self, now: float, limit: int) -> list[WorkItem]:
        with self._reading("expired_leases"):

            def expired(item: WorkItem) -> bool:
                return item.status == changes.LEASED and (item.lease_expires_at or now + 1) <= now

            return self._found(expired, lambda item: (item.lease_expires_at, item.work_id))[:limit]

    def leases_held_by(self, node_id: str) -> list[WorkItem]:
        with self._reading("leases_held_by"):
            return self._found(lambda item: item.status == changes.LEASED and item.node_id == node_id, str)

    def create(self, item: WorkItem, event: Event) -> None:
        with self._writing("create", event):
            _require(item.work_id not in self.records, "new work id")
            self.records[item.work_id] = copy.deepcopy(item)

    def _holds(self, node_id: str, credential_sha256: str) -> bool:
        node = self._nodes.records.get(node_id)
        return node is not None and node.credential_sha256 == credential_sha256 and node.credential_state == "active"

    def lease(
        self, item: WorkItem, holder: Holder, heartbeat_after: float, until: float, now: float, event: Event
    ) -> WorkItem:
        with self._writing("lease", event):
            stored, node = self.records.get(item.work_id), self._nodes.records.get(holder.node_id)
            failed = [] if stored and stored.status == changes.QUEUED and stored.epoch == item.epoch else ["work"]
            if not (
                self._holds(holder.node_id, holder.credential_sha256)
                and node is not None
                and node.liveness == "online"
                and (node.last_heartbeat_at or heartbeat_after) > heartbeat_after
            ):
                failed.append("node")
            if failed:
                raise GuardFailed("lease", failed=tuple(failed))
            return self._change(item.work_id, changes.leased(item, holder.node_id, until, now))  # type: ignore[no-any-return]

    def _lease_write(self, method: str, item: WorkItem, check: LeaseCheck, values: dict[str, Any], event: Event) -> Any:
        with self._writing(method, event):
            stored = self.records.get(item.work_id)
            _require(stored is not None and stored.status == changes.LEASED and stored.epoch == item.epoch, "leased")
            assert stored is not None
            _require(check.node_id in (None, stored.node_id), "holder")
            expires = stored.lease_expires_at
            _require(check.expired_by is None or (expires is not None and expires <= check.expired_by), "expired")
            if check.credential_sha256 is not None and check.node_id is not None:
                _require(self._holds(check.node_id, check.credential_sha256), "holder credential")
            return self._change(item.work_id, values)

    def renew(self, item: WorkItem, holder: Holder, until: float, now: float, event: Event) -> WorkItem:
        return self._lease_write("renew", item, LeaseCheck.of(holder), changes.renewed(until, now), event)  # type: ignore[no-any-return]

    def complete(self, item: WorkItem, holder: Holder, result: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("complete", item, LeaseCheck.of(holder), changes.completed(result, now), event)  # type: ignore[no-any-return]

    def requeue(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("requeue", item, check, changes.failed(item, error, True, now), event)  # type: ignore[no-any-return]

    def bury(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("bury", item, check, changes.failed(item, error, False, now), event)  # type: ignore[no-any-return]

    def cancel(self, item: WorkItem, now: float, event: Event) -> WorkItem:
        with self._writing("cancel", event):
            stored = self.records.get(item.work_id)
            _require(stored is not None and (stored.status, stored.epoch) == (item.status, item.epoch), "unchanged")
            return self._change(item.work_id, changes.cancelled(now))  # type: ignore[no-any-return]


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
        return (None if len(body) > max_bytes else hashlib.sha256(body).hexdigest()), len(body)


@dataclass(frozen=True)
class MemoryStores(Stores):
    """``Stores`` over the fakes, with their journal at hand."""

    enrollments: MemoryEnrollmentStore
    nodes: MemoryNodeStore
    control: MemoryControlStore
    work: MemoryWorkStore
    objects: MemoryObjectStore
    journal: Journal


def memory_stores(bucket_seconds: int = 45) -> MemoryStores:
    """Empty stores sharing one lock and one journal (the sweep's heartbeat buckets
    ``bucket_seconds`` wide, as the settings of tests.unit.service_bodies make them)."""
    journal = Journal()
    control = MemoryControlStore(journal)
    nodes = MemoryNodeStore(journal, control, bucket_seconds)
    return MemoryStores(
        enrollments=MemoryEnrollmentStore(journal, nodes),
        nodes=nodes,
        control=control,
        work=MemoryWorkStore(journal, nodes),
        objects=MemoryObjectStore(journal),
        journal=journal,
    )
