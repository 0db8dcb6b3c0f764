"""The local API server's invocation gate: at most N at once, the rest in arrival order, a bounded wait."""

from __future__ import annotations

import threading
import time

import pytest
from modelforge_local_stack.invocation_gate import InvocationGate

from tests.support.polling import wait_until

WAIT = 5.0  # generous: every wait below ends by an event long before this


def test_a_gate_needs_a_limit_of_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        InvocationGate(0)


def test_up_to_the_limit_run_at_once_and_the_next_waits_for_a_place() -> None:
    gate = InvocationGate(2)
    with gate.turn() as first, gate.turn() as second:
        assert first and second and gate.running == 2
        third_in = threading.Event()

        def third() -> None:
            with gate.turn() as admitted:
                assert admitted
                third_in.set()

        thread = threading.Thread(target=third)
        thread.start()
        wait_until(lambda: gate.waiting == 1, WAIT, "the third request to wait", interval=0.002)
        assert not third_in.is_set()
    thread.join(WAIT)
    assert third_in.is_set() and gate.running == 0 and gate.waiting == 0


def _arrival_order_round() -> list[int]:
    gate = InvocationGate(1)
    order: list[int] = []
    release = threading.Event()
    threads = []

    def request(index: int, hold: threading.Event | None = None) -> None:
        with gate.turn() as admitted:
            assert admitted
            order.append(index)
            if hold is not None:
                hold.wait(WAIT)

    holder = threading.Thread(target=request, args=(0, release))
    holder.start()
    wait_until(lambda: gate.running == 1, WAIT, "the first request to run", interval=0.002)
    for index in range(1, 6):
        thread = threading.Thread(target=request, args=(index,))
        thread.start()
        threads.append(thread)
        wait_until(lambda index=index: gate.waiting == index, WAIT, f"request {index} to wait", interval=0.002)
    release.set()
    # a request that arrives as the place is handed over goes to the back of the line
    late = threading.Thread(target=request, args=(6,))
    late.start()
    for thread in [holder, *threads, late]:
        thread.join(WAIT)
    assert gate.running == 0 and gate.waiting == 0
    return order


def test_waiters_get_their_turn_in_arrival_order_and_a_newcomer_does_not_jump_the_line() -> None:
    for _ in range(20):  # real threads, repeated
        assert _arrival_order_round() == [0, 1, 2, 3, 4, 5, 6]


def test_a_request_that_waits_too_long_is_turned_away_and_holds_nothing() -> None:
    gate = InvocationGate(1, max_wait_seconds=0.05)
    with gate.turn() as first:
        assert first
        with gate.turn() as second:
            assert second is False
        assert gate.running == 1 and gate.waiting == 0
    assert gate.running == 0
    with gate.turn() as again:
        assert again  # the refused request left no place taken


def test_concurrent_requests_never_exceed_the_limit() -> None:
    gate = InvocationGate(3)
    lock = threading.Lock()
    inside = [0]
    most = [0]

    def request() -> None:
        for _ in range(50):
            with gate.turn() as admitted:
                assert admitted
                with lock:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.0005)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 4)
    assert most[0] == 3 and gate.running == 0 and gate.waiting == 0
