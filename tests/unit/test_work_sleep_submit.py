"""work.submit of ``diagnostic.sleep``: the control plane queues ``{"seconds": 0..300}`` and refuses
anything else with ``invalid_request``, writing nothing (the protocol's input schema, the same rule
the worker applies)."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Invalid
from chalicelib.services import work
from modelforge_protocol import work as protocol

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


@pytest.mark.parametrize("seconds", [0, 0.25, 60, protocol.MAX_SLEEP_SECONDS])
def test_submit_sleep_with_seconds_in_range_is_queued(stores: MemoryStores, seconds: float) -> None:
    body = {"capability": protocol.SLEEP, "input": {"seconds": seconds}}
    item = work.submit(stores, typed.submit_work(body), NOW).item
    assert (item.capability, item.status) == (protocol.SLEEP, "queued")


@pytest.mark.parametrize(
    "document",
    [{}, {"seconds": -1}, {"seconds": 300.5}, {"seconds": "60"}, {"seconds": True}, {"seconds": 1, "extra": 1}],
    ids=["missing", "negative", "too-long", "string", "bool", "extra-field"],
)
def test_submit_sleep_with_bad_input_is_invalid_request_and_writes_nothing(
    stores: MemoryStores, document: dict[str, Any]
) -> None:
    body = {"capability": protocol.SLEEP, "input": document}
    with pytest.raises(Invalid) as refused:
        work.submit(stores, typed.submit_work(body), NOW)
    assert refused.value.code == "invalid_request"
    assert stores.objects.objects == {} and stores.journal.calls == []
