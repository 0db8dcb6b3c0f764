"""work: a refusal names a finished item in plain English (issue 21, "Words": "already
succeeded", never "is already succeeded"), to the admin who cancels and the node that renews."""

from __future__ import annotations

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Conflict
from chalicelib.services import work
from modelforge_protocol import work as protocol

from tests.support.memory_stores import memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, node_record

SAYS = {
    "succeeded": "the work already succeeded",
    "dead": "the work is already dead",
    "cancelled": "the work was already cancelled",
}


@pytest.mark.parametrize("status", sorted(SAYS))
def test_cancel_of_finished_work_says_what_happened_to_it(status: str) -> None:
    stores = memory_stores()
    item = work.submit(stores, typed.submit_work({"capability": protocol.ECHO, "input": {"text": "hi"}}), NOW).item
    stores.work.records[item.work_id].status = status
    with pytest.raises(Conflict) as raised:
        work.cancel(stores, item.work_id, NOW)
    assert raised.value.code == "work_finished"
    assert raised.value.message == f"{SAYS[status]}; only queued or leased work can be cancelled"


@pytest.mark.parametrize("status", ["succeeded", "dead"])
def test_a_node_renewing_finished_work_is_told_in_the_same_words(status: str) -> None:
    stores, agent = memory_stores(), Agent()
    stores.nodes.seed(node_record(agent, capabilities={protocol.ECHO}))
    item = work.submit(stores, typed.submit_work({"capability": protocol.ECHO, "input": {"text": "hi"}}), NOW).item
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW)
    assert claimed is not None and claimed.item.work_id == item.work_id
    stores.work.records[item.work_id].status = status
    with pytest.raises(Conflict) as raised:
        work.renew(stores, agent.caller, item.work_id, typed.renew_work({"epoch": 1}), NOW + 1, None)
    assert (raised.value.code, raised.value.message) == ("work_finished", SAYS[status])
