"""The control store's contract, guard by guard, on both implementations (docs/TESTING.md, "Store guards")."""

from __future__ import annotations

import pytest
from chalicelib.domain.records import MASS_STALE_HOLD, ONLINE_NODES, ControlItem

from tests.contract.records import NOW, event
from tests.support.store_backends import Backend


def _hold(revision: int, active: bool = True) -> ControlItem:
    return ControlItem(MASS_STALE_HOLD, active=active, since=NOW - 10, detail={"online": 3}, revision=revision)


# --- put --------------------------------------------------------------------------------


def test_control_put_first_revision_absent_item_is_written(backend: Backend) -> None:
    backend.stores.control.put(_hold(1), event("sweep.hold"))
    assert backend.stores.control.get(MASS_STALE_HOLD) == _hold(1)
    assert backend.event_types() == ["sweep.hold"]


def test_control_put_next_revision_unchanged_item_is_written(backend: Backend) -> None:
    backend.seed(_hold(1))
    backend.stores.control.put(_hold(2, active=False), event("sweep.hold"))
    assert backend.stores.control.get(MASS_STALE_HOLD) == _hold(2, active=False)


def test_control_put_first_revision_written_meanwhile_is_refused(backend: Backend) -> None:
    backend.meanwhile_seed("control.put", _hold(1))
    backend.refused(lambda: backend.stores.control.put(_hold(1, active=False), event()))


def test_control_put_next_revision_written_meanwhile_is_refused(backend: Backend) -> None:
    backend.seed(_hold(1))
    backend.meanwhile("control.put", "control", MASS_STALE_HOLD, revision=2)
    backend.refused(lambda: backend.stores.control.put(_hold(2, active=False), event()))


# --- recount_online_nodes ---------------------------------------------------------------


@pytest.mark.parametrize("read", [None, ControlItem(ONLINE_NODES, count=5, revision=4)], ids=["absent", "read"])
def test_control_recount_unchanged_counter_is_set(backend: Backend, read: ControlItem | None) -> None:
    if read is not None:
        backend.seed(read)
    backend.stores.control.recount_online_nodes(read, 7, NOW, event("sweep.online_counter_repaired"))
    revision = 5 if read else 1
    assert backend.stores.control.get(ONLINE_NODES) == ControlItem(
        ONLINE_NODES, updated_at=NOW, count=7, revision=revision
    )
    assert backend.event_types() == ["sweep.online_counter_repaired"]


def test_control_recount_counter_moved_meanwhile_is_refused(backend: Backend) -> None:
    read = ControlItem(ONLINE_NODES, count=5, revision=4)
    backend.seed(read)
    backend.meanwhile("control.recount_online_nodes", "control", ONLINE_NODES, count=6, revision=5)
    backend.refused(lambda: backend.stores.control.recount_online_nodes(read, 7, NOW, event()))


def test_control_recount_counter_created_meanwhile_is_refused(backend: Backend) -> None:
    created = ControlItem(ONLINE_NODES, count=1, revision=1)
    backend.meanwhile_seed("control.recount_online_nodes", created)
    backend.refused(lambda: backend.stores.control.recount_online_nodes(None, 7, NOW, event()))
