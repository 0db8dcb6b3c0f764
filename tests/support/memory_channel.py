"""In-memory park store and channel: the fakes of ``stores.ParkStore`` and ``stores.ChannelStore``.

``MemoryParkStore`` keeps the park items by (capability, node id) and the node's ``parked_at`` on
the memory node store's record, behind the DynamoDB store's guards. ``MemoryChannelStore`` stands
for API Gateway's connections: ``open`` one, and every message sent to it is kept in ``sent``.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import Parked
from chalicelib.stores import changes
from chalicelib.stores.contract import Holder

if TYPE_CHECKING:
    from tests.support.journal import Journal
    from tests.support.memory_stores import MemoryNodeStore


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise GuardFailed(what)


class MemoryParkStore:
    def __init__(self, journal: Journal, nodes: MemoryNodeStore) -> None:
        self.journal, self._nodes = journal, nodes
        #: (capability, node id) -> the parking
        self.items: dict[tuple[str, str], Parked] = {}

    def park(self, holder: Holder, connection_id: str, capabilities: set[str], now: float) -> None:
        with self.journal.writing("parking.park", ()):
            node = self._nodes.records.get(holder.node_id)
            _require(
                node is not None
                and node.credential_sha256 == holder.credential_sha256
                and node.credential_state == "active",
                "credential",
            )
            _require(node.channel_connection_id == connection_id, "still that connection")
            _require(node.parked_at is None, "not parked")
            stamp = round(now, 3)
            node.parked_at = changes.parked(now)["parked_at"]
            parked = Parked(holder.node_id, frozenset(capabilities), stamp)
            for capability in capabilities:
                self.items[(capability, holder.node_id)] = parked

    def parked(self, capability: str, limit: int) -> list[Parked]:
        with self.journal.reading("parking.parked"):
            found = [parked for (cap, _), parked in self.items.items() if cap == capability]
            return sorted(found, key=lambda parked: (parked.parked_at, parked.node_id))[:limit]

    def unpark(self, parked: Parked) -> None:
        with self.journal.writing("parking.unpark", ()):
            node = self._nodes.records.get(parked.node_id)
            _require(node is not None and node.parked_at == parked.parked_at, "still parked so")
            node.parked_at = None
            for capability in parked.capabilities:
                self.items.pop((capability, parked.node_id), None)


@dataclass
class MemoryChannelStore:
    journal: Journal
    #: open connection ids
    connections: set[str] = field(default_factory=set)
    #: every message sent to an open connection, in order: (connection id, message)
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: connection ids closed by the control plane
    closed: list[str] = field(default_factory=list)
    #: posts that found their connection gone
    gone: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def open(self, connection_id: str) -> None:
        with self.lock:
            self.connections.add(connection_id)

    def drop(self, connection_id: str) -> None:
        """The connection went away without the control plane knowing (an agent that vanished)."""
        with self.lock:
            self.connections.discard(connection_id)

    def send(self, connection_id: str, message: dict[str, Any]) -> bool:
        self.journal.calls.append("channel.send")
        with self.lock:
            if connection_id not in self.connections:
                self.gone.append(connection_id)
                return False
            self.sent.append((connection_id, copy.deepcopy(message)))
            return True

    def close(self, connection_id: str) -> None:
        self.journal.calls.append("channel.close")
        with self.lock:
            self.connections.discard(connection_id)
            self.closed.append(connection_id)

    def messages_to(self, connection_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [message for sent_to, message in self.sent if sent_to == connection_id]
