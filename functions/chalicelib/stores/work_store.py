"""The DynamoDB work store: work items, their queue and their leases (stores.WorkStore).

Three sparse indexes serve the three reads that must not scan: ``by_queue`` (queue part, then
queue time: claimable items, oldest first within a part), ``by_lease`` (every leased item by
expiry: the sweep's expired leases) and ``by_holder`` (a node's leases: released at once when it
goes offline). An item is in an index only while it is in the state the index serves: this store
sets and removes the index keys (``queue_key``, ``lease_partition``, ``lease_holder``) with the state.

**The queue is sharded.** Each capability's queue is ``QUEUE_SHARDS`` index partitions: an item
that enters the queue (submitted, or re-queued) goes to one at random (``queue_key`` is the
capability for shard 0, ``<capability>#<shard>`` for the others, so items queued before sharding
sit in shard 0 and are still found). Two reasons, both measured (docs/SCALE.md): one index
partition takes at most 1,000 writes/s, and every item costs the queue two (in and out), so one
key per capability caps a capability at about 250 submits/s at half that limit; and concurrent
claimers that all read one queue front all race for the same few items. Readers read a random
shard and, where it is empty, the others ``SHARD_READERS`` at a time until one holds items: FIFO
within a shard, the shards drained at random; an empty answer has read every shard. Each store
(one per function instance) remembers for a few seconds which shards it found empty (read last);
the memory only orders the reads, and never puts shards seen busy first (that herds every claimer
of the instance onto them). Shards never leave this module.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.transactions import TransactWrite

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import NODE_DRAINED, Event, WorkItem
from chalicelib.stores import changes
from chalicelib.stores.contract import Holder, LeaseCheck, PageKey
from chalicelib.stores.item_records import item_of, record_of
from chalicelib.stores.models import NodeModel, OutboxModel, WorkModel
from chalicelib.stores.node_store import heartbeat_after as online_since
from chalicelib.stores.node_store import holds_credential as _holds_credential
from chalicelib.stores.state_log import event_item, put_change, update_change
from chalicelib.stores.transactions import run_transaction
from chalicelib.stores.update_actions import update_actions

#: The by_lease index's partitions: ``leased`` (shard 0, the one partition before sharding) and
#: ``leased#<n>``; a lease goes to one at random (every claim and every end of a lease writes the
#: index: at 2,000 claims/s one partition would take 4,000 writes/s), the sweep reads them all.
LEASED = "leased"
LEASE_SHARDS = 16


def lease_partition(shard: int) -> str:
    return LEASED if shard == 0 else f"{LEASED}#{shard}"


#: Index partitions per capability queue (see the module's docstring): 2,000 submits/s of one
#: capability are 4,000 index writes/s, 250 a shard, a quarter of DynamoDB's partition limit.
QUEUE_SHARDS = 16
#: Shards read at once after the first read found its shard empty: an empty queue answers in five
#: rounds of reads, not sixteen (measured on the local stack: all fifteen at once crowded the line
#: for every other request; docs/SCALE.md).
SHARD_READERS = 4


def queue_key(capability: str, shard: int) -> str:
    """The by_queue partition key of one shard of a capability's queue."""
    return capability if shard == 0 else f"{capability}#{shard}"


def _random_queue_key(capability: str) -> str:
    return queue_key(capability, random.randrange(QUEUE_SHARDS))


#: How long a shard found empty is read after the others (an order only: see EmptyShards).
EMPTY_SHARD_MEMORY_SECONDS = 5.0


class EmptyShards:
    """What this instance saw in the queue shards lately: ``order`` reads the shards it found
    empty last, after every other shard, each group in random order. Never a reason to skip a
    shard: an empty answer has read them all.

    Shards seen holding items are deliberately not read before those it knows nothing of: every
    claimer of an instance shares this memory, so preferring the first shards seen busy herds all
    of them onto those few shards, where they take the same front items and lose their
    transactions to each other (at 50 claimers, 0.6 lost transactions per claim).
    """

    def __init__(self, seconds: float = EMPTY_SHARD_MEMORY_SECONDS, clock: Any = time.monotonic) -> None:
        self._seconds, self._clock = seconds, clock
        #: (capability, shard) -> (when, whether it was empty)
        self._seen: dict[tuple[str, int], tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def order(self, capability: str) -> list[int]:
        now = self._clock()
        groups: tuple[list[int], list[int]] = ([], [])
        with self._lock:
            for shard in range(QUEUE_SHARDS):
                seen = self._seen.get((capability, shard))
                known_empty = seen is not None and seen[1] and now - seen[0] < self._seconds
                groups[known_empty].append(shard)
        for group in groups:
            random.shuffle(group)
        return groups[0] + groups[1]

    def saw(self, capability: str, shard: int, empty: bool) -> None:
        with self._lock:
            self._seen[(capability, shard)] = (self._clock(), empty)


def with_index_keys(item: WorkItem, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` and the index keys they imply: a change of status moves the item into or out of
    the lease indexes, a change of queue time into or out of the queue index."""
    keyed = dict(values)
    if "status" in values:
        leased = values["status"] == changes.LEASED
        keyed["lease_partition"] = lease_partition(random.randrange(LEASE_SHARDS)) if leased else None
        keyed["lease_holder"] = values.get("node_id", item.node_id) if leased else None
    if "queued_at" in values:
        keyed["queue_key"] = _random_queue_key(item.capability) if values["queued_at"] is not None else None
    return keyed


def _slot_free() -> Any:
    """Fewer leases than the slots the node's agent may use; no limit where it reports none."""
    schedulable, busy = NodeModel.slots_schedulable, NodeModel.slots_busy
    return schedulable.does_not_exist() | (busy.does_not_exist() & (schedulable > 0)) | (busy < schedulable)


def _still_leased(item: WorkItem, check: LeaseCheck) -> Any:
    # still leased, at the epoch the writer read (a re-claim raised it)
    condition = (WorkModel.status == changes.LEASED) & (WorkModel.epoch == item.epoch)
    if check.node_id is not None:
        # to this holder
        condition &= WorkModel.lease_holder == check.node_id
    if check.expired_by is not None:
        # and its lease expired: a renewal that came first wins
        condition &= WorkModel.lease_expires_at <= check.expired_by
    return condition


class DynamoWorkStore:
    def __init__(self, retention_seconds: int) -> None:
        self._retention = retention_seconds
        self._empty_shards = EmptyShards()

    def _event(self, event: Event, changed: list[dict[str, Any]]) -> OutboxModel:
        return event_item(event, changed, self._retention)

    def get(self, work_id: str) -> WorkItem | None:
        try:
            return record_of(WorkModel.get(work_id, consistent_read=True), WorkItem)
        except DoesNotExist:
            return None

    def list_page(
        self, limit: int, start: PageKey, status: str | None, capability: str | None
    ) -> tuple[list[WorkItem], PageKey]:
        """A page of the table (a Scan, filtered): an admin's listing, not a hot path."""
        condition = None
        if status is not None:
            condition = WorkModel.status == status
        if capability is not None:
            by_capability = WorkModel.capability == capability
            condition = by_capability if condition is None else condition & by_capability
        result = WorkModel.scan(condition, limit=limit, last_evaluated_key=start, page_size=limit)
        items = [record_of(item, WorkItem) for item in result]
        return items, result.last_evaluated_key

    def create(self, item: WorkItem, event: Event) -> None:
        stored = item_of(item, WorkModel)
        if item.status == changes.QUEUED:
            stored.queue_key = _random_queue_key(item.capability)
        outbox = self._event(event, [put_change(stored)])

        def build(transaction: TransactWrite) -> None:
            transaction.save(stored, condition=WorkModel.work_id.does_not_exist())
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        run_transaction(build)

    def queue_front(self, capability: str, limit: int) -> list[WorkItem]:
        """Up to ``limit`` oldest items of the first shard read that holds any: one Query while
        the queue is busy, ``QUEUE_SHARDS`` to say it is empty."""
        return [record_of(item, WorkItem) for item in self._first_shard_front(capability, limit)]

    def any_queued(self, capability: str) -> bool:
        return bool(self._first_shard_front(capability, 1))

    def _first_shard_front(self, capability: str, limit: int) -> list[WorkModel]:
        """The first shard in ``order`` that holds items: one read, then (where it was empty) the
        others ``SHARD_READERS`` at a time, so an empty queue answers in five rounds, not sixteen."""
        first, *others = self._empty_shards.order(capability)
        found = self._shard_front(capability, first, limit)
        if found or not others:
            return found
        with ThreadPoolExecutor(max_workers=SHARD_READERS, thread_name_prefix="queue-shard") as readers:
            for wave in range(0, len(others), SHARD_READERS):
                shards = others[wave : wave + SHARD_READERS]
                fronts = list(readers.map(lambda shard: self._shard_front(capability, shard, limit), shards))
                found = next((front for front in fronts if front), [])
                if found:
                    return found
        return []

    def _shard_front(self, capability: str, shard: int, limit: int) -> list[WorkModel]:
        found = list(WorkModel.by_queue.query(queue_key(capability, shard), scan_index_forward=True, limit=limit))
        self._empty_shards.saw(capability, shard, empty=not found)
        return found

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
        values = changes.leased(item, holder.node_id, until, now)
        park_state = NodeModel.parked_at.does_not_exist() if parked_at is None else NodeModel.parked_at == parked_at
        node_check = (
            # the caller is this node, its credential is active, and it is online now: by its
            # persisted state and by the age of its last heartbeat, at the moment of the write
            _holds_credential(holder.credential_sha256)
            & online_since(heartbeat_after)
            # it still serves the item's capability, and is parked as the claim's view says (the
            # claim un-parks it after the lease by that stamp)
            & NodeModel.capabilities.contains(item.capability)
            & park_state
            # and no admin drained it (GPU_BLOCKED alone leaves claims to the agent's slots)
            & (NodeModel.gpu_blocks.does_not_exist() | (NodeModel.gpu_blocks < NODE_DRAINED))
            # and it has a free slot: fewer leases than the slots its agent may use (no report: no limit)
            & _slot_free()
        )
        # still queued, and nobody claimed it since we read it
        still_queued = (WorkModel.status == changes.QUEUED) & (WorkModel.epoch == item.epoch)
        return self._write(item, values, still_queued, event, (holder.node_id, node_check, changes.SLOT_TAKEN))

    def renew(self, item: WorkItem, holder: Holder, until: float, now: float, event: Event) -> WorkItem:
        return self._write_lease(item, LeaseCheck.of(holder), changes.renewed(until, now), event)

    def complete(self, item: WorkItem, holder: Holder, result: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._write_lease(item, LeaseCheck.of(holder), changes.completed(result, now), event)

    def requeue(
        self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event, counted: bool = True
    ) -> WorkItem:
        return self._write_lease(item, check, changes.failed(item, error, True, now, counted), event)

    def bury(self, item: WorkItem, check: LeaseCheck, error: dict[str, Any], now: float, event: Event) -> WorkItem:
        return self._write_lease(item, check, changes.failed(item, error, False, now), event)

    def cancel(self, item: WorkItem, now: float, event: Event) -> WorkItem:
        # still in the state we read it in, at the epoch we read (not claimed, failed or finished since)
        unchanged = (WorkModel.status == item.status) & (WorkModel.epoch == item.epoch)
        if item.status == changes.LEASED and item.node_id is not None:  # its holder's slot is free again
            return self._freeing(item, changes.cancelled(now), unchanged, event, item.node_id, None)
        return self._write(item, changes.cancelled(now), unchanged, event)

    def _write_lease(self, item: WorkItem, check: LeaseCheck, values: dict[str, Any], event: Event) -> WorkItem:
        assert item.node_id is not None, "a leased item has a holder"
        holder_check = None
        if check.credential_sha256 is not None and check.node_id is not None:
            # the holder's credential is still active (a revoked node changes nothing)
            holder_check = _holds_credential(check.credential_sha256)
        if values.get("status", changes.LEASED) == changes.LEASED:  # a renewal keeps its slot
            node_part: tuple[str, Any, dict[str, int]] | None = None
            if holder_check is not None:
                node_part = (item.node_id, holder_check, {})
            return self._write(item, values, _still_leased(item, check), event, node_part)
        return self._freeing(item, values, _still_leased(item, check), event, item.node_id, holder_check)

    def _freeing(
        self, item: WorkItem, values: dict[str, Any], condition: Any, event: Event, node_id: str, holder_check: Any
    ) -> WorkItem:
        """A write that ends a lease, and frees its holder's slot in the same transaction. Without a
        credential to check (the sweep, an admin's cancel), a holder that no longer exists has no
        slot to free: the write is made again without that part, rather than never."""
        condition_on_node = holder_check if holder_check is not None else NodeModel.node_id.exists()
        try:
            return self._write(item, values, condition, event, (node_id, condition_on_node, changes.SLOT_FREED))
        except GuardFailed as failed:
            if holder_check is not None or failed.failed != ("node",):
                raise
        return self._write(item, values, condition, event)

    def _write(
        self,
        item: WorkItem,
        values: dict[str, Any],
        condition: Any,
        event: Event,
        node_part: tuple[str, Any, dict[str, int]] | None = None,
    ) -> WorkItem:
        """One guarded update of the item (with its index keys), an optional guarded part on a node
        (a check, or its busy-slot count moved by ``ADD``), and the event, together; the item as
        written."""
        keyed = with_index_keys(item, values)
        logged = [update_change(WorkModel, item.work_id, keyed)]
        if node_part is not None and node_part[2]:
            logged.append(update_change(NodeModel, node_part[0], {}, add=node_part[2]))
        outbox = self._event(event, logged)

        def build(transaction: TransactWrite) -> None:
            transaction.update(WorkModel(item.work_id), actions=update_actions(WorkModel, keyed), condition=condition)
            if node_part is not None:
                node_id, node_condition, moved = node_part
                if moved:
                    counts = [getattr(NodeModel, name).add(delta) for name, delta in moved.items()]
                    transaction.update(NodeModel(node_id), actions=counts, condition=node_condition)
                else:
                    transaction.condition_check(NodeModel, node_id, condition=node_condition)
            # mutation-equivalent: a new event id (time, counter, random bits) never exists; kept against overwrite
            transaction.save(outbox, condition=OutboxModel.event_id.does_not_exist())

        try:
            run_transaction(build)
        except GuardFailed as failed:
            # the transaction's items by position, as PynamoDB sends them: condition checks, then
            # puts, then updates in the order added (the contract tests check the names on both stores)
            if node_part is None:
                parts: tuple[str, ...] = ("event", "work")
            elif node_part[2]:
                parts = ("event", "work", "node")
            else:
                parts = ("node", "event", "work")
            names = tuple(parts[index] for index in failed.failed if isinstance(index, int) and index < len(parts))
            raise GuardFailed(str(failed), failed=names) from None
        return dataclasses.replace(item, **values)

    def expired_leases(self, now: float, limit: int) -> list[WorkItem]:
        """The earliest expired leases of every shard, ``limit`` at most."""
        found: list[WorkModel] = []
        for shard in range(LEASE_SHARDS):
            query = WorkModel.by_lease.query(lease_partition(shard), WorkModel.lease_expires_at <= now, limit=limit)
            found += list(query)
        found.sort(key=lambda item: (item.lease_expires_at or 0, item.work_id))
        return [record_of(item, WorkItem) for item in found[:limit]]

    def leases_held_by(self, node_id: str) -> list[WorkItem]:
        return [record_of(item, WorkItem) for item in WorkModel.by_holder.query(node_id)]
