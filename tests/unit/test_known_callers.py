from __future__ import annotations

import threading

import pytest
from chalicelib.services.known_callers import VIEW_SECONDS, ClaimView, KnownCallers


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


def _view(read_at: float, parked_at: float | None = None) -> ClaimView:
    return ClaimView(frozenset({"echo"}), parked_at, "online", read_at - 1, read_at)


def test_known_callers_keeps_a_claim_view_until_it_is_old() -> None:
    known = KnownCallers()
    known.remember_view(("a", "1"), _view(100.0))
    assert known.claim_view(("a", "1"), 100.0 + VIEW_SECONDS) == _view(100.0)
    assert known.claim_view(("a", "1"), 100.0 + VIEW_SECONDS + 0.001) is None
    assert known.claim_view(("a", "1"), 99.0) is None  # read "in the future": a clock step, not trusted
    assert known.claim_view(("a", "2"), 100.0) is None  # another credential of the node: no view


def test_known_callers_remember_keeps_the_view_and_remember_view_none_drops_it() -> None:
    known = KnownCallers()
    known.remember_view(("a", "1"), _view(100.0))
    known.remember(("a", "1"))  # a heartbeat of the same caller
    assert known.claim_view(("a", "1"), 100.0) == _view(100.0)
    known.remember_view(("a", "1"), None)
    assert ("a", "1") in known and known.claim_view(("a", "1"), 100.0) is None
    known.remember_view(("a", "1"), _view(100.0))
    known.forget(("a", "1"))
    assert known.claim_view(("a", "1"), 100.0) is None


@pytest.mark.parametrize(
    ("liveness", "beat", "online"),
    [("online", 51.0, True), ("online", 50.0, False), ("online", None, False), ("stale", 60.0, False)],
    ids=["after-cutoff", "at-cutoff", "never", "stale"],
)
def test_claim_view_online_is_the_claim_transactions_test(liveness: str, beat: float | None, online: bool) -> None:
    view = ClaimView(frozenset(), None, liveness, beat, 100.0)
    assert view.online(heartbeat_after=50.0) is online
