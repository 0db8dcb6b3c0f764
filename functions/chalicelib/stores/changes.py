"""What each store write changes, in record fields: shared by every implementation of the contract.

The DynamoDB stores add the index keys these imply and write them as update actions (and as the
state log's changes); the in-memory fakes apply them to their records. Times are stored to the
millisecond. A value of None removes the field.
"""

from __future__ import annotations

from typing import Any

from modelforge_protocol.work import WORK_STATES

from chalicelib.domain import liveness
from chalicelib.domain.records import Heartbeat, Inventory, WorkItem

Changes = dict[str, Any]

QUEUED, LEASED, SUCCEEDED, DEAD, CANCELLED = WORK_STATES
#: What every write that ends a lease removes.
_NO_LEASE: Changes = {"lease_expires_at": None}


def _ms(at: float) -> float:
    return round(at, 3)


# --- work ---------------------------------------------------------------------------------


def leased(item: WorkItem, node_id: str, until: float, now: float) -> Changes:
    return {
        "status": LEASED,
        "epoch": item.epoch + 1,
        "attempts": item.attempts + 1,
        "node_id": node_id,
        "lease_expires_at": _ms(until),
        "queued_at": None,
        "updated_at": _ms(now),
    }


def renewed(until: float, now: float) -> Changes:
    return {"lease_expires_at": _ms(until), "updated_at": _ms(now)}


def completed(result: dict[str, Any], now: float) -> Changes:
    return {"status": SUCCEEDED, "result": result, **_NO_LEASE, "finished_at": _ms(now), "updated_at": _ms(now)}


def failed(item: WorkItem, error: dict[str, Any], again: bool, now: float, counted: bool = True) -> Changes:
    """Back to the queue (``again``), or dead; the error appended to the item's errors. An attempt
    that is not ``counted`` (the node failed, not the item) is taken back from ``attempts``."""
    changes: Changes = {"errors": [*(item.errors or []), error], **_NO_LEASE, "updated_at": _ms(now)}
    if again:
        changes.update(status=QUEUED, queued_at=_ms(now))
        if not counted:
            changes["attempts"] = max(0, item.attempts - 1)
    else:
        changes.update(status=DEAD, finished_at=_ms(now))
    return changes


#: What a lease adds to its holder's busy slots, and what ending it takes away (DynamoDB ADD).
SLOT_TAKEN: Changes = {"slots_busy": 1}
SLOT_FREED: Changes = {"slots_busy": -1}


def cancelled(now: float) -> Changes:
    return {"status": CANCELLED, "queued_at": None, **_NO_LEASE, "finished_at": _ms(now), "updated_at": _ms(now)}


# --- nodes --------------------------------------------------------------------------------


def heartbeat(heartbeat: Heartbeat, now: float) -> Changes:
    values: Changes = {
        "last_heartbeat_at": _ms(now),
        "liveness": liveness.ONLINE,
        "health": heartbeat.health,
        "telemetry": heartbeat.telemetry,
        "agent_version": heartbeat.agent_version,
        "protocol_version": heartbeat.protocol_version,
    }
    if heartbeat.slots is not None:  # the node's job slots, as reported (same update)
        values["slots"] = heartbeat.slots
        values["slots_schedulable"] = heartbeat.slots[2]  # what the claim transaction checks
    if heartbeat.channel_reported:  # the agent reported its channel (same update, no extra write)
        values.update(channel_state=heartbeat.channel_state, channel_reason=heartbeat.channel_reason)
    if heartbeat.channel_ticket_sha256 is not None:  # a ticket minted for this answer replaces the last one
        values.update(ticket(heartbeat.channel_ticket_sha256, heartbeat.channel_ticket_expires_at or now))
    if heartbeat.agent_instance is not None:  # judged after a read (same update; the steady one sets nothing)
        values["agent_instance"] = heartbeat.agent_instance
    return values


# --- the push channel (ephemeral: these fields are never logged) ---------------------------


def ticket(ticket_sha256: str, expires_at: float) -> Changes:
    return {"channel_ticket_sha256": ticket_sha256, "channel_ticket_expires_at": _ms(expires_at)}


def channel_connected(connection_id: str, now: float) -> Changes:
    """The ticket is used up by the connection it opened."""
    return {
        "channel_connection_id": connection_id,
        "channel_connected_at": _ms(now),
        "channel_ticket_sha256": None,
        "channel_ticket_expires_at": None,
    }


def channel_disconnected() -> Changes:
    return {"channel_connection_id": None, "channel_connected_at": None}


def parked(now: float) -> Changes:
    return {"parked_at": _ms(now)}


def unparked() -> Changes:
    return {"parked_at": None}


def liveness_changed(target: str, now: float) -> Changes:
    return {"liveness": target, "liveness_changed_at": _ms(now)}


def online_delta(source: str, target: str) -> int:
    """How a transition moves the online-node counter."""
    return int(target == liveness.ONLINE) - int(source == liveness.ONLINE)


def inventory_replaced(inventory: Inventory) -> Changes:
    """Everything of an inventory but its claims (reconciled afterwards, with their own writes)."""
    return {
        "inventory": inventory.inventory,
        "updated_at": inventory.updated_at,
        "revision": inventory.revision,
        "rate_window_start": inventory.rate_window_start,
        "rate_window_count": inventory.rate_window_count,
    }


def gpu_state_written(state: dict[str, Any], revision: int) -> Changes:
    return {"gpu_state": state, "gpu_revision": revision}


def gpu_blocks_set(blocks: int) -> Changes:
    """The node's block bits (records.GPU_BLOCKED, NODE_DRAINED); 0 removes the attribute."""
    return {"gpu_blocks": blocks or None}


def credential_revoked(now: float) -> Changes:
    return {"credential_state": "revoked", "credential_revoked_at": _ms(now)}


# --- enrollments --------------------------------------------------------------------------


def enrollment_revoked(now: float) -> Changes:
    return {"state": "revoked", "revoked_at": _ms(now)}


def enrollment_consumed(node_id: str, idempotency_key_sha256: str, now: float) -> Changes:
    return {
        "state": "consumed",
        "consumed_at": _ms(now),
        "node_id": node_id,
        "idempotency_key_sha256": idempotency_key_sha256,
    }
