"""Park and wake: work reaches an idle node over its push channel (docs/DISPATCH.md).

A node with a live channel connection that finds nothing to claim parks for its capabilities (one
write, only when it becomes idle), and its claim then looks at the queue once more. A submit, after
writing its item, wakes at most ``WAKE_PER_ITEM`` parked nodes of the item's capability: each wake
un-parks one node with a conditional write (one waker wins a node) and sends it ``wake``. So no
item is left queued while a parked node sleeps (the proof is in docs/DISPATCH.md), and a wake
costs reads and writes in proportion to items, never to the fleet. Messages are hints: a woken
node claims through the fenced claim, and a cancel makes its holder renew. A send that finds the
connection gone clears it on the node and the wake tries the next parked node.

Nothing here may fail the request that triggered it: a channel that cannot be reached costs a log
line, and the heartbeat's ``work_waiting`` hint remains the backstop.
"""

from __future__ import annotations

import logging
from typing import Any

from modelforge_protocol import schemas

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import Node, Parked
from chalicelib.stores.contract import Holder, Stores

log = logging.getLogger("modelforge.dispatch")

#: Parked nodes one submit wakes at most (two: one spare for a node that vanished meanwhile).
WAKE_PER_ITEM = 2
#: Parked nodes one submit reads at most (some may have been woken by another submit meanwhile,
#: or have a connection that is gone).
WAKE_READ = 8
WAKE: dict[str, Any] = {"v": schemas.CHANNEL_MESSAGE_VERSION, "type": schemas.CHANNEL_WAKE}


def park(stores: Stores, node: Node, holder: Holder, capabilities: list[str], now: float) -> bool:
    """Park ``node`` (as read by its claim) for ``capabilities`` if it holds a live channel connection
    and is not parked yet; True when this call parked it: the claim must then look at the queue
    once more (check, park, re-check)."""
    if not node.channel_connection_id or node.parked_at is not None or not capabilities:
        return False  # no channel (fallback: the heartbeat's hint), or parked already (no second write)
    try:
        stores.parking.park(holder, node.channel_connection_id, set(capabilities), now)
    except GuardFailed:
        return False  # revoked, reconnected or parked meanwhile: the next claim judges again
    node.parked_at = round(now, 3)  # as written: a claim that then takes an item un-parks it
    return True


def claimed(stores: Stores, node_id: str, capabilities: frozenset[str], parked_at: float | None) -> None:
    """A parked node took an item (its lease checked that it was parked at ``parked_at``): un-park
    it, so wakes go to idle nodes."""
    if parked_at is None:
        return
    try:
        stores.parking.unpark(Parked(node_id, capabilities, parked_at))
    except GuardFailed:
        return  # a waker un-parked it first


def wake(stores: Stores, capability: str, now: float) -> int:
    """After a submit wrote an item of ``capability``: wake up to ``WAKE_PER_ITEM`` parked nodes of
    that capability; how many were sent ``wake``."""
    woken = 0
    try:
        for parked in stores.parking.parked(capability, WAKE_READ):
            if woken >= WAKE_PER_ITEM:
                break
            try:
                stores.parking.unpark(parked)
            except GuardFailed:
                continue  # another submit woke it, or it parked again since the index was read
            node = stores.nodes.get(parked.node_id)
            if node is not None and node.credential_state == "active" and send(stores, node, WAKE):
                woken += 1
    except Exception:  # the wake is a hint: never fail the submit (the heartbeat's hint stays)
        log.exception("wake failed", extra={"event": "wake_failed", "capability": capability})
    return woken


def notify_cancel(stores: Stores, node_id: str | None, work_id: str) -> bool:
    """Tell the holder of a cancelled lease to renew now (its renewal's 409 stops the job)."""
    if node_id is None:
        return False
    try:
        node = stores.nodes.get(node_id)
        message = {"v": schemas.CHANNEL_MESSAGE_VERSION, "type": schemas.CHANNEL_CANCEL, "work_id": work_id}
        return node is not None and send(stores, node, message)
    except Exception:  # a hint: the holder's next renewal says "cancelled" anyway
        log.exception("cancel notice failed", extra={"event": "cancel_notice_failed", "work_id": work_id})
        return False


def send(stores: Stores, node: Node, message: dict[str, Any]) -> bool:
    """Send on the node's connection; a connection that is gone is cleared on the node (False)."""
    connection_id = node.channel_connection_id
    if not connection_id:
        return False
    if stores.channel.send(connection_id, message):
        return True
    forget_connection(stores, node.node_id, connection_id)
    return False


def forget_connection(stores: Stores, node_id: str, connection_id: str) -> None:
    try:
        stores.nodes.disconnect_channel(node_id, connection_id)
    except GuardFailed:
        return  # the node reconnected meanwhile: keep the new connection


def close(stores: Stores, node: Node) -> None:
    """Close the node's connection (a revoked credential) and forget it."""
    connection_id = node.channel_connection_id
    if not connection_id:
        return
    try:
        stores.channel.close(connection_id)
    except Exception:
        log.exception("channel close failed", extra={"event": "channel_close_failed", "node_id": node.node_id})
    forget_connection(stores, node.node_id, connection_id)
