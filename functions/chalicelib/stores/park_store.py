"""The DynamoDB park store: idle nodes waiting on their channel, by capability (stores.ParkStore).

A parked node has ``parked_at`` on its node item (the claim reads it with the node, so a node
already parked is never written again) and one park item per capability it parked for in the
control table (``park#<capability>#<node_id>``), found by the sparse ``by_park`` index: a wake
reads the parked nodes of one capability and nothing else. Both are written by one transaction
and removed by one; the node item's ``parked_at`` is the guard, so one waker wins each node.
Ephemeral: nothing here is logged, and replay leaves it out.
"""

from __future__ import annotations

from pynamodb.transactions import TransactWrite

from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import Parked
from chalicelib.stores import changes
from chalicelib.stores.contract import Holder
from chalicelib.stores.models import ControlModel, NodeModel
from chalicelib.stores.node_store import holds_credential
from chalicelib.stores.transactions import run_transaction
from chalicelib.stores.update_actions import update_actions

PARK_PREFIX = "park#"


def park_name(capability: str, node_id: str) -> str:
    return f"{PARK_PREFIX}{capability}#{node_id}"


class DynamoParkStore:
    def __init__(self, enabled: bool = True) -> None:
        #: False without a channel: no node can hold a connection, so none is parked, and a wake
        #: reads nothing (a submit costs what it did before the channel)
        self._enabled = enabled

    def park(self, holder: Holder, connection_id: str, capabilities: set[str], now: float) -> None:
        """One transaction: the node's ``parked_at`` and a park item per capability."""
        if not self._enabled:
            raise GuardFailed("no channel: nothing is parked")
        stamp = round(now, 3)
        node_id = holder.node_id
        items = [
            ControlModel(
                park_name(capability, node_id),
                park_capability=capability,
                parked_at=stamp,
                node_id=node_id,
                capabilities=set(capabilities),
            )
            for capability in sorted(capabilities)
        ]

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                NodeModel(node_id),
                actions=update_actions(NodeModel, changes.parked(now)),
                condition=(
                    holds_credential(holder.credential_sha256)
                    # the node still holds the connection a wake will be sent on
                    & (NodeModel.channel_connection_id == connection_id)
                    # and is not parked yet (a parked node is never written again)
                    & NodeModel.parked_at.does_not_exist()
                ),
            )
            for item in items:
                transaction.save(item)  # guarded by the node's update: all or nothing

        run_transaction(build)

    def parked(self, capability: str, limit: int) -> list[Parked]:
        if not self._enabled:
            return []
        found = ControlModel.by_park.query(capability, limit=limit)
        return [
            Parked(str(item.node_id), frozenset(item.capabilities or ()), float(item.parked_at))
            for item in found
            if item.node_id and item.parked_at is not None
        ]

    def unpark(self, parked: Parked) -> None:
        """One transaction: ``parked_at`` removed and every park item of that parking deleted."""

        def build(transaction: TransactWrite) -> None:
            transaction.update(
                NodeModel(parked.node_id),
                actions=update_actions(NodeModel, changes.unparked()),
                # still parked by the parking the waker read: one waker wins the node
                condition=NodeModel.parked_at == parked.parked_at,
            )
            for capability in sorted(parked.capabilities):
                transaction.delete(ControlModel(park_name(capability, parked.node_id)))

        run_transaction(build)
