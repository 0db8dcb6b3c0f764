"""The running control plane's stores, for integration tests that call services directly (in the
test process, against the emulator the ``stack`` fixture started)."""

from __future__ import annotations

from chalicelib import instance
from chalicelib.domain.records import ONLINE_NODES, ControlItem
from chalicelib.stores.contract import Stores


def stores() -> Stores:
    return instance.get().stores


def online_nodes() -> int | None:
    """The online-node counter as stored (None: absent)."""
    item = stores().control.get(ONLINE_NODES)
    return None if item is None or item.count is None else int(item.count)


def revision_of(item: ControlItem | None) -> int:
    """A fleet-state item's revision (0: the item, or its revision, is absent)."""
    return 0 if item is None or item.revision is None else int(item.revision)
