"""The sweep finds the late nodes through its index and the nodes' last heartbeats, and writes only
those: checked on a few hundred nodes by counting the emulator's requests. Steady heartbeats do not
move a node's index entry (one write unit each), so every node online since before the cutoff is
named by the index and its last heartbeat read (BatchGetItem, 100 a call); no Scan, no write for an
on-time node.

The nodes are written straight into the session stack's nodes table (modelforge_bench.node_items,
as bench/sweep.py does at larger sizes), and the sweep runs on a clock far in the past, so that only
this test's stale nodes are late at it (every other node of the session heartbeated later). This
test's nodes are deleted afterwards, and the online-node counter, which they were never counted in,
is repaired.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time

from chalicelib import instance
from chalicelib.domain import liveness
from chalicelib.services import sweep
from chalicelib.stores import node_store, work_store
from modelforge_bench import node_items
from modelforge_local_stack.emulator import operations_delta

from tests.support.snapshots import scan_table
from tests.support.stores import online_nodes, stores

FLEET = 300
STALE = 3


def _app_operations(stack) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {name: count for name, count in stack.aws_operations().items() if not name.startswith("poller:")}


def test_sweep_reads_the_named_nodes_in_batches_and_moves_only_the_late_ones_at_scale(counted_stack) -> None:  # type: ignore[no-untyped-def]
    stack = counted_stack
    settings = dataclasses.replace(instance.get().settings, mass_stale_fraction=1.0)  # never hold
    sweep_at = time.time() - 10_000_000  # older than any other test's clock
    # a prefix of our own; the shard (the last 8 hex digits) cycles evenly through the index partitions
    prefix = secrets.token_hex(4)
    node_ids = [f"node_{prefix}{index:024x}" for index in range(FLEET)]
    stale_ids, fresh_ids = set(node_ids[:STALE]), set(node_ids[STALE:])
    items = [
        node_items.node_item(
            node_id,
            sweep_at - settings.stale_after_seconds - 5 if node_id in stale_ids else sweep_at - 5,
            settings.sweep_bucket_seconds,
            # online since an hour before the sweep: steady heartbeats since left the entry there
            created_at=sweep_at - 3600,
        )
        for node_id in node_ids
    ]
    table = stack.names["MODELFORGE_NODES_TABLE"]
    client = node_items.dynamodb_client(stack.aws_endpoint_url)
    node_items.put_nodes(client, table, items)
    try:
        stack.drain_state_log()  # nothing of earlier tests is shipped inside the count
        before = _app_operations(stack)
        report = sweep.run(stores(), settings, sweep_at)
        stack.drain_state_log()  # waits for a background poll in flight, then ships the sweep's events
        delta = operations_delta(before, _app_operations(stack))
        shipped = delta.pop("S3:PUT", 0)

        # one keys-only index query per state and shard, one query of expired work leases per lease
        # shard, the hold item, the last heartbeat of every node the index named (100 a call), one
        # transaction per transition; no Scan, no count: the fresh nodes cost an eventually
        # consistent read each
        # (work leases that other tests left to expire are taken back in the same sweep: one
        # transaction each)
        expected = {
            "Query": 2 * node_store.SHARDS + work_store.LEASE_SHARDS,
            "GetItem": 1,
            "BatchGetItem": math.ceil(FLEET / 100),
            "TransactWriteItems": STALE + report.leases_expired,
        }
        assert delta == expected
        assert shipped == STALE  # one state-log object per transition (the state-log function's writes)
        assert dataclasses.astuple(report)[:6] == (STALE, STALE, 0, STALE, 0, False) and report.leases_released == 0

        everything = scan_table(stack.aws_endpoint_url, table)
        ours = {item["node_id"]["S"]: item for item in everything if item["node_id"]["S"] in stale_ids | fresh_ids}
        # exactly our stale nodes moved, into their new index partition; our fresh nodes did not
        assert len(ours) == FLEET
        for node_id in stale_ids:
            assert ours[node_id]["liveness"]["S"] == liveness.STALE
            assert ours[node_id]["liveness_shard"]["S"] == node_store.index_partition(liveness.STALE, node_id)
        for node_id in fresh_ids:
            assert ours[node_id]["liveness"]["S"] == liveness.ONLINE
            assert ours[node_id]["liveness_shard"]["S"] == node_store.index_partition(liveness.ONLINE, node_id)
    finally:
        # our nodes would be late for every later sweep
        node_items.delete_nodes(client, table, node_ids)
        client.close()
        # the transitions took our never-counted nodes off the counter: count the index again
        sweep.repair_online_counter(stores(), time.time())
    assert stores().nodes.count_in_state(liveness.ONLINE) == online_nodes()
