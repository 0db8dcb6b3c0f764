"""Nodes: heartbeats, inventory, credential revocation."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from modelforge_protocol import credentials

from chalicelib.config.settings import INVENTORY_RATE_WINDOW_SECONDS, Settings
from chalicelib.domain import liveness, requests
from chalicelib.domain.errors import Conflict, GuardFailed, RateLimited, conflict, not_found
from chalicelib.domain.records import TELEMETRY_COLUMNS, Event, Heartbeat, Inventory, Node
from chalicelib.domain.validation import require_unique
from chalicelib.services import channel, dispatch, duplicate_identity, gpu_health, simulated_nodes
from chalicelib.services.auth import NodeCaller, require_holder
from chalicelib.services.known_callers import KnownCallers
from chalicelib.stores.contract import Holder, Stores

#: A transition heartbeat can lose a race with the sweep, an inventory replacement with another
#: replacement; each then retries from a fresh read.
_TRANSITION_ATTEMPTS = 3
#: The agent's fallback reason is kept to this many characters on the node: every heartbeat
#: rewrites the node item, and an 8-GPU node's item must stay within 1 KB (docs/DISPATCH.md).
STORED_REASON_CHARS = 24
#: The reported states worth a byte on the node: "connected" shows in the connection itself, and
#: "fallback" in its reason; the others are stored (and a state not stored is removed).
_STORED_STATES = ("connecting", "off")


def get(stores: Stores, node_id: str) -> Node:
    node = stores.nodes.get(node_id) if credentials.NODE_ID_RE.fullmatch(node_id) else None
    if node is None:
        raise not_found("node")
    return node


def _telemetry_rows(request: requests.Heartbeat) -> list[list[float]]:
    gpus = sorted(request.telemetry["gpus"], key=lambda gpu: gpu["index"])
    require_unique(gpus, "index", "telemetry/gpus")
    return [[gpu[column] for column in TELEMETRY_COLUMNS] for gpu in gpus]


def stored_health(health: dict[str, Any]) -> dict[str, Any]:
    """What the node keeps of a reported health: all of it, but a healthy worker's detail (it only
    names the capabilities the inventory carries). Every heartbeat rewrites the node item, and a
    healthy 8-GPU node's must stay within 1 KB (docs/DISPATCH.md, "Item size")."""
    worker = health.get("worker")
    if (
        health.get("status") == "ok"
        and set(health) <= {"status", "worker"}
        and isinstance(worker, dict)
        and worker.get("status") == "ok"
        and not worker.get("unavailable")
    ):
        return {"status": "ok", "worker": {"status": "ok"}}
    return health


@dataclass(frozen=True)
class HeartbeatResult:
    node: Node
    transitioned_from: str | None
    #: a channel ticket minted for this answer (written by the heartbeat's own update), or None
    ticket: channel.Ticket | None = None
    #: what the answer says of drains, blocked GPUs and re-checks (None: nothing blocks the node)
    gpu: gpu_health.GpuAnswer | None = None


def _channel_fields(settings: Settings, request: requests.Heartbeat, now: float) -> tuple[dict[str, Any], Any]:
    """The heartbeat record's channel fields (the agent's report, a ticket it asked for) and the ticket.

    A ticket is minted only with a channel configured and when the agent asks; its hash and expiry
    go into the heartbeat's own update, whose guard checks the credential is active: a revoked
    credential gets no ticket, and minting adds no write.
    """
    report = request.push_channel
    if report is None:
        return {}, None
    reason = (report.reason or "")[:STORED_REASON_CHARS] or None
    state = report.state if report.state in _STORED_STATES else None
    fields: dict[str, Any] = {"channel_reported": True, "channel_state": state, "channel_reason": reason}
    if not (settings.channel_url and report.need_ticket and report.state not in ("connected", "off")):
        return fields, None
    ticket = channel.mint(now)
    fields.update(channel_ticket_sha256=ticket.sha256, channel_ticket_expires_at=ticket.expires_at)
    return fields, ticket


def heartbeat(
    stores: Stores,
    settings: Settings,
    caller: NodeCaller,
    request: requests.Heartbeat,
    now: float,
    known: KnownCallers | None = None,
) -> HeartbeatResult:
    """Record a heartbeat: one conditional UpdateItem for a caller ``known`` to this instance.

    A caller not yet known is read first (one GetItem) and refused before anything is written:
    an unauthenticated heartbeat costs a read, never a write.
    """
    channel_fields, ticket = _channel_fields(settings, request, now)
    beat = Heartbeat(
        health=stored_health(request.health),
        telemetry=_telemetry_rows(request),
        agent_version=request.agent_version,
        protocol_version=request.protocol_version,
        slots=request.slots,
        # the same agent process as the stored one (another: judged after a read, in _recorded)
        instance_fingerprint=duplicate_identity.fingerprint(request.agent_instance_id),
        **channel_fields,
    )
    holder = Holder(caller.node_id, caller.credential_sha256)
    known = known if known is not None else KnownCallers(capacity=1)
    recorded = _recorded(stores, settings, caller, holder, beat, now, known)
    return HeartbeatResult(
        recorded.node, recorded.transitioned_from, ticket, _gpu_answer(stores, holder, request, recorded.node, now)
    )


def _recorded(
    stores: Stores,
    settings: Settings,
    caller: NodeCaller,
    holder: Holder,
    beat: Heartbeat,
    now: float,
    known: KnownCallers,
) -> HeartbeatResult:
    key = (caller.node_id, caller.credential_sha256)
    if key in known:
        try:
            return HeartbeatResult(stores.nodes.record_heartbeat(holder, beat, now), None)
        except GuardFailed:
            known.forget(key)  # revoked, no longer online, or another agent instance: read and judge
    node = require_holder(stores.nodes.get(caller.node_id), caller)
    known.remember(key)
    for _ in range(_TRANSITION_ATTEMPTS):
        try:
            return _record(stores, holder, node, duplicate_identity.judge_instance(beat, node, settings, now), now)
        except GuardFailed:
            node = require_holder(stores.nodes.get(caller.node_id), caller)  # moved meanwhile: judge again
    raise Conflict("heartbeat_conflict", "the node changed concurrently; retry the heartbeat")


def _gpu_answer(
    stores: Stores, holder: Holder, request: requests.Heartbeat, node: Node, now: float
) -> gpu_health.GpuAnswer | None:
    """A GPU report is recorded (one read; a write only when it changed); a node with something
    blocked gets its answer from a read. Any other heartbeat costs nothing more."""
    if request.gpu_health is not None:
        return gpu_health.report(stores, holder, request.boot_id, request.gpu_health, now)
    if node.gpu_blocks:
        return gpu_health.delivered(stores, holder, now)
    return None


def _record(stores: Stores, holder: Holder, node: Node, beat: Heartbeat, now: float) -> HeartbeatResult:
    """The steady update for an online node, else the logged transition to online."""
    if node.liveness == liveness.ONLINE:
        return HeartbeatResult(stores.nodes.record_heartbeat(holder, beat, now), None)
    previous = node.liveness
    event = Event(
        "node.liveness_changed",
        {"node_id": holder.node_id, "from": previous, "to": liveness.ONLINE, "cause": "heartbeat"},
        now,
    )
    stores.nodes.bring_online(holder, previous, beat, now, event)
    node.liveness = liveness.ONLINE
    return HeartbeatResult(node, previous)


def replace_inventory(
    stores: Stores, settings: Settings, caller: NodeCaller, request: requests.ReplaceInventory, now: float
) -> Inventory:
    """Replace a node's inventory, then reconcile its GPU claims and duplicate flags.

    The caller is read and checked before anything is written (an unknown caller costs one read,
    never a transaction). Each node may replace its inventory ``settings.inventory_rate_limit``
    times per window, so one node cannot write unlimited state-log objects. A simulated inventory
    is refused (403) unless the settings allow simulated nodes, after the caller check and before
    any write.
    """
    node = require_holder(stores.nodes.get(caller.node_id), caller)
    simulated_nodes.require_allowed(settings, request.inventory)
    uuids = duplicate_identity.gpu_uuids(request.inventory)
    for _ in range(_TRANSITION_ATTEMPTS):
        previous = stores.nodes.get_inventory(caller.node_id)
        inventory = Inventory(
            caller.node_id,
            inventory=request.inventory,
            updated_at=round(now, 3),
            revision=uuid.uuid4().hex,
            **_rate_window(settings, previous, now),
        )
        event = Event("inventory.replaced", {"node_id": caller.node_id}, now)
        try:
            stores.nodes.replace_inventory(
                Holder(caller.node_id, caller.credential_sha256),
                inventory,
                previous.revision if previous else None,
                set(request.inventory["capabilities"]),
                event,
            )
        except GuardFailed:
            node = require_holder(stores.nodes.get(caller.node_id), caller)  # revoked meanwhile: 401
            continue  # another replacement moved first: judge the rate again from a fresh read
        duplicate_identity.reconcile_claims(stores, caller.node_id, inventory.revision or "", uuids, now)
        duplicate_identity.detect_and_flag(
            stores, settings, caller.node_id, uuids, set(node.duplicate_partners or ()), now
        )
        return Inventory(caller.node_id, inventory=request.inventory, updated_at=inventory.updated_at)
    raise Conflict("inventory_conflict", "the inventory changed concurrently; retry")


def _rate_window(settings: Settings, previous: Inventory | None, now: float) -> dict[str, Any]:
    """This replacement's place in the node's rate window, or 429 when the window is full."""
    start = previous.rate_window_start if previous else None
    if start is None or now - start >= INVENTORY_RATE_WINDOW_SECONDS or now < start:
        return {"rate_window_start": round(now, 3), "rate_window_count": 1}
    count = int(previous.rate_window_count or 0) if previous else 0
    if count >= settings.inventory_rate_limit:
        raise RateLimited(
            "inventory_rate_limited",
            f"this node replaced its inventory {count} times in {INVENTORY_RATE_WINDOW_SECONDS}s "
            f"(the limit); retry after the window ends",
            math.ceil(start + INVENTORY_RATE_WINDOW_SECONDS - now),
        )
    return {"rate_window_start": start, "rate_window_count": count + 1}


def revoke_credential(stores: Stores, node_id: str, now: float) -> Node:
    """Revoke the node's credential, then close its channel connection (a revoked node's ticket
    opens nothing: the connect checks the credential, and no heartbeat of it mints another)."""
    get(stores, node_id)
    try:
        stores.nodes.revoke_credential(node_id, now, Event("credential.revoked", {"node_id": node_id}, now))
    except GuardFailed:
        raise conflict("credential_already_revoked", "the node's credential is already revoked") from None
    node = get(stores, node_id)
    dispatch.close(stores, node)
    node.channel_connection_id = node.channel_connected_at = None
    return node
