#!/usr/bin/env python
"""Claim benchmark: how fast nodes claim work, what one claim costs, and whether any item goes twice.

Run from the repository root:

    .venv/bin/python bench/claims.py [--nodes 1 10 50 100] [--items-per-claimer 20] [--min-level-items 200]
        [--ship-state-log during|after] [--emulator own-process|in-process] [--max-invocations 8]
        [--raw-seconds 3]

It starts a fresh control plane in this process (``LocalStack``: the Chalice app over HTTP on a
moto emulator, all on 127.0.0.1; the emulator in a process of its own, as ``modelforge local up``
runs it, unless ``--emulator in-process``) and a load generator in a process of its own
(``modelforge_bench.claim_load``), so that the claimers' HTTP clients do not share an interpreter
with the server they measure. The load generator enrolls as many simulated nodes as the largest
``--nodes`` level through the HTTP API, each serving ``diagnostic.echo`` with its own
requests.Session, and for each level:

1. a fresh queue: the work table holds nothing of earlier levels (their finished items are
   deleted from the emulator), then ``--items-per-claimer`` echo items per claimer (at least
   ``--min-level-items``, 200 by default, in a level) are submitted and the level's nodes
   heartbeat (untimed); before the first level one untimed claim warms the claim route up (its
   imports happen on first use);
2. timed: the level's nodes are released together, each claiming in a loop until every item is
   claimed (claims only: the items stay leased, so the emulator's counters hold nothing but
   claims). It prints claims per second and its ratio to the 1-claimer rate, p50/p99/max
   client-side claim latency, the mean latency next to claimers / claim requests per second
   (Little's law: when they match, the latency is queueing), the 204 answers a node got while
   items were still queued (lost races), and the AWS requests per claimed item by operation (the
   emulator's counters, the local stream poller's traffic left out);
3. untimed: each holder uploads a result and completes its items, and every item must end
   ``succeeded``.

Each claim's ``work.leased`` event goes to the state log: the local stream poller ships it to S3
through the same emulator, from the same interpreter, as the claims. ``--ship-state-log during``
(the default) keeps the poller running in the timed phase, as ``modelforge local up`` does;
``after`` ships only between phases, as on AWS, where a function of its own ships the state log and
takes nothing from the claim path. Either way every event is shipped and counted.

Right after the 1-claimer level (or after the last level, without one), so that the 1-claimer
rate and its yardsticks are measured in the same minute of a machine whose speed drifts, it
measures from the load generator's process (where the claims come from) the emulator's raw
conditional-write rate with boto3 on scratch tables, 1 and 10 threads: a conditional UpdateItem,
a TransactWriteItems shaped like a claim's when issue 19 was written (conditional Update +
ConditionCheck + conditional Put), and the claim's own TransactWriteItems as the app sends it today
(``claim_load.claim_transaction``); and prints the 1-claimer claim rate as a ratio of the highest
rate of each transaction. The targets of issue 19 are printed with a verdict each (they are figures, not
checks: a loaded machine misses them). It exits non-zero, with a message on stderr, on a
correctness failure: an item claimed twice (a double claim), an item never claimed or not
``succeeded`` at the end, or an answer that is not 200/204 to a claim or 200 to a complete.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.claim_load import (
    CLAIM_SHAPED,
    CLAIM_TRANSACTION,
    RAW_THREADS,
    REGION,
    STALE_AFTER_SECONDS,
    Claimed,
    Generator,
    RawRun,
)
from modelforge_bench.support import LOOPBACK, BenchFailure
from modelforge_local_stack.connection_limits import DEFAULT_MAX_CONNECTIONS
from modelforge_local_stack.invocation_gate import DEFAULT_MAX_INVOCATIONS

#: Bounds on the options, so a run stays bounded in count and time.
MAX_LEVELS = 4
MAX_NODES = 100
MAX_ITEMS_PER_CLAIMER = 100
MAX_RAW_SECONDS = 30
#: `local up`'s default --max-connections: every connection in the app at once, as before the line
MAX_INVOCATIONS = DEFAULT_MAX_CONNECTIONS
#: The fewest items a level claims by default: a 1-claimer level of 20 items is over in half a
#: second, and its rate (the others' yardstick) would be a handful of requests.
MIN_LEVEL_ITEMS = 200
MAX_LEVEL_ITEMS = MAX_NODES * MAX_ITEMS_PER_CLAIMER
#: The liveness thresholds the stack runs with: long enough that no node goes stale in a long
#: level (a heartbeat in the timed phase would add its UpdateItem to the claims' counts).
OFFLINE_AFTER_SECONDS = 2 * STALE_AFTER_SECONDS
#: Issue 19's targets, printed with a verdict: the rate at 10+ claimers against the 1-claimer
#: rate; at 50+ claimers, transactions per claimed item and the slowest claim request; the
#: 1-claimer rate against the emulator's raw claim-shaped transaction rate.
#: The stream poller's interval with ``--ship-state-log after``: longer than any run, so that only
#: the bench's own drains ship events.
STREAM_INTERVAL_AFTER = 24 * 3600.0
TARGET_SCALING = 0.8
TARGET_TRANSACTIONS = 1.3
TARGET_MAX_SECONDS = 10.0
TARGET_RAW_RATIO = 0.25


@dataclass
class LevelResult:
    nodes: int
    items: int
    claims: list[Claimed]
    latencies_ms: list[float]
    elapsed: float
    empty_while_queued: int
    operations: dict[str, int]
    problems: list[str] = field(default_factory=list)
    double_claims: list[str] = field(default_factory=list)
    not_succeeded: dict[str, str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return len(self.claims) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def requests_rate(self) -> float:
        return len(self.latencies_ms) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def mean_ms(self) -> float:
        return sum(self.latencies_ms) / len(self.latencies_ms) if self.latencies_ms else 0.0

    @property
    def little_ms(self) -> float:
        """Little's law: the mean time in the system that ``nodes`` claimers at this request rate imply."""
        return 1000 * self.nodes / self.requests_rate if self.requests_rate > 0 else math.inf

    def per_claim(self, operation: str) -> float:
        return self.operations.get(operation, 0) / max(1, len(self.claims))

    @property
    def dynamodb_per_claim(self) -> dict[str, float]:
        count = max(1, len(self.claims))
        return {name: value / count for name, value in self.operations.items() if not name.startswith("S3:")}

    @property
    def s3_per_claim(self) -> float:
        return sum(value for name, value in self.operations.items() if name.startswith("S3:")) / max(
            1, len(self.claims)
        )

    @property
    def ok(self) -> bool:
        return not (self.problems or self.double_claims or self.not_succeeded)


def fresh_queue(stack: Any, finished: set[str]) -> None:
    """Delete the earlier levels' finished items from the work table (see the module docstring)."""
    if not finished:
        return
    client = _support.emulator_dynamodb(stack.aws_endpoint_url, REGION, 60)
    try:
        for work_id in sorted(finished):
            client.delete_item(TableName=stack.names["MODELFORGE_WORK_TABLE"], Key={"work_id": {"S": work_id}})
    finally:
        client.close()


def run_level(stack: Any, load: Generator, nodes: int, items: int) -> LevelResult:
    from chalicelib import instance
    from modelforge_local_stack.emulator import operations_delta

    print(f"\n{nodes} concurrent node(s), {items} items", flush=True)
    began = time.perf_counter()
    submitted: set[str] = load.call("submit", items, f"level-{nodes}-{secrets.token_hex(3)}")
    load.call("heartbeat", nodes)
    stack.drain_state_log()
    print(f"  submitted {items} items and heartbeated the nodes in {time.perf_counter() - began:.1f} s", flush=True)

    before = _support.app_operations(stack.aws_operations())
    phase = load.call("claim", nodes, items)
    stack.drain_state_log()  # the claims' state-log events are shipped (S3) and counted now
    delta = operations_delta(before, _support.app_operations(stack.aws_operations()))
    print(f"  claimed {len(phase.claims)} items in {phase.elapsed:.2f} s", flush=True)

    problems = list(phase.problems)
    counts = collections.Counter(claim.work_id for claim in phase.claims)
    double = sorted(work_id for work_id, count in counts.items() if count > 1)
    foreign = sorted(set(counts) - submitted)
    if foreign:
        problems.append(f"{len(foreign)} claimed items were not submitted by this level")

    began = time.perf_counter()
    # complete each item once, by its first holder (a double claim is reported, not completed twice)
    first = {claim.work_id: claim for claim in reversed(phase.claims)}
    problems += load.call("complete", list(first.values()), stack.api_url)
    final = {work_id: instance.work_status(work_id) or "missing" for work_id in sorted(submitted)}
    print(f"  completed them and read every item back in {time.perf_counter() - began:.1f} s", flush=True)
    result = LevelResult(
        nodes=nodes,
        items=items,
        claims=phase.claims,
        latencies_ms=phase.latencies_ms,
        elapsed=phase.elapsed,
        empty_while_queued=phase.empty_while_queued,
        operations=delta,
        problems=problems,
        double_claims=double,
        not_succeeded={work_id: status for work_id, status in final.items() if status != "succeeded"},
    )
    print(
        f"  {result.rate:.1f} claims/s; claim latency p50/p99/max {_latency(result.latencies_ms).split()} ms;"
        f" TransactWriteItems per claim {result.per_claim('TransactWriteItems'):.2f}",
        flush=True,
    )
    if result.ok:
        fresh_queue(stack, submitted)
    return result


# --- the benchmark --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=[1, 10, 50, 100],
        help=f"concurrent nodes of each level (1..{MAX_NODES}, at most {MAX_LEVELS} levels)",
    )
    parser.add_argument(
        "--items-per-claimer",
        type=int,
        default=20,
        help=f"items queued for each level, per claimer of the level (1..{MAX_ITEMS_PER_CLAIMER})",
    )
    parser.add_argument(
        "--min-level-items",
        type=int,
        default=MIN_LEVEL_ITEMS,
        help=f"the fewest items of a level, whatever its claimers (1..{MAX_LEVEL_ITEMS}; default {MIN_LEVEL_ITEMS})",
    )
    parser.add_argument(
        "--emulator",
        choices=("own-process", "in-process"),
        default="own-process",
        help=(
            "where the embedded emulator runs: in a process of its own, as `modelforge local up` runs"
            " it (default), or in the stack's process beside the API (as before; for a side-by-side run)"
        ),
    )
    parser.add_argument(
        "--max-invocations",
        type=int,
        default=DEFAULT_MAX_INVOCATIONS,
        help=(
            f"requests the stack's app runs at once, the others in line, as `modelforge local up`"
            f" --max-invocations (1..{MAX_INVOCATIONS}; default {DEFAULT_MAX_INVOCATIONS};"
            f" {MAX_INVOCATIONS}: every connection at once, as before the line, for a side-by-side run)"
        ),
    )
    parser.add_argument(
        "--ship-state-log",
        choices=("during", "after"),
        default="during",
        help=(
            "when the local stream poller ships the claims' state-log events to S3: during the timed"
            " phase, as `modelforge local up` does (default), or only after it, as on AWS, where a"
            " function of its own ships them and takes nothing from the claim path"
        ),
    )
    parser.add_argument(
        "--raw-seconds",
        type=float,
        default=3,
        help=f"duration of each raw conditional-write phase, 6 in all (1..{MAX_RAW_SECONDS})",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.max_invocations <= MAX_INVOCATIONS:
        parser.error(f"--max-invocations takes 1 to {MAX_INVOCATIONS}")
    if not 1 <= len(args.nodes) <= MAX_LEVELS:
        parser.error(f"--nodes takes 1 to {MAX_LEVELS} levels")
    if any(not 1 <= count <= MAX_NODES for count in args.nodes):
        parser.error(f"each --nodes level must be from 1 to {MAX_NODES}")
    if not 1 <= args.items_per_claimer <= MAX_ITEMS_PER_CLAIMER:
        parser.error(f"--items-per-claimer must be from 1 to {MAX_ITEMS_PER_CLAIMER}")
    if not 1 <= args.min_level_items <= MAX_LEVEL_ITEMS:
        parser.error(f"--min-level-items must be from 1 to {MAX_LEVEL_ITEMS}")
    if not 1 <= args.raw_seconds <= MAX_RAW_SECONDS:
        parser.error(f"--raw-seconds must be from 1 to {MAX_RAW_SECONDS}")
    return args


def _latency(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7}"
    return f"{_support.percentile(values, 50):7.1f} {_support.percentile(values, 99):7.1f} {max(values):7.0f}"


def _single_rate(levels: list[LevelResult]) -> float | None:
    return next((level.rate for level in levels if level.nodes == 1), None)


#: The raw transactions the 1-claimer rate is compared with, and what the figures call their rates:
#: the claim's shape when issue 19 was written (an Update, a ConditionCheck, a Put), and the claim's
#: own transaction today (the node's slot count became an Update, and the event carries the write's
#: changes).
RAW_YARDSTICKS = (
    (CLAIM_SHAPED, "raw claim-shaped rate"),
    (CLAIM_TRANSACTION, "raw rate of the claim's own transaction"),
)


def _raw_rate(raw: list[RawRun], what: str) -> float:
    return max((run.rate for run in raw if run.what == what), default=0.0)


def print_tables(levels: list[LevelResult], raw: list[RawRun]) -> None:
    single = _single_rate(levels)
    print("\nClaims over HTTP (client-side latency of every claim request, 204s included)")
    header = (
        f"{'nodes':>5} {'items':>5} | {'claims/s':>8} {'x 1':>5} | {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"
        f" | {'mean ms':>7} {'N/X ms':>7} | {'lost races':>10} | DynamoDB requests per claim | {'S3':>4} | check"
    )
    print(header)
    print("-" * len(header))
    for level in levels:
        check = "ok" if level.ok else ("DOUBLE CLAIM" if level.double_claims else "WRONG")
        ratio = f"{level.rate / single:5.2f}" if single else f"{'-':>5}"
        print(
            f"{level.nodes:>5} {level.items:>5} | {level.rate:>8.1f} {ratio} | {_latency(level.latencies_ms)}"
            f" | {level.mean_ms:7.1f} {level.little_ms:7.1f} | {level.empty_while_queued:>10} |"
            f" {_support.format_ops(level.dynamodb_per_claim):<27} | {level.s3_per_claim:>4.2f} | {check}"
        )
    print("-" * len(header))
    print(
        "claims/s: items claimed / the timed phase (claims only; no upload or complete in it); x 1: that\n"
        "rate / the 1-claimer level's. mean ms next to N/X ms: the mean claim request latency, and\n"
        "claimers / claim requests per second (Little's law): equal when the latency is waiting in line.\n"
        "lost races: 204 answers while items of the level were still unclaimed. DynamoDB requests per\n"
        "claim: every AWS request the app made in the timed phase / items claimed (failed transactions of\n"
        "lost races included, and each node's last, empty claim: one GetItem and a Query of every queue\n"
        "shard per node); S3: the state-log objects the claims' events became."
    )
    print("\nThe emulator's raw conditional writes (boto3 from the load generator's process, scratch tables)")
    print(f"{'write':<35} {'threads':>7} | {'writes/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} | {'calls':>6}")
    for run in raw:
        print(f"{run.what:<35} {run.threads:>7} | {run.rate:>8.1f} {_latency(run.latencies_ms)} | {run.calls:>6}")
    for what, label in RAW_YARDSTICKS:
        raw_rate = _raw_rate(raw, what)
        if single and raw_rate:
            print(f"1-claimer claims/s / the highest {label}: {single:.1f} / {raw_rate:.1f} = {single / raw_rate:.2f}")


def targets(levels: list[LevelResult], raw: list[RawRun]) -> list[tuple[str, bool]]:
    """Issue 19's targets that this run measured: (what, met)."""
    found: list[tuple[str, bool]] = []
    single = _single_rate(levels)
    for level in levels:
        if level.nodes >= 10 and single:
            ratio = level.rate / single
            found.append(
                (
                    f"{level.nodes} claimers: {ratio:.2f} x the 1-claimer rate >= {TARGET_SCALING}",
                    ratio >= TARGET_SCALING,
                )
            )
        if level.nodes >= 50:
            transactions = level.per_claim("TransactWriteItems")
            found.append(
                (
                    f"{level.nodes} claimers: {transactions:.2f} TransactWriteItems per claim <= {TARGET_TRANSACTIONS}",
                    transactions <= TARGET_TRANSACTIONS,
                )
            )
            slowest = max(level.latencies_ms, default=0.0) / 1000
            found.append(
                (
                    f"{level.nodes} claimers: slowest claim {slowest:.1f} s <= {TARGET_MAX_SECONDS:g} s",
                    slowest <= TARGET_MAX_SECONDS,
                )
            )
    for what, label in RAW_YARDSTICKS:
        raw_rate = _raw_rate(raw, what)
        if single and raw_rate:
            ratio = single / raw_rate
            found.append((f"1 claimer: {ratio:.2f} x the {label} >= {TARGET_RAW_RATIO}", ratio >= TARGET_RAW_RATIO))
    return found


def _measure_raw(stack: Any, load: Generator, seconds: float) -> list[RawRun]:
    began = time.perf_counter()
    raw: list[RawRun] = load.call("raw", stack.aws_endpoint_url, dict(stack.names), seconds)
    print(f"\nraw conditional writes measured in {time.perf_counter() - began:.1f} s", flush=True)
    return raw


def _pool_for_claimers(claimers: int, folder: str) -> None:
    """Let the in-process control plane hold a connection to the emulator per concurrent request.

    On Lambda an instance serves one request at a time, so PynamoDB's default pool of 10
    connections is never short; the local stack serves every node from one process, and with
    more concurrent requests than pooled connections each extra request opens (and the emulator
    serves on a new thread) a connection of its own. Read by PynamoDB at import (PYNAMODB_CONFIG)."""
    path = os.path.join(folder, "pynamodb_settings.py")
    with open(path, "w", encoding="utf-8") as file:
        file.write(f"max_pool_connections = {max(10, 2 * claimers)}\n")
    os.environ["PYNAMODB_CONFIG"] = path


def run(args: argparse.Namespace) -> int:
    _support.prepare_stack_environment("WARNING", keep_thresholds=False)
    settings_dir = tempfile.mkdtemp(prefix="bench-claims-")
    _pool_for_claimers(max(args.nodes), settings_dir)
    os.environ["MODELFORGE_NODE_STALE_AFTER_SECONDS"] = str(STALE_AFTER_SECONDS)
    os.environ["MODELFORGE_NODE_OFFLINE_AFTER_SECONDS"] = str(OFFLINE_AFTER_SECONDS)
    from modelforge_local_stack.local_stack import LocalOptions, LocalStack

    wall_started = time.perf_counter()
    print(
        f"ModelForge claim benchmark: {', '.join(map(str, args.nodes))} concurrent node(s),"
        f" {args.items_per_claimer} items per claimer (at least {args.min_level_items} per level);"
        f" raw conditional writes {args.raw_seconds:g} s x {3 * len(RAW_THREADS)};"
        f" state log shipped {args.ship_state_log} the timed phases; emulator in {args.emulator.replace('-', ' ')}"
    )
    # a fresh prefix: moto's backend outlives a stack in this process, tables included
    prefix = f"bench-claims-{secrets.token_hex(3)}"
    # "after": the poller never runs on its own; the bench drains it between phases (run_level)
    stream_interval = STREAM_INTERVAL_AFTER if args.ship_state_log == "after" else LocalOptions.stream_interval_seconds
    stack = LocalStack(
        LocalOptions(
            host=LOOPBACK,
            port=0,
            sweep_interval_seconds=3600,
            stream_interval_seconds=stream_interval,
            resource_prefix=prefix,
            emulator_process=args.emulator == "own-process",
            max_invocations=args.max_invocations,
        )
    )
    load: Generator | None = None
    try:
        stack.start()
        if stack.emulator is None:
            raise BenchFailure("the local stack has no embedded emulator, so AWS calls cannot be counted")
        _support.require_loopback(stack.api_url, "the API server")
        _support.require_loopback(stack.aws_endpoint_url, "the AWS emulator")
        load = Generator()
        print(
            f"local stack: API {stack.api_url} (the app runs {args.max_invocations} requests at once),"
            f" emulator {stack.aws_endpoint_url}; load generator pid {load.pid}"
        )
        began = time.perf_counter()
        enrolled = load.call("enroll", stack.api_url, max(args.nodes))
        print(f"enrolled {enrolled} nodes in {time.perf_counter() - began:.1f} s", flush=True)
        load.call("warm")
        levels: list[LevelResult] = []
        raw: list[RawRun] = []
        for count in args.nodes:
            levels.append(run_level(stack, load, count, max(args.min_level_items, count * args.items_per_claimer)))
            if count == 1 and not raw:  # the yardstick of the 1-claimer rate, measured the same minute
                raw = _measure_raw(stack, load, args.raw_seconds)
        if not raw:
            raw = _measure_raw(stack, load, args.raw_seconds)
    finally:
        if load is not None:
            load.stop()
        stack.stop()
        shutil.rmtree(settings_dir, ignore_errors=True)
    print_tables(levels, raw)
    found = targets(levels, raw)
    if found:
        print("\nIssue 19's targets (figures of this run on this machine)")
        for what, met in found:
            print(f"  {'met   ' if met else 'MISSED'} {what}")
    print(f"\ntotal wall time {time.perf_counter() - wall_started:.1f} s")
    failed = False
    for level in levels:
        if level.double_claims:
            failed = True
            print(
                f"bench/claims.py: FAILED: DOUBLE CLAIM with {level.nodes} nodes: {len(level.double_claims)} item(s)"
                f" answered 200 to more than one claim, e.g. {level.double_claims[0]}",
                file=sys.stderr,
            )
        if level.not_succeeded:
            failed = True
            example = next(iter(level.not_succeeded.items()))
            print(
                f"bench/claims.py: FAILED: with {level.nodes} nodes {len(level.not_succeeded)} item(s) did not end"
                f" succeeded, e.g. {example}",
                file=sys.stderr,
            )
        for problem in level.problems[:5]:
            failed = True
            print(f"bench/claims.py: FAILED: with {level.nodes} nodes: {problem}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("claims.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
