"""What services read and decide on: plain records of the control plane's state.

Stores (``stores/contract.py`` names what each must do) load these from their tables and write
them; nothing here knows DynamoDB. A record holds what the domain decides on and nothing a table
needs only to be found (index keys, shards, partitions): each store derives those itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol.schemas import GPU_TELEMETRY_FIELDS


@dataclass
class Enrollment:
    """A single-use enrollment token's record (the token itself is kept only as its hash)."""

    enrollment_id: str
    token_sha256: str = field(repr=False)
    display_name: str
    #: pending | consumed | revoked ("expired" is derived from expires_at)
    state: str
    production_eligible: bool
    created_at: float
    expires_at: float
    consumed_at: float | None = None
    revoked_at: float | None = None
    node_id: str | None = None
    idempotency_key_sha256: str | None = field(default=None, repr=False)


@dataclass
class Node:
    """Identity, the one credential, liveness and the latest telemetry of a node."""

    node_id: str
    enrollment_id: str
    display_name: str
    hostname: str
    accelerator_mode: str
    production_eligible: bool
    created_at: float
    agent_version: str
    protocol_version: int
    credential_sha256: str = field(repr=False)
    #: active | revoked
    credential_state: str
    credential_issued_at: float
    #: persisted liveness: pending | online | stale | offline (reads derive it from time)
    liveness: str
    liveness_changed_at: float
    credential_revoked_at: float | None = None
    last_heartbeat_at: float | None = None
    health: dict[str, Any] | None = None
    #: per-GPU rows in TELEMETRY_COLUMNS order
    telemetry: list[list[float]] | None = None
    #: other nodes that reported one of this node's GPU UUIDs while live (duplicate identity)
    duplicate_partners: set[str] | None = None
    duplicate_suspected_at: float | None = None
    #: the agent process behind its heartbeats, compact (services/duplicate_identity.InstanceState):
    #: its fingerprint, and after a change the one before, when, and when heartbeats last went back
    #: to that one within the window (two agents on one identity)
    agent_instance: str | None = None
    #: what the node serves: its inventory's capabilities
    capabilities: set[str] | None = None
    # --- the push channel (ephemeral: never in the state log, not rebuilt by replay) ---
    #: the SHA-256 of the node's one unused channel ticket, and when it expires
    channel_ticket_sha256: str | None = field(default=None, repr=False)
    channel_ticket_expires_at: float | None = None
    #: the node's live channel connection (API Gateway's connection id), and since when
    channel_connection_id: str | None = None
    channel_connected_at: float | None = None
    #: the agent's last report of its channel: connected | connecting | fallback | off, and why
    channel_state: str | None = None
    channel_reason: str | None = None
    #: since when the node is parked (idle, waiting for a wake on its channel)
    parked_at: float | None = None
    #: its job slots as its last heartbeat reported them: [total, busy, schedulable]
    slots: list[int] | None = None
    #: what keeps work from the node besides liveness (services/gpu_health.py): GPU_BLOCKED when a
    #: GPU is latched, drained or awaits a re-check (its heartbeat answer then reads the GPU state),
    #: plus NODE_DRAINED when an admin drained the node (its claims are refused); None: neither
    gpu_blocks: int | None = None
    #: the claim-time slot check: the slots its agent may use now (its last heartbeat's
    #: ``slots.schedulable``; None: not reported, no limit) and the leases it holds, counted by the
    #: claim, complete, fail, requeue, sweep and cancel transactions (never from the heartbeat)
    slots_schedulable: int | None = None
    slots_busy: int | None = None


@dataclass
class Inventory:
    """A node's last reported inventory, kept apart from the node so that a heartbeat stays small."""

    node_id: str
    inventory: dict[str, Any]
    updated_at: float
    #: changes with every replacement: guards the next replacement and its claim writes
    revision: str | None = None
    #: the GPU UUIDs that have a claim for this node (changed only together with the claims)
    claimed_uuids: set[str] | None = None
    #: per-node rate limit of replacements: the current window's start and count
    rate_window_start: float | None = None
    rate_window_count: int | None = None
    #: per-GPU health as the control plane keeps it (services/gpu_health.GpuBook's JSON): written
    #: only when it changes, never by a steady heartbeat
    gpu_state: dict[str, Any] | None = None
    #: one more with every write of ``gpu_state``: guards the next (an admin's clear and an agent's
    #: report never overwrite each other)
    gpu_revision: int | None = None


@dataclass
class ControlItem:
    """One item of the control table: the sweep's mass-outage hold, or the online-node counter."""

    name: str
    active: bool | None = None
    since: float | None = None
    detail: dict[str, Any] | None = None
    updated_at: float | None = None
    count: int | None = None
    #: one more with every write: a read-decide-write is guarded by "still the revision I read"
    revision: int | None = None


@dataclass
class WorkItem:
    """One unit of work for a capability, and its lease (see work.py for the states)."""

    work_id: str
    capability: str
    #: queued | leased | succeeded | dead | cancelled
    status: str
    created_at: float
    updated_at: float
    #: claims so far (each claim is an attempt)
    attempts: int
    max_attempts: int
    lease_seconds: int
    #: one more with every claim: the fencing token a lease holder presents
    epoch: int
    #: the input object in the bucket, and its digest and size
    input_key: str
    input_sha256: str
    input_size: int
    #: each failed attempt: {"attempt", "epoch", "node_id", "reason", "retryable", "at"}
    errors: list[dict[str, Any]] | None = None
    #: the node holding (or that last held) the lease
    node_id: str | None = None
    lease_expires_at: float | None = None
    #: {"sha256", "size", "key"} once succeeded
    result: dict[str, Any] | None = None
    finished_at: float | None = None
    idempotency_key_sha256: str | None = field(default=None, repr=False)
    #: when it entered the queue, while it is queued (claims take the oldest first)
    queued_at: float | None = None


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat reports: the node's health, per-GPU telemetry and agent version."""

    health: dict[str, Any]
    #: per-GPU rows in TELEMETRY_COLUMNS order
    telemetry: list[list[float]]
    agent_version: str
    protocol_version: int
    #: whether the agent reported its push channel; what of the report the node keeps (None: removed)
    channel_reported: bool = False
    channel_state: str | None = None
    channel_reason: str | None = None
    #: a channel ticket minted for this heartbeat's answer: its SHA-256 and expiry, written by the
    #: heartbeat's own update (None: none minted)
    channel_ticket_sha256: str | None = field(default=None, repr=False)
    channel_ticket_expires_at: float | None = None
    #: the node's job slots as reported: [total, busy, schedulable] (None: not reported)
    slots: list[int] | None = None
    #: the steady heartbeat's guard: the stored ``Node.agent_instance`` starts with this agent
    #: process's fingerprint (None: no guard; an agent that sends no instance id)
    instance_fingerprint: str | None = None
    #: what ``Node.agent_instance`` becomes (services/duplicate_identity.judge_instance, after a
    #: read; None: unchanged)
    agent_instance: str | None = None


@dataclass(frozen=True)
class Parked:
    """A node parked for the capabilities it served when it parked (the wake reads these)."""

    node_id: str
    capabilities: frozenset[str]
    parked_at: float


@dataclass(frozen=True)
class Event:
    """A state-log event a write records: its type and subject. The store that makes the write
    adds the changes it made, and writes the event in the same transaction."""

    type: str
    subject: dict[str, str]
    #: when it happened (the event's time; replay applies events in time order)
    at: float


#: Column order of Node.telemetry rows: every field of the protocol's GPU telemetry.
TELEMETRY_COLUMNS = GPU_TELEMETRY_FIELDS

#: Node.gpu_blocks bits.
GPU_BLOCKED = 1
NODE_DRAINED = 2

#: The names of the control table's items.
MASS_STALE_HOLD = "mass_stale_hold"
#: How many nodes are persisted online: kept by every transition into or out of online, so the
#: sweep's mass-outage guard reads one item instead of every online node.
ONLINE_NODES = "online_nodes"
