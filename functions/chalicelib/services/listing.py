"""What admins read: pages of enrollments, nodes and work, one node with its inventory, and work
items with a presigned URL of their result.

The HTTP edge turns the page token into ``start`` and ``last_key`` back into a token; the answers'
shapes are the edge's (``api/views.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from chalicelib.domain.records import MASS_STALE_HOLD, Enrollment, FleetState, Inventory, Node, WorkItem
from chalicelib.services import nodes as node_service
from chalicelib.services import work as work_service
from chalicelib.stores.contract import PageKey, Stores

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    #: where the next page starts; None after the last page
    last_key: PageKey


@dataclass(frozen=True)
class NodeDetails:
    node: Node
    inventory: Inventory | None
    #: the sweep's mass-outage hold (None when not read, or not held)
    hold: FleetState | None = None


@dataclass(frozen=True)
class ShownWork:
    item: WorkItem
    #: a presigned GET of the result, once the work succeeded
    result_url: str | None


def enrollments(stores: Stores, limit: int, start: PageKey) -> Page[Enrollment]:
    items, last = stores.enrollments.list_page(limit, start)
    return Page(items, last)


def nodes(stores: Stores, limit: int, start: PageKey) -> Page[NodeDetails]:
    """A page of nodes, each with its inventory and the sweep's hold."""
    items, last = stores.nodes.list_page(limit, start)
    inventories = stores.nodes.inventories_for([item.node_id for item in items])
    hold = stores.fleet.get(MASS_STALE_HOLD)
    return Page([NodeDetails(item, inventories.get(item.node_id), hold) for item in items], last)


def node(stores: Stores, node_id: str) -> NodeDetails:
    """One node, with its inventory and the sweep's hold (404 ``node_not_found``)."""
    found = node_service.get(stores, node_id)
    hold = stores.fleet.get(MASS_STALE_HOLD)
    return NodeDetails(found, stores.nodes.get_inventory(node_id), hold)


def with_inventory(stores: Stores, found: Node) -> NodeDetails:
    """A node just written, with its inventory (the sweep's hold is not read)."""
    return NodeDetails(found, stores.nodes.get_inventory(found.node_id))


def work(stores: Stores, limit: int, start: PageKey, status: str | None, capability: str | None) -> Page[ShownWork]:
    """A page of work items, of one state and capability when given."""
    items, last = stores.work.list_page(limit, start, status, capability)
    return Page([shown(stores, item) for item in items], last)


def shown(stores: Stores, item: WorkItem) -> ShownWork:
    """A work item as admins see it: with a presigned GET of its result, once it has one."""
    url = None
    if item.result is not None:
        url = stores.objects.presigned_get(item.result["key"], work_service.RESULT_URL_SECONDS)
    return ShownWork(item, url)
