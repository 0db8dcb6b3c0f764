"""bench/partition_load.py: the counting simulation of DynamoDB partition load (counts, not timings).

No server: the real store code against a recording client. Here, not in tests/unit, because one
simulated second at 2,000 submits/s is 8,000 requests through PynamoDB (about 10-30 s)."""

from __future__ import annotations

import pytest
from modelforge_bench import partition_sim as partition_load


@pytest.fixture(scope="module")
def fleet() -> partition_load.Recorder:
    """10,000 nodes and 2,000 submits/s of one capability, one simulated second."""
    recorder, _ = partition_load.simulate(seconds=1, submits_per_second=2000, nodes=10_000)
    return recorder


def test_partition_load_every_table_and_index_stays_under_half_the_partition_limits(
    fleet: partition_load.Recorder,
) -> None:
    found = partition_load.rows(fleet)
    assert {where.replace("sim-", "") for where, *_ in found} >= {
        "work",
        "work/by_queue",
        "work/by_lease",
        "work/by_holder",
        "outbox",
        "nodes",
    }
    over = [(where, kind, key, value) for where, kind, key, value, limit in found if value > limit]
    assert over == []


def test_partition_load_every_work_request_went_through_the_store_code(fleet: partition_load.Recorder) -> None:
    requests = fleet.counts.requests
    # each submit, lease and complete is one transaction; each claim one node read and one queue read at least
    assert requests["TransactWriteItems"] == 3 * 2000
    assert requests["GetItem"] == 2000 and requests["Query"] >= 2000


def test_partition_load_the_queue_spreads_over_its_shards(fleet: partition_load.Recorder) -> None:
    queue_keys = {key for (where, key) in fleet.counts.writes if where.endswith("/by_queue")}
    assert len(queue_keys) == 16
    hottest = max(
        sum(seconds.values()) for (where, _), seconds in fleet.counts.writes.items() if where.endswith("/by_queue")
    )
    assert hottest <= 0.5 * partition_load.PARTITION_WRITE_UNITS


def test_partition_load_an_unsharded_queue_would_be_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation can see a hot key: one queue partition per capability is over the limit."""
    from chalicelib.stores import work_store

    monkeypatch.setattr(work_store, "QUEUE_SHARDS", 1)
    recorder, _ = partition_load.simulate(seconds=1, submits_per_second=600, nodes=100)
    over = [where for where, _, _, value, limit in partition_load.rows(recorder) if value > limit]
    assert any(where.endswith("/by_queue") for where in over)
