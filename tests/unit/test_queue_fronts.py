"""queue_fronts: an instance's memory of each queue's front. It hands each remembered item to one
claim only (under real concurrency too), forgets a front when told, never remembers an empty one,
and remembers nothing past FRONT_SECONDS or for a set of capabilities it does not know in full."""

from __future__ import annotations

import random
import threading

import pytest
from chalicelib.domain.records import WorkItem
from chalicelib.services import queue_fronts
from chalicelib.services.queue_fronts import COOL_OFF_SECONDS, FRONT_SECONDS, QueueFronts
from modelforge_protocol import work as protocol

from tests.unit.service_bodies import NOW, work_record

ECHO, OCR = protocol.ECHO, protocol.OCR


def _items(capability: str, count: int, start: int = 0) -> list[WorkItem]:
    return [
        work_record(f"work_{capability[:4]}{n:06d}", NOW, capability=capability) for n in range(start, start + count)
    ]


def test_nothing_is_remembered_at_first() -> None:
    assert QueueFronts().take([ECHO], NOW) is None


def test_each_remembered_item_is_taken_once_then_the_front_is_gone() -> None:
    fronts = QueueFronts()
    items = _items(ECHO, 5)
    fronts.keep([ECHO], items, NOW)
    taken = [fronts.take([ECHO], NOW) for _ in range(5)]
    assert sorted(item.work_id for item in taken if item) == sorted(item.work_id for item in items)
    assert fronts.take([ECHO], NOW) is None and fronts.remembered(ECHO) == 0


def test_a_front_older_than_front_seconds_is_not_used() -> None:
    fronts = QueueFronts()
    fronts.keep([ECHO], _items(ECHO, 3), NOW)
    assert fronts.take([ECHO], NOW + FRONT_SECONDS) is not None
    assert fronts.take([ECHO], NOW + FRONT_SECONDS + 0.001) is None
    assert fronts.remembered(ECHO) == 0  # dropped, not kept for later


def test_a_clock_that_went_back_does_not_use_the_front() -> None:
    fronts = QueueFronts()
    fronts.keep([ECHO], _items(ECHO, 3), NOW)
    assert fronts.take([ECHO], NOW - 1) is None


def test_a_fresh_read_replaces_the_front_and_an_empty_one_forgets_it() -> None:
    fronts = QueueFronts()
    fronts.keep([ECHO], _items(ECHO, 3), NOW)
    newer = _items(ECHO, 2, start=100)
    fronts.keep([ECHO], newer, NOW + 1)
    assert {fronts.take([ECHO], NOW + 1).work_id for _ in range(2)} == {i.work_id for i in newer}  # type: ignore[union-attr]
    fronts.keep([ECHO], _items(ECHO, 3), NOW + 1)
    fronts.keep([ECHO], [], NOW + 1)  # the read found nothing: never remembered as empty, nor as before
    assert fronts.remembered(ECHO) == 0 and fronts.take([ECHO], NOW + 1) is None


def test_several_capabilities_are_served_from_memory_only_if_each_is_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queue_fronts.random, "randrange", random.Random(7).randrange)  # a fixed draw
    fronts = QueueFronts()
    fronts.keep([ECHO], _items(ECHO, 3), NOW)
    assert fronts.take([ECHO, OCR], NOW) is None  # OCR unknown: the claim reads both
    assert fronts.remembered(ECHO) == 3  # nothing taken
    fronts.keep([ECHO, OCR], _items(ECHO, 10) + _items(OCR, 10), NOW)
    drawn = [fronts.take([ECHO, OCR], NOW).capability for _ in range(10)]  # type: ignore[union-attr]
    assert 0 < drawn.count(ECHO) < 10  # drawn over both by their counts, as a fresh read's shuffle would


def test_forget_drops_one_capability_only() -> None:
    fronts = QueueFronts()
    fronts.keep([ECHO, OCR], _items(ECHO, 2) + _items(OCR, 2), NOW)
    fronts.forget(ECHO, NOW)
    assert (fronts.remembered(ECHO), fronts.remembered(OCR)) == (0, 2)


def test_a_lost_lease_stops_remembering_that_capability_for_the_cool_off() -> None:
    """Others are taking from the front: for COOL_OFF_SECONDS its reads are not remembered (each
    claim reads, as without the memory), then they are again."""
    fronts = QueueFronts()
    fronts.forget(ECHO, NOW)
    fronts.keep([ECHO, OCR], _items(ECHO, 3) + _items(OCR, 3), NOW + 1)
    assert (fronts.remembered(ECHO), fronts.remembered(OCR)) == (0, 3)
    fronts.keep([ECHO], _items(ECHO, 3), NOW + COOL_OFF_SECONDS - 0.01)
    assert fronts.remembered(ECHO) == 0
    fronts.keep([ECHO], _items(ECHO, 3), NOW + COOL_OFF_SECONDS)
    assert fronts.remembered(ECHO) == 3


def test_a_clock_gone_back_ends_the_cool_off() -> None:
    """A cool-off is never longer than COOL_OFF_SECONDS, whatever the clock did."""
    fronts = QueueFronts()
    fronts.forget(ECHO, NOW)
    fronts.keep([ECHO], _items(ECHO, 3), NOW - 60)
    assert fronts.remembered(ECHO) == 3


@pytest.mark.parametrize("round_", range(10))
def test_concurrent_claims_never_take_one_item_twice(round_: int) -> None:
    """16 threads drain fronts that a 17th keeps refilling: every item handed out once at most."""
    fronts = QueueFronts()
    batches = [_items(ECHO, 20, start=1000 * b) for b in range(20)]
    taken: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(17)

    def drain() -> None:
        start.wait()
        mine = []
        for _ in range(400):
            item = fronts.take([ECHO], NOW)
            if item is not None:
                mine.append(item.work_id)
        with lock:
            taken.extend(mine)

    def refill() -> None:
        start.wait()
        for batch in batches:
            fronts.keep([ECHO], batch, NOW)

    threads = [threading.Thread(target=drain) for _ in range(16)] + [threading.Thread(target=refill)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert len(taken) == len(set(taken)) > 0
