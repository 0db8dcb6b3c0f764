from __future__ import annotations

import threading

import pytest
from chalicelib.services.known_callers import KnownCallers


def test_known_callers_remembers_and_forgets_exact_pairs() -> None:
    known = KnownCallers(capacity=4)
    known.remember(("node_a", "digest-1"))
    assert ("node_a", "digest-1") in known
    assert ("node_a", "digest-2") not in known  # same node, another credential: not known
    known.forget(("node_a", "digest-1"))
    assert ("node_a", "digest-1") not in known


def test_known_callers_capacity_evicts_the_least_recently_used() -> None:
    known = KnownCallers(capacity=2)
    known.remember(("a", "1"))
    known.remember(("b", "1"))
    assert ("a", "1") in known  # touched: b is now the oldest
    known.remember(("c", "1"))
    assert len(known) == 2 and ("b", "1") not in known and ("a", "1") in known and ("c", "1") in known


def test_known_callers_stays_bounded_under_concurrent_use() -> None:
    known = KnownCallers(capacity=100)

    def fill(worker: int) -> None:
        for index in range(2_000):
            known.remember((f"node_{worker}_{index}", "d"))
            (f"node_{worker}_{index // 2}", "d") in known  # noqa: B015 - exercise the read path too

    threads = [threading.Thread(target=fill, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(known) == 100


def test_known_callers_refuses_a_capacity_below_one() -> None:
    with pytest.raises(ValueError):
        KnownCallers(capacity=0)
