#!/usr/bin/env python
"""Scale on paper: DynamoDB load per partition key at 10,000 nodes and 2,000 submits/s.

Run from the repository root:

    .venv/bin/python bench/partition_load.py [--seconds 2] [--submits-per-second 2000] [--nodes 10000]

A counting simulation, not the emulator: every work request of the simulated seconds goes through
the control plane's real DynamoDB store code (stores/work_store.py, stores/node_store.py: the
PynamoDB models, keys, shards and transactions they build) against a recording client that stands
in for DynamoDB (``Recorder``: PynamoDB's one call into botocore is replaced). The recorder keeps
the items it is sent, answers GetItem and Query from them (conditions are not evaluated: no
claim is lost here) and counts, per table or index and per partition key and second, the write
units and read units each request costs as DynamoDB prices them (an item of at most 1 KB: 1 write
unit, 2 in a transaction; a read of at most 4 KB: 1 unit strongly consistent, 0.5 eventually; a
global secondary index: 1 write unit in each partition an item enters or leaves).

Per simulated second: ``--submits-per-second`` submits of one capability (``create``), as many
claims (a node read, the queue's front, a lease) and as many completes. What it does not drive
through the store code it adds as stated inputs, each on its own partition key (docs/SCALE.md):
the node's heartbeat (one UpdateItem of its own item per interval, with the channel ticket's hash
inside it), park (one write when a node becomes idle) and wake (at most 2 conditional writes per
item), all per issue 19's design. It prints the hottest partition keys of every table and index
against half of DynamoDB's per-partition limits, and exits non-zero when one is over.
"""

from __future__ import annotations

import argparse
import math
import sys

from modelforge_bench.partition_sim import (
    API_GATEWAY_NEW_CONNECTIONS_PER_SECOND,
    LAMBDA_DEFAULT_CONCURRENCY,
    PARTITION_READ_UNITS,
    PARTITION_WRITE_UNITS,
    rows,
    simulate,
)

MAX_SECONDS, MAX_SUBMITS, MAX_NODES = 10, 5000, 100_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=2, help=f"simulated seconds (1..{MAX_SECONDS})")
    parser.add_argument("--submits-per-second", type=int, default=2000, help=f"1..{MAX_SUBMITS}")
    parser.add_argument("--nodes", type=int, default=10_000, help=f"1..{MAX_NODES}")
    args = parser.parse_args(argv)
    if not 1 <= args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be from 1 to {MAX_SECONDS}")
    if not 1 <= args.submits_per_second <= MAX_SUBMITS:
        parser.error(f"--submits-per-second must be from 1 to {MAX_SUBMITS}")
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes must be from 1 to {MAX_NODES}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    recorder, wall = simulate(args.seconds, args.submits_per_second, args.nodes)
    print(
        f"Partition load: {args.nodes} nodes, {args.submits_per_second} submits/s of one capability,"
        f" {args.seconds} simulated s ({wall:.1f} s to simulate)"
    )
    print(f"requests sent to the recorder: {dict(sorted(recorder.counts.requests.items()))}")
    header = f"{'table / index':<34} {'kind':<5} | {'hottest partition key':<40} | {'units/s':>8} {'limit':>6} | ok"
    print(header)
    print("-" * len(header))
    over = []
    for where, kind, key, value, limit in rows(recorder):
        ok = value <= limit
        if not ok:
            over.append(where)
        short = where.replace("sim-", "")
        print(f"{short:<34} {kind:<5} | {key[:40]:<40} | {value:>8.1f} {limit:>6.0f} | {'yes' if ok else 'OVER'}")
    print("-" * len(header))
    print(
        f"limit: half of DynamoDB's per-partition {PARTITION_WRITE_UNITS} write units/s and {PARTITION_READ_UNITS}"
        " read units/s.\nLimits that bind first: API Gateway accepts"
        f" {API_GATEWAY_NEW_CONNECTIONS_PER_SECOND} new WebSocket connections/s per account and region"
        f" ({args.nodes} nodes reconnecting after a deploy take"
        f" {math.ceil(args.nodes / API_GATEWAY_NEW_CONNECTIONS_PER_SECOND)} s"
        f" at best); Lambda's default concurrency is {LAMBDA_DEFAULT_CONCURRENCY} per account and region."
    )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
