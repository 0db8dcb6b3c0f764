from __future__ import annotations

import pytest
from chalicelib.domain.liveness import OFFLINE, ONLINE, PENDING, STALE, derive

STALE_AFTER, OFFLINE_AFTER = 60, 300


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        (0, ONLINE),
        (STALE_AFTER - 1, ONLINE),
        (STALE_AFTER, STALE),
        (STALE_AFTER + 1, STALE),
        (OFFLINE_AFTER - 1, STALE),
        (OFFLINE_AFTER, OFFLINE),
        (OFFLINE_AFTER + 1, OFFLINE),
    ],
)
def test_liveness_at_and_around_each_threshold(age: int, expected: str) -> None:
    now = 1_000_000.0
    assert derive(now - age, now, STALE_AFTER, OFFLINE_AFTER) == expected


def test_liveness_without_any_heartbeat_is_pending() -> None:
    assert derive(None, 1_000_000.0, STALE_AFTER, OFFLINE_AFTER) == PENDING
