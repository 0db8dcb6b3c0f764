from __future__ import annotations

from modelforge_protocol.backoff import Backoff, jittered


def test_backoff_doubles_from_one_to_sixteen_seconds_and_stays_capped() -> None:
    backoff = Backoff(jitter=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(7)] == [1, 2, 4, 8, 16, 16, 16]


def test_backoff_resets_after_a_success() -> None:
    backoff = Backoff()
    backoff.next_delay()
    backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1


def test_backoff_jitter_stays_between_eighty_percent_and_the_step() -> None:
    assert Backoff(jitter=lambda: 0.0).jittered(16) == 16 * 0.8
    assert Backoff(jitter=lambda: 1.0).jittered(16) == 16


def test_jittered_never_exceeds_the_cap() -> None:
    assert jittered(32, lambda: 1.0) == 16
