"""In-memory stores: plain records behind the DynamoDB stores' guards, for unit tests of the services.

Each write checks exactly the guard its DynamoDB store's condition expresses; when the guard does
not hold it changes nothing and raises ``GuardFailed``. A write changes its records as
``chalicelib.stores.changes`` says (what the DynamoDB stores write too). Every write checks all
its guards before changing anything, under the journal's lock. Records go in and come out as
copies. The journal (what the services did) and the bucket are in ``journal.py``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import ONLINE_NODES, ControlItem, Enrollment, Event, Heartbeat, Inventory, Node, WorkItem
from chalicelib.stores import changes
from chalicelib.stores.contract import CLAIM_CHANGES_PER_WRITE, PARTNERS_PER_WRITE, Holder, LeaseCheck, PageKey, Stores

from tests.support.journal import Journal, MemoryObjectStore

__all__ = ["Journal", "MemoryObjectStore", "MemoryStores", "memory_stores"]

R = TypeVar("R")


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise GuardFailed(what)


def _bounded(items: list[str], most: int) -> None:
    """One transaction's item limit; DynamoDB refuses an empty set change."""
    if not 0 < len(items) <= most or len(set(items)) != len(items):
        raise ValueError(f"1 to {most} distinct items a write")


def _holds(node: Node | None, credential_sha256: str) -> bool:
    return node is not None and node.credential_sha256 == credential_sha256 and node.credential_state == "active"


class _Store(Generic[R]):
    #: the prefix of this store's calls in the journal, and the key of its records
    name, key_name = "", ""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.records: dict[str, R] = {}

    def seed(self, record: R) -> None:
        """Store ``record`` as it is (test setup: no guard, no event, not counted)."""
        with self.journal.lock:
            self.records[getattr(record, self.key_name)] = copy.deepcopy(record)

    def _reading(self, method: str) -> AbstractContextManager[None]:
        return self.journal.reading(f"{self.name}.{method}")

    def _writing(self, method: str, *events: Event) -> AbstractContextManager[None]:
        return self.journal.writing(f"{self.name}.{method}", events)

    def get(self, key: str) -> R | None:
        with self._reading("get"):
            return copy.deepcopy(self.records.get(key))

    def _found(self, keep: Callable[[R], bool], order: Callable[[R], Any]) -> list[R]:
        return [copy.deepcopy(record) for record in sorted(filter(keep, self.records.values()), key=order)]

    def _change(self, key: str, values: dict[str, Any]) -> R:
        self.records[key] = dataclasses.replace(self.records[key], **copy.deepcopy(values))
        return copy.deepcopy(self.records[key])

    def _page(self, limit: int, start: PageKey, keep: Callable[[R], bool] = bool, typed: bool = False) -> Any:
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


class MemoryControlStore(_Store[ControlItem]):
    name, key_name = "control", "name"

    def _revision(self, name: str) -> int | None:
        return None if name not in self.records else self.records[name].revision

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


class MemoryNodeStore(_Store[Node]):
    name, key_name = "nodes", "node_id"

    def __init__(self, journal: Journal, control: MemoryControlStore, bucket_seconds: int) -> None:
        super().__init__(journal)
        self._control, self._bucket_seconds = control, bucket_seconds
        self.inventories: dict[str, Inventory] = {}
        #: GPU UUID -> {node id: claimed_at}
        self.claims: dict[str, dict[str, float]] = {}

    def seed(self, record: Node, inventory: Inventory | None = None) -> None:
        """Store ``node`` (and ``inventory``, with a claim per UUID in its ``claimed_uuids``)."""
        super().seed(record)
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
        return self._page(limit, start)

    def claimants(self, gpu_uuid: str) -> list[str]:
        with self._reading("claimants"):
            return sorted(self.claims.get(gpu_uuid, {}))

    def _bucket(self, node: Node) -> float:
        """Start of the node's heartbeat bucket (the sweep index's sort key; inf: not indexed)."""
        beat = node.last_heartbeat_at
        return float("inf") if beat is None else beat // self._bucket_seconds * self._bucket_seconds

    def late_nodes(self, liveness: str, cutoff: float) -> list[str]:
        """By heartbeat bucket, as the index reads: nodes up to one bucket past ``cutoff`` too."""
        with self._reading("late_nodes"):
            late = self._found(lambda n: n.liveness == liveness and self._bucket(n) <= cutoff, self._bucket)
            return [node.node_id for node in late]

    def count_in_state(self, liveness: str) -> int:
        with self._reading("count_in_state"):
            return len(self._found(lambda n: n.liveness == liveness and self._bucket(n) < float("inf"), str))

    def _held_by(self, holder: Holder) -> Node:
        node = self.records.get(holder.node_id)
        _require(_holds(node, holder.credential_sha256), "credential")
        return node

    def record_heartbeat(self, holder: Holder, heartbeat: Heartbeat, now: float) -> Node:
        with self._writing("record_heartbeat"):
            _require(self._held_by(holder).liveness == "online", "online")
            return self._change(holder.node_id, changes.heartbeat(heartbeat, now))

    def bring_online(self, holder: Holder, previous: str, heartbeat: Heartbeat, now: float, event: Event) -> None:
        with self._writing("bring_online", event):
            _require(self._held_by(holder).liveness == previous, "liveness unchanged")
            self._change(holder.node_id, {**changes.heartbeat(heartbeat, now), "liveness_changed_at": round(now, 3)})
            self._control.add_online(+1)

    def change_liveness(
        self, node_id: str, source: str, target: str, silent_since: float, now: float, event: Event
    ) -> None:
        with self._writing("change_liveness", event):
            node = self.records.get(node_id)
            # still the liveness read, and silent since (a comparison with a missing attribute is false)
            _require(node is not None and node.liveness == source, "liveness unchanged")
            _require((node.last_heartbeat_at or silent_since + 1) <= silent_since, "silent")
            self._change(node_id, changes.liveness_changed(target, now))
            if changes.online_delta(source, target):
                self._control.add_online(changes.online_delta(source, target))

    def replace_inventory(
        self, holder: Holder, inventory: Inventory, previous_revision: str | None, capabilities: set[str], event: Event
    ) -> None:
        with self._writing("replace_inventory", event):
            node = self._held_by(holder)
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
            claimed = set(inventory.claimed_uuids or ())
            inventory.claimed_uuids = (claimed | set(uuids) if adding else claimed - set(uuids)) or None
            for uuid in uuids:
                holders = self.claims.setdefault(uuid, {})
                if adding:
                    holders[node_id] = round(now, 3)
                elif holders.pop(node_id, None) is not None and not holders:
                    self.claims.pop(uuid)

    def _both_sides(self, node_id: str, partners: list[str]) -> Iterator[tuple[Node, set[str]]]:
        _bounded([node_id, *partners], PARTNERS_PER_WRITE + 1)
        _require(all(target in self.records for target in (node_id, *partners)), "every node exists")
        yield self.records[node_id], set(partners)
        yield from ((self.records[partner], {node_id}) for partner in partners)

    def link_duplicates(self, node_id: str, partners: list[str], now: float, event: Event) -> None:
        with self._writing("link_duplicates", event):
            for node, others in list(self._both_sides(node_id, partners)):
                node.duplicate_partners = set(node.duplicate_partners or ()) | others
                node.duplicate_suspected_at = node.duplicate_suspected_at or round(now, 3)  # the first flag time

    def unlink_duplicates(self, node_id: str, partners: list[str], event: Event) -> None:
        with self._writing("unlink_duplicates", event):
            for node, others in list(self._both_sides(node_id, partners)):
                # DynamoDB removes a set with its last element
                node.duplicate_partners = (set(node.duplicate_partners or ()) - others) or None

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


class MemoryEnrollmentStore(_Store[Enrollment]):
    name, key_name = "enrollments", "enrollment_id"

    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        super().__init__(journal)
        self._nodes = nodes

    def list_page(self, limit: int, start: PageKey) -> tuple[list[Enrollment], PageKey]:
        return self._page(limit, start)

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
            _require(stored.state == "pending" and stored.expires_at > now, "pending, unexpired")
            _require(node.node_id not in self._nodes.records, "new node id")
            _require(inventory.node_id not in self._nodes.inventories, "new inventory")
            self._change(enrollment_id, changes.enrollment_consumed(node.node_id, idempotency_key_sha256, now))
            self._nodes.seed(node, inventory)


class MemoryWorkStore(_Store[WorkItem]):
    name, key_name = "work", "work_id"

    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        super().__init__(journal)
        self._nodes = nodes

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]:
        def keep(item: WorkItem) -> bool:
            return (status is None or item.status == status) and (capability is None or item.capability == capability)

        return self._page(limit, start, keep, typed=True)

    def _queued(self, capability: str) -> list[WorkItem]:
        def queued(item: WorkItem) -> bool:
            return item.status == changes.QUEUED and item.capability == capability

        return self._found(queued, lambda item: (item.queued_at or 0.0, item.work_id))

    def oldest_queued(self, capability: str, limit: int) -> list[WorkItem]:
        with self._reading("oldest_queued"):
            return self._queued(capability)[:limit]

    def any_queued(self, capability: str) -> bool:
        with self._reading("any_queued"):
            return bool(self._queued(capability))

    def expired_leases(self, now: float, limit: int) -> list[WorkItem]:
        def expired(item: WorkItem) -> bool:
            return item.status == changes.LEASED and (item.lease_expires_at or now + 1) <= now

        with self._reading("expired_leases"):
            return self._found(expired, lambda item: (item.lease_expires_at, item.work_id))[:limit]

    def leases_held_by(self, node_id: str) -> list[WorkItem]:
        with self._reading("leases_held_by"):
            return self._found(lambda item: item.status == changes.LEASED and item.node_id == node_id, str)

    def create(self, item: WorkItem, event: Event) -> None:
        with self._writing("create", event):
            _require(item.work_id not in self.records, "new work id")
            self.records[item.work_id] = copy.deepcopy(item)

    def lease(
        self, item: WorkItem, holder: Holder, heartbeat_after: float, until: float, now: float, event: Event
    ) -> WorkItem:
        with self._writing("lease", event):
            stored, node = self.records.get(item.work_id), self._nodes.records.get(holder.node_id)
            failed = [] if stored and (stored.status, stored.epoch) == (changes.QUEUED, item.epoch) else ["work"]
            if not _holds(node, holder.credential_sha256) or node.liveness != "online":
                failed.append("node")
            elif (node.last_heartbeat_at or heartbeat_after) <= heartbeat_after:
                failed.append("node")
            if failed:
                raise GuardFailed("lease", failed=tuple(failed))
            return self._change(item.work_id, changes.leased(item, holder.node_id, until, now))

    def _lease_write(
        self, method: str, item: WorkItem, check: LeaseCheck, values: dict[str, Any], event: Event
    ) -> WorkItem:
        with self._writing(method, event):
            stored = self.records.get(item.work_id)
            _require(stored is not None and (stored.status, stored.epoch) == (changes.LEASED, item.epoch), "leased")
            _require(check.node_id in (None, stored.node_id), "holder")
            expires = stored.lease_expires_at
            _require(check.expired_by is None or (expires or check.expired_by + 1) <= check.expired_by, "expired")
            if check.credential_sha256 is not None and check.node_id is not None:
                _require(_holds(self._nodes.records.get(check.node_id), check.credential_sha256), "holder credential")
            return self._change(item.work_id, values)

    def renew(self, item: WorkItem, holder: Holder, until: float, now: float, event: Event) -> WorkItem:
        return self._lease_write("renew", item, LeaseCheck.of(holder), changes.renewed(until, now), event)

    def complete(self, item: WorkItem, holder: Holder, result: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("complete", item, LeaseCheck.of(holder), changes.completed(result, now), event)

    def requeue(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("requeue", item, check, changes.failed(item, error, True, now), event)

    def bury(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("bury", item, check, changes.failed(item, error, False, now), event)

    def cancel(self, item: WorkItem, now: float, event: Event) -> WorkItem:
        with self._writing("cancel", event):
            stored = self.records.get(item.work_id)
            _require(stored is not None and (stored.status, stored.epoch) == (item.status, item.epoch), "unchanged")
            return self._change(item.work_id, changes.cancelled(now))


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
    """Empty stores sharing one journal (the sweep's heartbeat buckets ``bucket_seconds`` wide, as
    the settings of tests.unit.service_bodies make them)."""
    journal = Journal()
    control = MemoryControlStore(journal)
    nodes = MemoryNodeStore(journal, control, bucket_seconds)
    enrollments, work = MemoryEnrollmentStore(journal, nodes), MemoryWorkStore(journal, nodes)
    return MemoryStores(enrollments, nodes, control, work, MemoryObjectStore(journal), journal)
