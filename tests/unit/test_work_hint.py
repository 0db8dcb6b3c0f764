"""work_hint: the heartbeat's cached "is work waiting?" answer, one query per work capability per
ttl per instance."""

from __future__ import annotations

import pytest
from chalicelib.domain import requests as typed
from chalicelib.services import work
from chalicelib.services.work_hint import DEFAULT_TTL_SECONDS, WorkHint
from modelforge_protocol.work import ECHO, OCR

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW


class Queue:
    """any_queued over a fixed answer per capability, counting every query."""

    def __init__(self, **queued: bool) -> None:
        self.queued = {OCR: queued.get("ocr", False), ECHO: queued.get("echo", False)}
        self.asked: list[str] = []

    def __call__(self, capability: str) -> bool:
        self.asked.append(capability)
        return self.queued[capability]


def test_the_answer_is_cached_per_capability_for_the_ttl() -> None:
    hint, queue = WorkHint(ttl_seconds=5), Queue(ocr=True)
    assert hint.waiting([OCR], queue, NOW) is True
    queue.queued[OCR] = False
    assert hint.waiting([OCR], queue, NOW + 4.9) is True  # still the cached answer
    assert queue.asked == [OCR]
    assert hint.waiting([OCR], queue, NOW + 5) is False  # refreshed at the ttl
    assert queue.asked == [OCR, OCR]


def test_each_capability_has_its_own_cache_entry() -> None:
    hint, queue = WorkHint(ttl_seconds=5), Queue(echo=True)
    assert hint.waiting([OCR], queue, NOW) is False
    assert hint.waiting([ECHO], queue, NOW + 1) is True
    assert hint.waiting([OCR, ECHO], queue, NOW + 2) is True
    assert queue.asked == [OCR, ECHO]  # one query each, none repeated


@pytest.mark.parametrize("capabilities", [[], ["cpu"], ["cuda", "cpu"], ["gpu.magic"]])
def test_capabilities_that_are_not_work_cost_no_query(capabilities: list[str]) -> None:
    hint, queue = WorkHint(), Queue(ocr=True, echo=True)
    assert hint.waiting(capabilities, queue, NOW) is False
    assert queue.asked == []


def test_only_work_capabilities_are_queried() -> None:
    hint, queue = WorkHint(), Queue()
    assert hint.waiting(["cpu", "cuda", OCR, ECHO, OCR], queue, NOW) is False
    assert sorted(queue.asked) == sorted([OCR, ECHO])  # each work capability the node serves, once


def test_the_first_capability_with_work_answers_without_querying_the_rest() -> None:
    hint, queue = WorkHint(), Queue(echo=True, ocr=True)
    assert hint.waiting([OCR, ECHO], queue, NOW) is True
    assert len(queue.asked) == 1


def test_a_clock_that_went_back_refreshes() -> None:
    hint, queue = WorkHint(ttl_seconds=5), Queue()
    hint.waiting([OCR], queue, NOW)
    hint.waiting([OCR], queue, NOW - 1)
    assert queue.asked == [OCR, OCR]


def test_forget_drops_the_cache() -> None:
    hint, queue = WorkHint(), Queue()
    hint.waiting([OCR], queue, NOW)
    hint.forget()
    hint.waiting([OCR], queue, NOW)
    assert queue.asked == [OCR, OCR]


def test_the_default_ttl() -> None:
    hint, queue = WorkHint(), Queue()
    hint.waiting([ECHO], queue, NOW)
    hint.waiting([ECHO], queue, NOW + DEFAULT_TTL_SECONDS - 0.001)
    assert len(queue.asked) == 1
    hint.waiting([ECHO], queue, NOW + DEFAULT_TTL_SECONDS)
    assert len(queue.asked) == 2


def test_the_hint_over_the_work_store_costs_one_read_per_ttl() -> None:
    stores: MemoryStores = memory_stores()
    hint = WorkHint(ttl_seconds=5)
    assert hint.waiting([ECHO, "cpu"], stores.work.any_queued, NOW) is False
    work.submit(stores, typed.submit_work({"capability": ECHO, "input": {}}), NOW)
    assert hint.waiting([ECHO], stores.work.any_queued, NOW + 1) is False  # stale by at most the ttl
    assert hint.waiting([ECHO], stores.work.any_queued, NOW + 5) is True
    assert stores.journal.calls.count("work.any_queued") == 2
