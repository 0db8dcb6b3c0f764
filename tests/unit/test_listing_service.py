"""listing: what admins read (pages, one node, work with its result URL), against the in-memory
stores: each node with its inventory and the sweep's hold, and a presigned URL only for a result."""

from __future__ import annotations

import pytest
from chalicelib.domain.errors import NotFound
from chalicelib.domain.records import MASS_STALE_HOLD, ControlItem, WorkItem
from chalicelib.services import listing, work

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, Agent, inventory_record, new_node_id, node_record, work_record

HOLD = ControlItem(MASS_STALE_HOLD, active=True, since=NOW - 60, detail={"stale": 9}, revision=1)


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _seeded_node(stores: MemoryStores, with_inventory: bool = True) -> str:
    agent = Agent()
    stores.nodes.seed(node_record(agent))
    if with_inventory:
        stores.nodes.seed_inventory(inventory_record(agent.node_id))
    return agent.node_id


def _work(work_id: str, result: dict[str, object] | None) -> WorkItem:
    return work_record(work_id, status="succeeded" if result else "queued", attempts=1, epoch=1, result=result)


def test_nodes_page_each_node_with_its_inventory_and_the_hold(stores: MemoryStores) -> None:
    with_inventory, without = _seeded_node(stores), _seeded_node(stores, with_inventory=False)
    stores.control.seed(HOLD)
    page = listing.nodes(stores, 10, None)
    found = {details.node.node_id: details for details in page.items}
    assert set(found) == {with_inventory, without}
    assert found[with_inventory].inventory is not None and found[without].inventory is None
    assert all(details.hold == HOLD for details in page.items)
    assert page.last_key is None


def test_nodes_page_full_page_next_key_given(stores: MemoryStores) -> None:
    for _ in range(3):
        _seeded_node(stores)
    page = listing.nodes(stores, 2, None)
    assert len(page.items) == 2 and page.last_key is not None
    rest = listing.nodes(stores, 2, page.last_key)
    assert {d.node.node_id for d in rest.items}.isdisjoint({d.node.node_id for d in page.items})


def test_node_unknown_id_not_found(stores: MemoryStores) -> None:
    with pytest.raises(NotFound) as refused:
        listing.node(stores, new_node_id())
    assert refused.value.code == "node_not_found"


def test_node_known_id_with_inventory_and_hold(stores: MemoryStores) -> None:
    node_id = _seeded_node(stores)
    stores.control.seed(HOLD)
    details = listing.node(stores, node_id)
    assert (details.node.node_id, details.hold) == (node_id, HOLD)
    assert details.inventory is not None and details.inventory.node_id == node_id


def test_with_inventory_written_node_hold_not_read(stores: MemoryStores) -> None:
    node_id = _seeded_node(stores)
    stores.control.seed(HOLD)
    details = listing.with_inventory(stores, stores.nodes.get(node_id))  # type: ignore[arg-type]
    assert details.inventory is not None and details.hold is None


def test_shown_work_with_result_presigned_for_an_hour(stores: MemoryStores) -> None:
    item = _work("work_" + "1" * 32, {"sha256": "b" * 64, "size": 5, "key": "work-results/w/1.json"})
    shown = listing.shown(stores, item)
    assert shown.item is item
    assert shown.result_url == f"{stores.objects.URL_BASE}/get/work-results/w/1.json?expires={work.RESULT_URL_SECONDS}"


def test_shown_work_without_result_no_url_minted(stores: MemoryStores) -> None:
    shown = listing.shown(stores, _work("work_" + "2" * 32, None))
    assert shown.result_url is None
    assert "objects.presigned_get" not in stores.journal.calls


def test_work_page_each_item_shown(stores: MemoryStores) -> None:
    stores.work.seed(_work("work_" + "3" * 32, {"sha256": "b" * 64, "size": 5, "key": "work-results/w/1.json"}))
    stores.work.seed(_work("work_" + "4" * 32, None))
    page = listing.work(stores, 10, None, None, None)
    urls = {shown.item.work_id: shown.result_url for shown in page.items}
    assert urls["work_" + "4" * 32] is None and urls["work_" + "3" * 32] is not None
