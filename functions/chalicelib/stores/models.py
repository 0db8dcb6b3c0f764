"""PynamoDB models of the control-plane tables.

Table names come from settings at first use (``bind_tables``), not at import, so that
``chalice package`` can import the app without an environment. The key schemas here must
match ``infra/resources.json``; a test checks that they do.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pynamodb.attributes import (
    BooleanAttribute,
    JSONAttribute,
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
    UnicodeSetAttribute,
)
from pynamodb.indexes import AllProjection, GlobalSecondaryIndex, KeysOnlyProjection
from pynamodb.models import Model

from chalicelib.config import resources
from chalicelib.config.settings import Settings

#: Every model's table until ``bind_tables`` names the real one (a model used unbound fails loudly).
UNBOUND = "unbound-call-bind-tables-first"


class EnrollmentModel(Model):
    class Meta:
        table_name = UNBOUND

    enrollment_id = UnicodeAttribute(hash_key=True)
    token_sha256 = UnicodeAttribute()
    display_name = UnicodeAttribute()
    #: pending | consumed | revoked ("expired" is derived from expires_at)
    state = UnicodeAttribute()
    production_eligible = BooleanAttribute()
    created_at = NumberAttribute()
    expires_at = NumberAttribute()
    consumed_at = NumberAttribute(null=True)
    revoked_at = NumberAttribute(null=True)
    node_id = UnicodeAttribute(null=True)
    idempotency_key_sha256 = UnicodeAttribute(null=True)


class CompactJSONAttribute(JSONAttribute):
    """JSON without the spaces after separators: what every heartbeat rewrites, so the node item
    with 8 GPUs of telemetry stays under 1 KB (one write unit) with the push channel's attributes.
    Reads any JSON, so items written before are read as they were."""

    def serialize(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"))


class CompactHealthAttribute(CompactJSONAttribute):
    """A node's health as its last heartbeat reported it, in the fewest bytes for the usual cases:
    ``ok`` (healthy, no worker), ``ok/ok`` (healthy, with a healthy worker: its detail only lists
    capabilities the inventory carries, and is not kept); any other health as compact JSON, whole.
    A healthy 8-GPU node with a worker then stays within the 1 KB a heartbeat rewrites (the worker's
    detail alone took about 100 bytes)."""

    _SHORT = {"ok": {"status": "ok"}, "ok/ok": {"status": "ok", "worker": {"status": "ok"}}}

    def serialize(self, value: Any) -> str | None:
        if value is None:
            return None
        worker = value.get("worker")
        if value.get("status") == "ok" and set(value) <= {"status", "worker"}:
            if worker is None:
                return "ok"
            if worker.get("status") == "ok" and not worker.get("unavailable"):
                return "ok/ok"
        return super().serialize(value)

    def deserialize(self, value: str) -> Any:
        short = self._SHORT.get(value)
        return json.loads(json.dumps(short)) if short is not None else super().deserialize(value)


class PackedSlotsAttribute(NumberAttribute):
    """A node's job slots ``[total, busy, schedulable]`` (each 0-99) packed into one number,
    ``total * 10000 + busy * 100 + schedulable``: 4 bytes where a list takes 12, so the node item of
    an 8-GPU node stays within the 1 KB a heartbeat rewrites for one write unit."""

    def serialize(self, value: Any) -> str:
        total, busy, schedulable = (int(part) for part in value)
        return str(total * 10000 + busy * 100 + schedulable)

    def deserialize(self, value: str) -> list[int]:  # type: ignore[override]
        packed = int(value)
        return [packed // 10000, packed // 100 % 100, packed % 100]


class LivenessIndex(GlobalSecondaryIndex):
    """Online, stale and offline nodes by shard and the bucket of their transition: what the sweep
    reads (offline ones: for node retention, by the bucket of their move to offline).

    Sparse: pending nodes have no liveness_shard and are not in it. Keys only, and
    written by transitions only: a steady heartbeat never writes the index.
    """

    class Meta:
        index_name = "by_liveness"
        projection = KeysOnlyProjection()

    liveness_shard = UnicodeAttribute(hash_key=True)
    heartbeat_bucket = NumberAttribute(range_key=True)


class ConnectionIndex(GlobalSecondaryIndex):
    """Nodes by their channel connection id: what the disconnect handler reads (API Gateway's
    ``$disconnect`` event carries the connection id only). Sparse: connected nodes only; keys only,
    written when a node connects or disconnects, never by a heartbeat."""

    class Meta:
        index_name = "by_channel"
        projection = KeysOnlyProjection()

    channel_connection_id = UnicodeAttribute(hash_key=True, attr_name="cn")


class NodeModel(Model):
    """Identity, the one credential, liveness and the latest telemetry of a node.

    Heartbeats rewrite this item, so it stays small: inventory lives in InventoryModel.
    """

    class Meta:
        table_name = UNBOUND

    node_id = UnicodeAttribute(hash_key=True)
    enrollment_id = UnicodeAttribute()
    display_name = UnicodeAttribute()
    hostname = UnicodeAttribute()
    accelerator_mode = UnicodeAttribute()
    production_eligible = BooleanAttribute()
    created_at = NumberAttribute()
    agent_version = UnicodeAttribute()
    protocol_version = NumberAttribute()
    credential_sha256 = UnicodeAttribute()
    #: active | revoked
    credential_state = UnicodeAttribute()
    credential_issued_at = NumberAttribute()
    credential_revoked_at = NumberAttribute(null=True)
    #: persisted liveness: pending | online | stale | offline (reads derive it from time)
    liveness = UnicodeAttribute()
    liveness_changed_at = NumberAttribute()
    last_heartbeat_at = NumberAttribute(null=True)
    health = CompactHealthAttribute(null=True)
    #: per-GPU rows in TELEMETRY_COLUMNS order; compact so the item stays under 1 KB
    telemetry = CompactJSONAttribute(null=True)
    #: "<liveness>#<shard>" while online, stale or offline (the sweep's index partition), else absent
    liveness_shard = UnicodeAttribute(null=True)
    #: start of the bucket (settings.sweep_bucket_seconds wide) of the heartbeat that brought the
    #: node online: the index sort key, at or before every heartbeat since
    heartbeat_bucket = NumberAttribute(null=True)
    #: other nodes that reported one of this node's GPU UUIDs while live (duplicate identity);
    #: changed only with ADD/DELETE, so concurrent inventory reports never lose a flag
    duplicate_partners = UnicodeSetAttribute(null=True)
    #: when the duplicate flag was raised (kept while any partner remains)
    duplicate_suspected_at = NumberAttribute(null=True)
    #: what the node serves (its inventory's capabilities), set with each inventory: claims and
    #: the heartbeat's work hint read it from here, in the item they already read or write
    capabilities = UnicodeSetAttribute(null=True)
    # --- the push channel: ephemeral (never in the state log; replay leaves them out). Stored under
    # two-letter names: every byte counts in the 1 KB that a heartbeat of an 8-GPU node rewrites for
    # one write unit (docs/DISPATCH.md, "Item size").
    #: SHA-256 of the node's one unused channel ticket and its expiry (set by the heartbeat that mints it)
    channel_ticket_sha256 = UnicodeAttribute(null=True, attr_name="tk")
    channel_ticket_expires_at = NumberAttribute(null=True, attr_name="tx")
    #: the live channel connection (API Gateway's connection id) and since when
    channel_connection_id = UnicodeAttribute(null=True, attr_name="cn")
    channel_connected_at = NumberAttribute(null=True, attr_name="ca")
    #: the agent's last report of its channel (connected | connecting | fallback | off) and why
    channel_state = UnicodeAttribute(null=True, attr_name="cs")
    channel_reason = UnicodeAttribute(null=True, attr_name="cr")
    #: since when the node is parked (its park items are in the control table's by_park index)
    parked_at = NumberAttribute(null=True, attr_name="pk")
    #: the job slots its last heartbeat reported, [total, busy, schedulable] (compact: 1 KB budget)
    slots = PackedSlotsAttribute(null=True, attr_name="sl")
    #: GPU_BLOCKED | NODE_DRAINED bits (records.Node.gpu_blocks), present only when non-zero
    gpu_blocks = NumberAttribute(null=True, attr_name="gb")
    #: the claim-time slot check (records.Node.slots_schedulable, slots_busy): a claim's transaction
    #: requires sb < sq, and adds 1 to sb; each transaction that ends a lease takes 1 away
    slots_schedulable = NumberAttribute(null=True, attr_name="sq")
    slots_busy = NumberAttribute(null=True, attr_name="sb")
    #: the agent process behind the heartbeats (records.Node.agent_instance): 10 bytes with its
    #: name while one agent runs (the 1 KB a heartbeat rewrites, docs/DISPATCH.md "Item size")
    agent_instance = UnicodeAttribute(null=True, attr_name="ai")
    by_liveness = LivenessIndex()
    by_channel = ConnectionIndex()


class InventoryModel(Model):
    class Meta:
        table_name = UNBOUND

    node_id = UnicodeAttribute(hash_key=True)
    inventory = JSONAttribute()
    updated_at = NumberAttribute()
    #: changes with every replacement: guards the next replacement and this one's claim writes
    revision = UnicodeAttribute(null=True)
    #: the GPU UUIDs that have a gpu_claims item for this node, changed in the same transactions
    #: as those items (so it is always exactly the node's claims)
    claimed_uuids = UnicodeSetAttribute(null=True)
    #: per-node rate limit of replacements: the current window's start and count
    rate_window_start = NumberAttribute(null=True)
    rate_window_count = NumberAttribute(null=True)
    #: per-GPU health, latches, drains and re-checks (services/gpu_health.py), and its revision
    gpu_state = CompactJSONAttribute(null=True)
    gpu_revision = NumberAttribute(null=True)


class GpuClaimModel(Model):
    """One item per (GPU UUID, node reporting it): finds nodes that share a physical GPU."""

    class Meta:
        table_name = UNBOUND

    gpu_uuid = UnicodeAttribute(hash_key=True)
    node_id = UnicodeAttribute(range_key=True)
    claimed_at = NumberAttribute()


class ParkIndex(GlobalSecondaryIndex):
    """Parked nodes by capability, longest parked first: what a submit's wake reads. Sparse: only
    park items (``park#<capability>#<node_id>``) carry ``park_capability``."""

    class Meta:
        index_name = "by_park"
        projection = AllProjection()

    park_capability = UnicodeAttribute(hash_key=True)
    parked_at = NumberAttribute(range_key=True)


class ControlModel(Model):
    """The control table, one item per name: the sweep's mass-outage hold, the online-node counter,
    and one park item per (capability, parked node) (ephemeral: never in the state log)."""

    class Meta:
        table_name = UNBOUND

    name = UnicodeAttribute(hash_key=True)
    active = BooleanAttribute(null=True)
    since = NumberAttribute(null=True)
    detail = JSONAttribute(null=True)
    updated_at = NumberAttribute(null=True)
    #: for counters (the number of online nodes), changed with ADD in the transition's transaction
    count = NumberAttribute(null=True)  # type: ignore[assignment]  # shadows Model.count (unused here)
    #: one more with every write of the item: a read-decide-write (the sweep's hold, the counter
    #: repair) is guarded by "the revision is still the one I read", so two overlapping sweeps
    #: cannot overwrite each other (and a counter that went up and back down meanwhile still counts
    #: as moved)
    revision = NumberAttribute(null=True)
    #: park items: the capability (index key), when, which node, and every capability it parked for
    park_capability = UnicodeAttribute(null=True)
    parked_at = NumberAttribute(null=True)
    node_id = UnicodeAttribute(null=True)
    capabilities = UnicodeSetAttribute(null=True)
    by_park = ParkIndex()


class QueueIndex(GlobalSecondaryIndex):
    """Queued items by capability, oldest first: what a claim reads. Sparse (queued items only)."""

    class Meta:
        index_name = "by_queue"
        projection = AllProjection()

    queue_key = UnicodeAttribute(hash_key=True)
    queued_at = NumberAttribute(range_key=True)


class LeaseIndex(GlobalSecondaryIndex):
    """Leased items by expiry: the sweep's expired leases. Sparse (leased items only)."""

    class Meta:
        index_name = "by_lease"
        projection = AllProjection()

    lease_partition = UnicodeAttribute(hash_key=True)
    lease_expires_at = NumberAttribute(range_key=True)


class HolderIndex(GlobalSecondaryIndex):
    """Leased items by holder: released at once when the sweep marks the holder offline."""

    class Meta:
        index_name = "by_holder"
        projection = AllProjection()

    lease_holder = UnicodeAttribute(hash_key=True)
    lease_expires_at = NumberAttribute(range_key=True)


class WorkModel(Model):
    """One work item: its state, lease and fencing epoch; the input and result live in S3."""

    class Meta:
        table_name = UNBOUND

    work_id = UnicodeAttribute(hash_key=True)
    capability = UnicodeAttribute()
    status = UnicodeAttribute()
    created_at = NumberAttribute()
    updated_at = NumberAttribute()
    attempts = NumberAttribute()
    max_attempts = NumberAttribute()
    lease_seconds = NumberAttribute()
    epoch = NumberAttribute()
    input_key = UnicodeAttribute()
    input_sha256 = UnicodeAttribute()
    input_size = NumberAttribute()
    errors = JSONAttribute(null=True)
    node_id = UnicodeAttribute(null=True)
    lease_expires_at = NumberAttribute(null=True)
    result = JSONAttribute(null=True)
    finished_at = NumberAttribute(null=True)
    idempotency_key_sha256 = UnicodeAttribute(null=True)
    queue_key = UnicodeAttribute(null=True)
    queued_at = NumberAttribute(null=True)
    lease_partition = UnicodeAttribute(null=True)
    lease_holder = UnicodeAttribute(null=True)
    by_queue = QueueIndex()
    by_lease = LeaseIndex()
    by_holder = HolderIndex()


class OutboxModel(Model):
    """One state-log event, written in the same transaction as the transition it records."""

    class Meta:
        table_name = UNBOUND

    event_id = UnicodeAttribute(hash_key=True)
    event_type = UnicodeAttribute()
    occurred_at = NumberAttribute()
    #: the event as JSON: exactly what is shipped to S3
    payload = UnicodeAttribute()
    expires_at = TTLAttribute()


#: The model of each table in the catalogue, by its logical name (used in the state log).
MODELS_BY_LOGICAL_NAME: dict[str, type[Model]] = {
    resources.ENROLLMENTS.name: EnrollmentModel,
    resources.NODES.name: NodeModel,
    resources.INVENTORIES.name: InventoryModel,
    resources.GPU_CLAIMS.name: GpuClaimModel,
    resources.CONTROL.name: ControlModel,
    resources.WORK.name: WorkModel,
    resources.OUTBOX.name: OutboxModel,
}


def bind_tables(settings: Settings) -> None:
    """Point every model at the table settings name for it (catalogue: resources.py), in the
    function's region."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    for table in resources.TABLES:
        model = MODELS_BY_LOGICAL_NAME[table.name]
        model.Meta.region = region
        model.Meta.table_name = settings.names[table.name]
        model._connection = None  # reconnect with the current names and endpoint
