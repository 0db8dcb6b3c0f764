"""In-memory stores: plain records behind the DynamoDB stores' guards, for unit tests of the services.

Each write checks all of the guard its DynamoDB store's condition expresses, under the journal's
lock, before it changes records as ``chalicelib.stores.changes`` says (GuardFailed, and nothing
changed, when it does not hold). Records go in and come out as copies. The journal (what the
services did) and the bucket are in ``journal.py``."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import (
    NODE_DRAINED,
    ONLINE_NODES,
    ControlItem,
    Enrollment,
    Event,
    Heartbeat,
    Inventory,
    Node,
    WorkItem,
)
from chalicelib.stores import changes
from chalicelib.stores.contract import (
    CLAIM_CHANGES_PER_WRITE,
    NODE_DELETE_PARTS,
    PARTNERS_PER_WRITE,
    Holder,
    LeaseCheck,
    PageKey,
    Stores,
)

from tests.support.journal import Journal, MemoryObjectStore
from tests.support.memory_channel import MemoryChannelStore, MemoryParkStore

R = TypeVar("R")


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise GuardFailed(what)


def _bounded(items: list[str], most: int) -> None:
    """One transaction's item limit; DynamoDB refuses an empty set change."""
    if not 0 < len(items) <= most or len(set(items)) != len(items):
        raise ValueError(f"1 to {most} distinct items a write")


def _slot_free(node: Node) -> bool:
    """The claim transaction's slot check: fewer leases than schedulable slots (none reported: no limit)."""
    return node.slots_schedulable is None or (node.slots_busy or 0) < node.slots_schedulable


def _move_slots(node: Node, moved: dict[str, int]) -> None:
    """DynamoDB's ADD on the node's busy-slot count (an absent count is 0)."""
    node.slots_busy = (node.slots_busy or 0) + moved["slots_busy"]


def _revision(item: ControlItem | None) -> int | None:
    return None if item is None or item.revision is None else int(item.revision)


def _holds(node: Node | None, credential_sha256: str) -> bool:
    return node is not None and node.credential_sha256 == credential_sha256 and node.credential_state == "active"


class _Store(Generic[R]):
    #: the prefix of this store's calls in the journal, and the key of its records
    name, key_name = "", ""

    def __init__(self, journal: Journal, nodes: MemoryNodeStore | None = None) -> None:
        self.journal, self._nodes = journal, nodes  # the node store the writes check
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

    def _create(self, record: R, event: Event) -> None:
        with self._writing("create", event):
            _require(getattr(record, self.key_name) not in self.records, "a new id")
            self.records[getattr(record, self.key_name)] = copy.deepcopy(record)

    def _update(self, method: str, key: str, guard: Callable[[R], bool], values: dict[str, Any], event: Event) -> R:
        with self._writing(method, event):
            _require(key in self.records and guard(self.records[key]), method)
            return self._change(key, values)

    def list_page(self, limit: int, start: PageKey) -> tuple[list[R], PageKey]:
        return self._page(limit, start)

    def _page(self, limit: int, start: PageKey, keep: Callable[[R], bool] = bool, typed: bool = False) -> Any:
        """A filtered Scan's pages: a key while any record (kept or not) is left; ``typed``: DynamoDB's."""
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

    def put(self, item: ControlItem, event: Event) -> None:
        if item.revision is None or int(item.revision) < 1:
            raise ValueError("a control item is written with the next revision (the one read, plus one)")
        with self._writing("put", event):
            # revision 1: the item, or its revision, is absent
            _require(_revision(self.records.get(item.name)) == ((item.revision - 1) or None), "revision")
            self.records[item.name] = copy.deepcopy(item)

    def recount_online_nodes(self, read: ControlItem | None, count: int, now: float, event: Event) -> None:
        read_revision = _revision(read)
        with self._writing("recount_online_nodes", event):
            _require(_revision(self.records.get(ONLINE_NODES)) == read_revision, "revision")
            stored = self.records.setdefault(ONLINE_NODES, ControlItem(ONLINE_NODES))
            stored.count, stored.revision, stored.updated_at = count, (read_revision or 0) + 1, round(now, 3)

    def add_online(self, delta: int) -> None:
        # the online counter's ADD (inside a caller's write): creates the item when absent
        stored = self.records.setdefault(ONLINE_NODES, ControlItem(ONLINE_NODES))
        stored.count, stored.revision = (stored.count or 0) + delta, (stored.revision or 0) + 1


class MemoryNodeStore(_Store[Node]):
    name, key_name = "nodes", "node_id"

    def __init__(self, journal: Journal, control: MemoryControlStore, bucket_seconds: int) -> None:
        super().__init__(journal)
        self._control, self._bucket_seconds = control, bucket_seconds
        #: what a node's deletion also removes from (set by ``memory_stores``)
        self.enrollments: MemoryEnrollmentStore | None = None
        self.parking: MemoryParkStore | None = None
        #: by node id; their ``claimed_uuids`` are the node's GPU claims (the gpu_claims table)
        self.inventories: dict[str, Inventory] = {}

    def seed_inventory(self, inventory: Inventory) -> None:
        with self.journal.lock:
            self.inventories[inventory.node_id] = copy.deepcopy(inventory)

    def claimed_by(self, node_id: str) -> set[str]:
        """The GPU UUIDs ``node_id`` holds a claim on."""
        with self.journal.lock:
            return set(getattr(self.inventories.get(node_id), "claimed_uuids", None) or ())

    def get_inventory(self, node_id: str) -> Inventory | None:
        with self._reading("get_inventory"):
            return copy.deepcopy(self.inventories.get(node_id))

    def inventories_for(self, node_ids: list[str]) -> dict[str, Inventory]:
        if not node_ids:
            return {}
        with self._reading("inventories_for"):
            return {key: copy.deepcopy(self.inventories[key]) for key in node_ids if key in self.inventories}

    def claimants(self, gpu_uuid: str) -> list[str]:
        with self._reading("claimants"):
            return sorted(
                key for key, inventory in self.inventories.items() if gpu_uuid in (inventory.claimed_uuids or ())
            )

    def _bucket(self, node: Node) -> float:  # the start of its heartbeat's bucket (inf: not in the index)
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
            held = self._held_by(holder)
            _require(held.liveness == "online", "online")
            guard = heartbeat.instance_fingerprint
            _require(guard is None or (held.agent_instance or "").startswith(guard), "agent instance unchanged")
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
            kept = {
                "claimed_uuids": stored.claimed_uuids if stored else None,
                # as DynamoDB's update: the GPU state is not the inventory's to replace
                "gpu_state": stored.gpu_state if stored else None,
                "gpu_revision": stored.gpu_revision if stored else None,
            }
            self.inventories[holder.node_id] = dataclasses.replace(copy.deepcopy(inventory), **kept)
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
        no_partner = {"duplicate_suspected_at": None}
        self._update("forget_duplicate_time", node_id, lambda n: n.duplicate_partners is None, no_partner, event)

    def write_gpu_state(
        self, node_id: str, state: dict[str, Any], revision: int, blocks: int, holder: Holder | None, event: Event
    ) -> None:
        with self._writing("write_gpu_state", event):
            node = self._held_by(holder) if holder is not None else self.records.get(node_id)
            inventory = self.inventories.get(node_id)
            _require(node is not None and inventory is not None, "node and inventory exist")
            _require((inventory.gpu_revision or 0) == revision - 1, "gpu revision")
            inventory.gpu_state, inventory.gpu_revision = copy.deepcopy(state), revision
            self._change(node_id, changes.gpu_blocks_set(blocks))

    def revoke_credential(self, node_id: str, now: float, event: Event) -> None:
        revoked = changes.credential_revoked(now)
        self._update("revoke_credential", node_id, lambda n: n.credential_state == "active", revoked, event)

    def delete_node(self, node: Node, inventory: Inventory | None, silent_since: float, event: Event) -> None:
        partners = sorted(node.duplicate_partners or ())
        claimed = sorted(inventory.claimed_uuids or ()) if inventory else []
        if len(partners) + len(claimed) > NODE_DELETE_PARTS:
            raise ValueError(f"at most {NODE_DELETE_PARTS} claims and partners a deletion")
        with self._writing("delete_node", event):
            stored = self.records.get(node.node_id)
            _require(stored is not None and stored.liveness == node.liveness, "liveness unchanged")
            silent = stored.last_heartbeat_at is not None and stored.last_heartbeat_at <= silent_since
            _require(stored.credential_state == "revoked" or silent, "removable")
            kept = self.inventories.get(node.node_id)
            _require((kept and kept.revision) == (inventory and inventory.revision), "inventory unchanged")
            _require(all(partner in self.records for partner in partners), "every partner exists")
            enrollment = self.enrollments.records.get(node.enrollment_id) if self.enrollments else None
            _require(enrollment is None or enrollment.node_id == node.node_id, "its own enrollment")
            del self.records[node.node_id]
            self.inventories.pop(node.node_id, None)
            if enrollment is not None:
                del self.enrollments.records[node.enrollment_id]
            for partner in partners:
                stored_partner = self.records[partner]
                stored_partner.duplicate_partners = (
                    set(stored_partner.duplicate_partners or ()) - {node.node_id}
                ) or None
            for key in [key for key in self.parking.items if key[1] == node.node_id] if self.parking else []:
                del self.parking.items[key]
            if node.liveness == "online":
                self._control.add_online(-1)

    def offline_since(self, cutoff: float, limit: int) -> list[str]:
        with self._reading("offline_since"):
            gone = self._found(lambda n: n.liveness == "offline" and n.liveness_changed_at <= cutoff, str)
            return [node.node_id for node in gone][:limit]

    # --- the push channel (not logged) ---

    def connect_channel(self, node_id: str, ticket_sha256: str, connection_id: str, now: float) -> None:
        with self._writing("connect_channel"):
            node = self.records.get(node_id)
            _require(node is not None and node.channel_ticket_sha256 == ticket_sha256, "the ticket")
            _require((node.channel_ticket_expires_at or now) > round(now, 3), "unexpired")
            _require(node.credential_state == "active", "credential active")
            self._change(node_id, changes.channel_connected(connection_id, now))

    def disconnect_channel(self, node_id: str, connection_id: str) -> None:
        with self._writing("disconnect_channel"):
            node = self.records.get(node_id)
            _require(node is not None and node.channel_connection_id == connection_id, "still that connection")
            self._change(node_id, changes.channel_disconnected())

    def node_of_connection(self, connection_id: str) -> str | None:
        with self._reading("node_of_connection"):
            found = [key for key, node in self.records.items() if node.channel_connection_id == connection_id]
            return found[0] if found else None


class MemoryEnrollmentStore(_Store[Enrollment]):
    name, key_name = "enrollments", "enrollment_id"

    def create(self, enrollment: Enrollment, event: Event) -> None:
        self._create(enrollment, event)

    def revoke(self, enrollment_id: str, now: float, event: Event) -> None:
        self._update("revoke", enrollment_id, lambda e: e.state == "pending", changes.enrollment_revoked(now), event)

    def consume(
        self, enrollment_id: str, token_sha256: str, key_sha256: str, node: Node, inventory: Inventory, now: float
    ) -> None:
        subject = {"enrollment_id": enrollment_id, "node_id": node.node_id}
        kinds = ("enrollment.consumed", "node.registered", "credential.issued", "inventory.replaced")
        with self._writing("consume", *(Event(kind, subject, now) for kind in kinds)):
            stored = self.records.get(enrollment_id)
            _require(stored is not None and stored.token_sha256 == token_sha256, "the token")
            _require(stored.state == "pending" and stored.expires_at > now, "pending, unexpired")
            _require(node.node_id not in self._nodes.records, "new node id")
            _require(inventory.node_id not in self._nodes.inventories, "new inventory")
            self._change(enrollment_id, changes.enrollment_consumed(node.node_id, key_sha256, now))
            self._nodes.seed(node)
            self._nodes.seed_inventory(inventory)


class MemoryWorkStore(_Store[WorkItem]):
    name, key_name = "work", "work_id"

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]:
        def keep(item: WorkItem) -> bool:
            return (status is None or item.status == status) and (capability is None or item.capability == capability)

        return self._page(limit, start, keep, typed=True)

    def _queued(self, capability: str) -> list[WorkItem]:
        queued = self._found(lambda item: item.status == changes.QUEUED, lambda item: (item.queued_at, item.work_id))
        return [item for item in queued if item.capability == capability]

    def queue_front(self, capability: str, limit: int) -> list[WorkItem]:
        """The queue in one part: its oldest ``limit`` items."""
        with self._reading("queue_front"):
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
        self._create(item, event)

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
        with self._writing("lease", event):
            stored, node = self.records.get(item.work_id), self._nodes.records.get(holder.node_id)
            failed = [] if stored and (stored.status, stored.epoch) == (changes.QUEUED, item.epoch) else ["work"]
            # the node holds this active credential, is persisted online and heartbeated after the
            # cutoff, serves the item's capability, and is parked as the claim's view says
            beat = (
                node.last_heartbeat_at
                if _holds(node, holder.credential_sha256)
                and node.liveness == "online"
                and item.capability in (node.capabilities or ())
                and node.parked_at == parked_at
                and not (node.gpu_blocks or 0) & NODE_DRAINED
                and _slot_free(node)
                else None
            )
            failed += [] if (beat or heartbeat_after) > heartbeat_after else ["node"]
            if failed:
                raise GuardFailed("lease", failed=tuple(failed))
            _move_slots(node, changes.SLOT_TAKEN)
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
            holder = self._nodes.records.get(stored.node_id or "")
            # the lease ends: its holder's slot is free (a holder that no longer exists has none)
            if values.get("status", changes.LEASED) != changes.LEASED and holder is not None:
                _move_slots(holder, changes.SLOT_FREED)
            return self._change(item.work_id, values)

    def renew(self, item: WorkItem, holder: Holder, until: float, now: float, event: Event) -> WorkItem:
        return self._lease_write("renew", item, LeaseCheck.of(holder), changes.renewed(until, now), event)

    def complete(self, item: WorkItem, holder: Holder, result: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("complete", item, LeaseCheck.of(holder), changes.completed(result, now), event)

    def requeue(
        self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event, counted: bool = True
    ) -> WorkItem:
        return self._lease_write("requeue", item, check, changes.failed(item, error, True, now, counted), event)

    def bury(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._lease_write("bury", item, check, changes.failed(item, error, False, now), event)

    def cancel(self, item: WorkItem, now: float, event: Event) -> WorkItem:
        with self._writing("cancel", event):
            stored = self.records.get(item.work_id)
            _require(stored is not None and (stored.status, stored.epoch) == (item.status, item.epoch), "unchanged")
            holder = self._nodes.records.get(item.node_id or "")
            if item.status == changes.LEASED and holder is not None:  # its holder's slot is free again
                _move_slots(holder, changes.SLOT_FREED)
            return self._change(item.work_id, changes.cancelled(now))


@dataclass(frozen=True)
class MemoryStores(Stores):
    enrollments: MemoryEnrollmentStore
    nodes: MemoryNodeStore
    control: MemoryControlStore
    work: MemoryWorkStore
    objects: MemoryObjectStore
    parking: MemoryParkStore
    channel: MemoryChannelStore
    journal: Journal


def memory_stores(bucket_seconds: int = 45) -> MemoryStores:
    """Empty stores sharing one journal (heartbeat buckets as wide as service_bodies.SETTINGS has them)."""
    journal = Journal()
    control = MemoryControlStore(journal)
    nodes = MemoryNodeStore(journal, control, bucket_seconds)
    enrollments, work = MemoryEnrollmentStore(journal, nodes), MemoryWorkStore(journal, nodes)
    parking, channel = MemoryParkStore(journal, nodes), MemoryChannelStore(journal)
    nodes.enrollments, nodes.parking = enrollments, parking
    return MemoryStores(enrollments, nodes, control, work, MemoryObjectStore(journal), parking, channel, journal)
