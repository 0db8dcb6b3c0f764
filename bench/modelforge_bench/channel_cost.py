"""What the push channel adds to a node-month and to each dispatched item (bench/cost.py).

Pure, like ``cost_model``: no AWS, no emulator. The counts come from the design (docs/DISPATCH.md,
issue 19): an API Gateway WebSocket connection held all month, a keep-alive ``ping`` every 5
minutes, a forced reconnect before 2 hours at a random point of the last 20 % (a ``$connect`` and a
``$disconnect`` handler, each with its read and its conditional write of the node item, and the
``by_channel`` index entry that appears and disappears), the ticket minted for it inside a heartbeat's
own UpdateItem (no request, but bytes on the node item and in the answer), and per dispatched item
a wake of at most ``WAKE_PER_ITEM`` parked nodes (one index query, a conditional write and a message
each) and the parks that follow (one write when a node becomes idle, plus its park item and index
entry, and the re-check's query). What each handler invocation costs in Lambda time and log bytes is
the measured heartbeat's (a handler with one DynamoDB call); write units follow from the measured
node item's size with the channel's attributes added (``node_item_sizes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from modelforge_cli.item_size import item_size, write_units

from .cost_model import SECONDS_PER_MONTH, Usage

#: The agent's keep-alive: one ``{"v": 1, "type": "ping"}`` message per this many seconds.
KEEPALIVE_SECONDS = 300
#: API Gateway closes a WebSocket connection after 2 hours; the agent reconnects at a random
#: point in the last ``RECONNECT_SPREAD`` of that life.
MAX_CONNECTION_SECONDS = 7200
RECONNECT_SPREAD = 0.2
#: Parked nodes a submit wakes per item (services/dispatch.py).
WAKE_PER_ITEM = 2
#: Messages are metered per started 32 KB; every message of the channel is under 1 KiB.
MESSAGE_UNIT_BYTES = 32 * 1024
#: Read units: a consistent GetItem of the node item (the ticket check); an eventually consistent
#: keys-only index query (``by_channel``, ``by_park``).
CONSISTENT_ITEM_READ = 1.0
INDEX_QUERY_READ = 0.5
#: A keys-only index entry (under 1 KB): one write unit when it appears or disappears.
INDEX_ENTRY_WRITE = 1
#: A park item in the control table (under 1 KB).
PARK_ITEM_WRITE = 1

_AT = {"N": "1764650000.123"}
#: The node item's attributes while connected (and parked), and while a minted ticket is unused, by
#: the short names the nodes table stores them under (tests/unit/test_cost_model.py keeps them equal
#: to the model's).
CONNECTED_ATTRIBUTES: dict[str, Any] = {
    "cn": {"S": "L0SM9cOFvHcCIhw="},  # channel_connection_id: API Gateway's connection ids are 16 characters
    "ca": _AT,  # channel_connected_at
    "cs": {"S": "connected"},  # channel_state
}
#: parked_at, the GPU block bits (a GPU latched or drained: records.Node.gpu_blocks) and the busy-slot
#: count the claim transactions keep (records.Node.slots_busy: 8 leases), the fullest state a heartbeat
#: rewrites (the heartbeat itself writes the schedulable slots, sq)
PARKED_ATTRIBUTES: dict[str, Any] = {"pk": _AT, "gb": {"N": "3"}, "sb": {"N": "8"}}
TICKET_ATTRIBUTES: dict[str, Any] = {"tk": {"S": "0" * 64}, "tx": _AT}  # channel_ticket_sha256, _expires_at
#: A node in fallback keeps its reason (cut to nodes.STORED_REASON_CHARS, 24) and no state.
FALLBACK_ATTRIBUTES: dict[str, Any] = {"cr": {"S": "r" * 24}}  # channel_reason
#: The answer block of a mint, as a heartbeat answer carries it.
CHANNEL_BLOCK = {
    "channel": {
        "url": "wss://abcdefghij.execute-api.us-east-1.amazonaws.com/live",
        "ticket": "mfct_" + "x" * 43,
        "expires_at": "2026-12-02T03:40:00.123Z",
    }
}


def mean_connection_seconds() -> float:
    """The mean life of a connection: reconnects are spread evenly over the last part of 2 hours."""
    return MAX_CONNECTION_SECONDS * (1 - RECONNECT_SPREAD / 2)


def connections_per_month() -> float:
    return SECONDS_PER_MONTH / mean_connection_seconds()


@dataclass(frozen=True)
class NodeItemSizes:
    """The node item's size (bytes) as measured, and with the channel's attributes."""

    measured: int
    connected: int
    connected_parked: int
    with_ticket: int
    #: in fallback with its reason, still asking for tickets (a proxy that blocks WebSockets)
    fallback_with_ticket: int

    def as_dict(self) -> dict[str, int]:
        return {
            "measured": self.measured,
            "connected": self.connected,
            "connected_parked": self.connected_parked,
            "with_ticket": self.with_ticket,
            "fallback_with_ticket": self.fallback_with_ticket,
            "heartbeat_write_units_connected_parked": write_units(self.connected_parked),
        }


def node_item_sizes(measured_item: dict[str, Any]) -> NodeItemSizes:
    # the measured node asked for a ticket in its heartbeats; a connection uses the ticket up (the
    # store removes its hash and expiry: stores/changes.channel_connected), and a heartbeat that
    # reports the channel connected mints none, so a connected node carries no ticket
    base = {
        name: value
        for name, value in measured_item.items()
        if name not in CONNECTED_ATTRIBUTES and name not in TICKET_ATTRIBUTES
    }
    connected = {**base, **CONNECTED_ATTRIBUTES}
    parked = {**connected, **PARKED_ATTRIBUTES}
    # a ticket is minted while the node is not connected: its connection attributes are gone
    ticket = {**base, **PARKED_ATTRIBUTES, "cs": {"S": "connecting"}, **TICKET_ATTRIBUTES}
    fallback = {**base, **FALLBACK_ATTRIBUTES, **TICKET_ATTRIBUTES}
    return NodeItemSizes(
        item_size(measured_item), item_size(connected), item_size(parked), item_size(ticket), item_size(fallback)
    )


def _invocations(count: float, handler: Usage) -> Usage:
    """``count`` Lambda invocations, each costing what ``handler`` (one measured invocation) did."""
    per = 1 / max(1.0, handler.lambda_invocations)
    return Usage(
        lambda_invocations=count,
        lambda_billed_ms=count * handler.lambda_billed_ms * per,
        log_bytes=count * handler.log_bytes * per,
    )


def node_month(handler: Usage, sizes: NodeItemSizes) -> dict[str, Usage]:
    """What the channel adds to one node's month, line by line (a node connected all month)."""
    connections = connections_per_month()
    pings = SECONDS_PER_MONTH / KEEPALIVE_SECONDS
    connected_units = write_units(sizes.connected_parked)
    connect_units = write_units(max(sizes.with_ticket, sizes.connected_parked)) + INDEX_ENTRY_WRITE
    disconnect_units = connected_units + INDEX_ENTRY_WRITE
    mint_units = max(0, write_units(sizes.with_ticket) - connected_units)
    block_bytes = len(json.dumps(CHANNEL_BLOCK, separators=(",", ":")))
    return {
        "connection minutes": Usage(websocket_connection_minutes=SECONDS_PER_MONTH / 60),
        "keep-alive pings": Usage(websocket_messages=pings) + _invocations(pings, handler),
        "forced reconnects": Usage(
            dynamodb_rru=connections * (CONSISTENT_ITEM_READ + INDEX_QUERY_READ),
            dynamodb_wru=connections * (connect_units + disconnect_units),
        )
        + _invocations(2 * connections, handler),
        "ticket mints": Usage(dynamodb_wru=connections * mint_units, transfer_out_bytes=connections * block_bytes),
    }


def per_item(empty_claim: Usage, sizes: NodeItemSizes) -> dict[str, Usage]:
    """What the channel adds to one dispatched item, line by line: the submit's wake (inside the
    submit request), and the parks that follow (the woken node that lost the claim parks at once,
    after an empty claim; the winner when it is idle again)."""
    park = Usage(
        dynamodb_wru=write_units(sizes.connected_parked) + PARK_ITEM_WRITE + INDEX_ENTRY_WRITE,
        dynamodb_rru=INDEX_QUERY_READ,  # the claim's re-check after parking
    )
    return {
        "wake": Usage(
            dynamodb_rru=INDEX_QUERY_READ,
            dynamodb_wru=WAKE_PER_ITEM * (PARK_ITEM_WRITE + INDEX_ENTRY_WRITE),
            websocket_messages=WAKE_PER_ITEM,
        ),
        "parks": park.scaled(WAKE_PER_ITEM),
        "empty claims": empty_claim.scaled(WAKE_PER_ITEM - 1),
    }


def total(lines: dict[str, Usage]) -> Usage:
    summed = Usage()
    for usage in lines.values():
        summed = summed + usage
    return summed
