"""The sweep reads the late nodes through its index, not the fleet: checked on a few hundred nodes.

The nodes are written straight into the session stack's nodes table (as bench/sweep.py does at
larger sizes), with heartbeats far in the future so that, at the sweep's clock, only this test's
stale nodes among its own are late. Other tests' nodes are all late by then too; the assertions
hold whatever they are, and this test's nodes are deleted afterwards.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from types import ModuleType

from chalicelib import liveness, node_store, runtime, sweep

from tests.support import bench_scripts
from tests.support.snapshots import scan_table

FLEET = 300
STALE = 3


def _load_bench() -> ModuleType:
    return bench_scripts.load("sweep")


def test_sweep_reads_late_nodes_only_at_scale(stack, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bench = _load_bench()
    settings = dataclasses.replace(runtime.get().settings, mass_stale_fraction=1.0)  # never hold
    sweep_at = time.time() + 10_000
    # a prefix of our own; the shard (the last 8 hex digits) cycles evenly through the index partitions
    prefix = secrets.token_hex(4)
    node_ids = [f"node_{prefix}{index:024x}" for index in range(FLEET)]
    stale_ids, fresh_ids = set(node_ids[:STALE]), set(node_ids[STALE:])
    items = [
        bench.node_item(
            node_id,
            sweep_at - settings.stale_after_seconds - 5 if node_id in stale_ids else sweep_at - 5,
            settings.sweep_bucket_seconds,
            created_at=time.time(),
        )
        for node_id in node_ids
    ]
    table = stack.names["MODELFORGE_NODES_TABLE"]
    client = bench.dynamodb_client(stack.aws_endpoint_url)
    bench.put_nodes(client, table, items)
    try:
        returned: dict[str, list[str]] = {liveness.ONLINE: [], liveness.STALE: []}
        counted: list[int] = []
        late_nodes, count_in_state = node_store.late_nodes, node_store.count_in_state

        def recording_late_nodes(state: str, cutoff: float, shards: int) -> list[str]:
            found = late_nodes(state, cutoff, shards)
            returned[state].extend(found)
            return found

        def recording_count(state: str, shards: int) -> int:
            counted.append(count_in_state(state, shards))
            return counted[-1]

        monkeypatch.setattr(sweep.node_store, "late_nodes", recording_late_nodes)
        monkeypatch.setattr(sweep.node_store, "count_in_state", recording_count)
        report = sweep.run(settings, sweep_at)
        monkeypatch.undo()

        everything = scan_table(stack.aws_endpoint_url, table)
        ours = {item["node_id"]["S"]: item for item in everything if item["node_id"]["S"] in stale_ids | fresh_ids}
        candidates = returned[liveness.ONLINE] + returned[liveness.STALE]

        assert not report.held
        # the index gave the sweep exactly our stale nodes among ours, and none of our fresh ones
        assert set(returned[liveness.ONLINE]) & (stale_ids | fresh_ids) == stale_ids
        assert not set(candidates) & fresh_ids
        # what the report says it read is what the index returned, plus the guard's count if it ran
        assert report.stale_candidates == len(returned[liveness.ONLINE])
        assert report.offline_candidates == len(returned[liveness.STALE])
        guard_ran = report.stale_candidates >= sweep.MASS_STALE_MIN_NODES
        # the guard reads the online counter (one item); a full count only repairs a bad counter
        assert len(counted) <= (1 if guard_ran else 0)
        assert report.items_read == len(candidates) + (1 + sum(counted) if guard_ran else 0)
        # late nodes only: fewer than the table holds (it holds at least our fresh nodes besides)
        assert len(candidates) < len(everything)
        # exactly our stale nodes moved, into their new index partition; our fresh nodes did not
        assert len(ours) == FLEET
        for node_id in stale_ids:
            assert ours[node_id]["liveness"]["S"] == liveness.STALE
            assert ours[node_id]["liveness_shard"]["S"] == liveness.index_partition(liveness.STALE, node_id)
        for node_id in fresh_ids:
            assert ours[node_id]["liveness"]["S"] == liveness.ONLINE
            assert ours[node_id]["liveness_shard"]["S"] == liveness.index_partition(liveness.ONLINE, node_id)
    finally:
        # heartbeats far in the future would keep our nodes online for every later sweep
        bench.delete_nodes(client, table, node_ids)
        client.close()
