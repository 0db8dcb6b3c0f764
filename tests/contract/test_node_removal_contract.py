"""The node store's removal (``delete_node``, ``offline_since``), guard by guard, on both
implementations (docs/TESTING.md, "Store guards")."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain.records import ONLINE_NODES, ControlItem

from tests.contract.records import NOW, enrollment, event, inventory, node
from tests.support.store_backends import Backend

SILENT_SINCE = NOW - 100  # the seeded heartbeat (NOW - 30) is after it: a live node


def _removable(backend: Backend, liveness: str = "online", **fields: Any) -> tuple[Any, Any]:
    """A node, its inventory with two claims, its consumed enrollment and a duplicate partner."""
    ours = node(liveness, **fields)
    partner = node("online", duplicate_partners={ours.node_id})
    ours.duplicate_partners = {partner.node_id}
    backend.seed(ours)
    backend.seed(partner)
    backend.seed(inventory(ours.node_id, claimed_uuids={"GPU-a", "GPU-b"}, gpu_state={"GPU-a": {"latched": True}}))
    backend.seed(enrollment(enrollment_id=ours.enrollment_id, state="consumed", node_id=ours.node_id))
    backend.seed(ControlItem(ONLINE_NODES, count=5, revision=1))
    return ours, partner


@pytest.mark.parametrize(
    ("liveness", "fields", "online_after"),
    [
        pytest.param("online", {"credential_state": "revoked"}, 4, id="revoked-online"),
        pytest.param("offline", {"last_heartbeat_at": NOW - 1000}, 5, id="offline"),
        pytest.param("stale", {"last_heartbeat_at": SILENT_SINCE}, 5, id="silent-since"),
    ],
)
def test_nodes_delete_node_removable_goes_with_everything_of_it(
    backend: Backend, liveness: str, fields: dict[str, Any], online_after: int
) -> None:
    ours, partner = _removable(backend, liveness, **fields)
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event("node.deleted"))
    assert backend.stores.nodes.get(ours.node_id) is None
    assert backend.stores.nodes.get_inventory(ours.node_id) is None
    assert backend.claims(ours.node_id) == set()
    assert backend.stores.enrollments.get(ours.enrollment_id) is None
    assert backend.stores.nodes.get(partner.node_id).duplicate_partners is None
    assert backend.stores.control.get(ONLINE_NODES).count == online_after
    assert backend.event_types() == ["node.deleted"]


def test_nodes_delete_node_without_inventory_or_enrollment_is_deleted(backend: Backend) -> None:
    ours = node("offline", last_heartbeat_at=NOW - 1000)
    backend.seed(ours)
    backend.stores.nodes.delete_node(ours, None, SILENT_SINCE, event("node.deleted"))
    assert backend.stores.nodes.get(ours.node_id) is None and backend.event_types() == ["node.deleted"]


def test_nodes_delete_node_live_with_an_active_credential_is_refused(backend: Backend) -> None:
    ours, _ = _removable(backend, "online")
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event()))


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        pytest.param("nodes", {"liveness": "online", "last_heartbeat_at": NOW}, id="back-online"),
        pytest.param("inventories", {"revision": "rev-2"}, id="inventory-replaced"),
    ],
)
def test_nodes_delete_node_moved_meanwhile_is_refused(backend: Backend, kind: str, change: dict[str, Any]) -> None:
    ours, _ = _removable(backend, "offline", last_heartbeat_at=NOW - 1000)
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.meanwhile("nodes.delete_node", kind, ours.node_id, **change)
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event()))


def test_nodes_delete_node_refused_when_its_liveness_moved_meanwhile(backend: Backend) -> None:
    # revoked (removable either way), but the sweep moved it from online: the deletion's online-count
    # decrement was decided on the liveness read, so it must not land
    ours, _ = _removable(backend, "online", credential_state="revoked")
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.meanwhile("nodes.delete_node", "nodes", ours.node_id, liveness="stale")
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event()))


def test_nodes_delete_node_refused_when_a_duplicate_partner_is_gone_meanwhile(backend: Backend) -> None:
    # unflagging a partner that no longer exists would create an item for it
    ours, partner = _removable(backend, "offline", last_heartbeat_at=NOW - 1000)
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.meanwhile_delete("nodes.delete_node", "nodes", partner.node_id)
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event()))


def test_nodes_delete_node_whose_inventory_has_no_revision_is_deleted(backend: Backend) -> None:
    ours = node("offline", last_heartbeat_at=NOW - 1000)
    backend.seed(ours)
    backend.seed(inventory(ours.node_id, revision=None))
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event("node.deleted"))
    assert backend.stores.nodes.get(ours.node_id) is None
    assert backend.stores.nodes.get_inventory(ours.node_id) is None


def test_nodes_delete_node_refused_when_an_inventory_revision_is_written_meanwhile(backend: Backend) -> None:
    ours = node("offline", last_heartbeat_at=NOW - 1000)
    backend.seed(ours)
    backend.seed(inventory(ours.node_id, revision=None))
    read_inventory = backend.stores.nodes.get_inventory(ours.node_id)
    backend.meanwhile("nodes.delete_node", "inventories", ours.node_id, revision="rev-1")
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, read_inventory, SILENT_SINCE, event()))


def test_nodes_delete_node_read_without_inventory_refused_when_one_is_reported_meanwhile(backend: Backend) -> None:
    ours = node("offline", last_heartbeat_at=NOW - 1000)
    backend.seed(ours)
    backend.meanwhile_seed("nodes.delete_node", inventory(ours.node_id))
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, None, SILENT_SINCE, event()))


def test_nodes_delete_node_never_takes_another_nodes_enrollment(backend: Backend) -> None:
    ours = node("offline", last_heartbeat_at=NOW - 1000)  # removable: only the enrollment's guard refuses
    backend.seed(ours)
    backend.seed(enrollment(enrollment_id=ours.enrollment_id, state="consumed", node_id=node().node_id))
    backend.refused(lambda: backend.stores.nodes.delete_node(ours, None, SILENT_SINCE, event()))


def test_nodes_offline_since_names_nodes_offline_since_the_cutoff_only(backend: Backend) -> None:
    long_gone = node("offline", liveness_changed_at=NOW - 5000, last_heartbeat_at=NOW - 6000)
    recent = node("offline", liveness_changed_at=NOW - 10, last_heartbeat_at=NOW - 400)
    stale = node("stale", liveness_changed_at=NOW - 5000, last_heartbeat_at=NOW - 6000)
    for seeded in (long_gone, recent, stale):
        backend.seed(seeded)
    assert backend.stores.nodes.offline_since(NOW - 1000, 10) == [long_gone.node_id]
    assert backend.stores.nodes.offline_since(NOW - 10000, 10) == []
