"""The push channel's guards on both implementations (docs/TESTING.md, "Store guards"): the ticket a
connect uses up, the connection a disconnect clears, the park a node writes once and the un-park
one waker wins. None of these writes is logged."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain.records import Parked

from tests.contract.records import NOW, holder, node, work
from tests.support.store_backends import Backend

TICKET = "a" * 64
CONNECTION = "L0SM9cOFvHcCIhw="
ECHO, OCR = "diagnostic.echo", "ocr"


def _ticketed(backend: Backend, **fields: Any) -> Any:
    seeded = node(channel_ticket_sha256=TICKET, channel_ticket_expires_at=NOW + 100, **fields)
    backend.seed(seeded)
    return seeded


def _connected(backend: Backend, **fields: Any) -> Any:
    seeded = node(channel_connection_id=CONNECTION, channel_connected_at=NOW - 50, **fields)
    backend.seed(seeded)
    return seeded


# --- connect_channel ---------------------------------------------------------------------


def test_nodes_connect_channel_with_its_ticket_records_the_connection_and_uses_the_ticket(backend: Backend) -> None:
    ours = _ticketed(backend)
    backend.stores.nodes.connect_channel(ours.node_id, TICKET, CONNECTION, NOW)
    stored = backend.stores.nodes.get(ours.node_id)
    assert (stored.channel_connection_id, stored.channel_connected_at) == (CONNECTION, NOW)
    assert (stored.channel_ticket_sha256, stored.channel_ticket_expires_at) == (None, None)
    assert backend.stores.nodes.node_of_connection(CONNECTION) == ours.node_id
    assert backend.event_types() == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"channel_ticket_sha256": "b" * 64}, id="another_ticket"),
        pytest.param({"channel_ticket_sha256": None}, id="used"),
        pytest.param({"channel_ticket_expires_at": NOW}, id="expired"),
        pytest.param({"credential_state": "revoked"}, id="revoked"),
    ],
)
def test_nodes_connect_channel_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _ticketed(backend)
    backend.meanwhile("nodes.connect_channel", "nodes", ours.node_id, **change)
    backend.refused(lambda: backend.stores.nodes.connect_channel(ours.node_id, TICKET, CONNECTION, NOW))


def test_nodes_connect_channel_of_a_missing_node_is_refused(backend: Backend) -> None:
    backend.refused(lambda: backend.stores.nodes.connect_channel(node().node_id, TICKET, CONNECTION, NOW))


# --- disconnect_channel, node_of_connection -----------------------------------------------


def test_nodes_disconnect_channel_still_that_connection_clears_it(backend: Backend) -> None:
    ours = _connected(backend)
    backend.stores.nodes.disconnect_channel(ours.node_id, CONNECTION)
    stored = backend.stores.nodes.get(ours.node_id)
    assert (stored.channel_connection_id, stored.channel_connected_at) == (None, None)
    assert backend.stores.nodes.node_of_connection(CONNECTION) is None
    assert backend.event_types() == []


def test_nodes_disconnect_channel_after_a_newer_connection_is_refused(backend: Backend) -> None:
    ours = _connected(backend)
    backend.meanwhile("nodes.disconnect_channel", "nodes", ours.node_id, channel_connection_id="newer=")
    backend.refused(lambda: backend.stores.nodes.disconnect_channel(ours.node_id, CONNECTION))


def test_nodes_node_of_connection_finds_only_a_connected_node(backend: Backend) -> None:
    ours = _connected(backend)
    _ticketed(backend)
    assert backend.stores.nodes.node_of_connection(CONNECTION) == ours.node_id
    assert backend.stores.nodes.node_of_connection("unknown=") is None


# --- park, parked, unpark -----------------------------------------------------------------


def test_parking_park_connected_idle_node_is_found_by_each_of_its_capabilities(backend: Backend) -> None:
    ours = _connected(backend)
    backend.stores.parking.park(holder(ours), CONNECTION, {ECHO, OCR}, NOW)
    assert backend.stores.nodes.get(ours.node_id).parked_at == NOW
    expected = [Parked(ours.node_id, frozenset({ECHO, OCR}), NOW)]
    assert backend.stores.parking.parked(ECHO, 8) == expected
    assert backend.stores.parking.parked(OCR, 8) == expected
    assert backend.stores.parking.parked("other.capability", 8) == []
    assert backend.event_types() == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"credential_sha256": "f" * 64}, id="credential"),
        pytest.param({"credential_state": "revoked"}, id="revoked"),
        pytest.param({"channel_connection_id": "newer="}, id="reconnected"),
        pytest.param({"channel_connection_id": None}, id="disconnected"),
        pytest.param({"parked_at": NOW - 5}, id="parked"),
    ],
)
def test_parking_park_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _connected(backend)
    backend.meanwhile("parking.park", "nodes", ours.node_id, **change)
    backend.refused(lambda: backend.stores.parking.park(holder(ours), CONNECTION, {ECHO}, NOW))
    assert backend.stores.parking.parked(ECHO, 8) == []


def test_parking_parked_lists_the_longest_parked_first_up_to_the_limit(backend: Backend) -> None:
    parked = []
    for offset in (3, 1, 2):
        ours = _connected(backend)
        backend.stores.parking.park(holder(ours), CONNECTION, {ECHO}, NOW - offset)
        parked.append((NOW - offset, ours.node_id))
    found = backend.stores.parking.parked(ECHO, 2)
    assert [(entry.parked_at, entry.node_id) for entry in found] == sorted(parked)[:2]


def test_parking_unpark_still_parked_removes_every_capability(backend: Backend) -> None:
    ours = _connected(backend)
    backend.stores.parking.park(holder(ours), CONNECTION, {ECHO, OCR}, NOW)
    [found] = backend.stores.parking.parked(OCR, 8)
    backend.stores.parking.unpark(found)
    assert backend.stores.nodes.get(ours.node_id).parked_at is None
    assert backend.stores.parking.parked(ECHO, 8) == [] and backend.stores.parking.parked(OCR, 8) == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"parked_at": None}, id="woken_by_another"),
        pytest.param({"parked_at": NOW + 7}, id="parked_again"),
    ],
)
def test_parking_unpark_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _connected(backend)
    backend.stores.parking.park(holder(ours), CONNECTION, {ECHO}, NOW)
    [found] = backend.stores.parking.parked(ECHO, 8)
    backend.meanwhile("parking.unpark", "nodes", ours.node_id, **change)
    backend.refused(lambda: backend.stores.parking.unpark(found))


def test_parking_unpark_twice_only_the_first_wins(backend: Backend) -> None:
    ours = _connected(backend)
    backend.stores.parking.park(holder(ours), CONNECTION, {ECHO}, NOW)
    [found] = backend.stores.parking.parked(ECHO, 8)
    backend.stores.parking.unpark(found)
    backend.refused(lambda: backend.stores.parking.unpark(found))


def test_parking_park_then_a_write_then_parked_sees_the_node(backend: Backend) -> None:
    """The lost-wake-up order "node parks, then the submit reads parked nodes" on each store:
    the read that follows the park sees it (on the emulator as on the fake)."""
    ours = _connected(backend)
    backend.stores.parking.park(holder(ours), CONNECTION, {ECHO}, NOW)  # node: query (empty) -> park
    item = work(capability=ECHO)
    backend.seed(item)  # submit: write the item
    assert [entry.node_id for entry in backend.stores.parking.parked(ECHO, 8)] == [ours.node_id]  # -> read parked
    assert [queued.work_id for queued in backend.stores.work.queue_front(ECHO, 25)] == [item.work_id]
