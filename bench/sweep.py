#!/usr/bin/env python
"""Sweep benchmark: what the liveness sweep reads in a large fleet, next to a full table scan.

Run from the repository root:

    .venv/bin/python bench/sweep.py [--nodes 1000 10000] [--stale-percent 1]

For each fleet size it starts a fresh control plane in this process (``LocalStack``: the
Chalice app on a moto emulator, all on 127.0.0.1), writes that many online node items straight
into the nodes table (boto3 ``BatchWriteItem`` against the emulator, 25 items a call, no API
calls), ``--stale-percent`` of them last heard from ``stale_after + 5`` s ago and the rest 5 s
ago, then runs the deployed sweep (``chalicelib.instance.run_sweep``) once and prints:

- what the sweep read: the index entries of the nodes online since before the cutoff (steady
  heartbeats leave a node's entry where its transition to online put it, an hour before the sweep
  here, so that is every node), the node items it read to get their last heartbeats (BatchGetItem,
  eventually consistent, billed by the whole item), the late nodes ``late_nodes`` kept
  (``SweepReport.items_read`` adds the online-node counter the mass-outage guard reads when at least
  10 nodes are late), what it transitioned, and its wall time (index reads and guarded writes apart);
- for comparison, one real paginated ``Scan`` of the nodes table: the items it reads (the
  whole fleet) and its wall time;
- bytes read by each, by DynamoDB's item-size rules.

It then checks by a scan that exactly the stale nodes moved to ``stale`` and every other node
is still ``online``, and exits non-zero, with a message on stderr, when that or anything else
fails. This is a benchmark, not a test: the times are those of one Python process sharing its
GIL between the emulator and the sweep.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.node_items import dynamodb_client, new_node_id, node_item, put_nodes
from modelforge_bench.support import LOOPBACK, BenchFailure

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Seconds of silence around the thresholds: fresh nodes heartbeated this long before the sweep,
#: stale ones ``stale_after`` plus this long before it.
MARGIN_SECONDS = 5
#: Bounds on the options, so a run stays bounded in count, memory and time.
MAX_NODES = 20_000
MAX_SIZES = 4
#: Stay below the mass-outage guard's default fraction (0.5), which would hold every transition.
MAX_STALE_PERCENT = 40.0


@dataclass
class ScanResult:
    items: list[dict[str, Any]]
    pages: int
    seconds: float


def full_scan(client: Any, table: str, **options: Any) -> ScanResult:
    """One paginated Scan of the whole table, as a sweep without the index would have to do."""
    began = time.perf_counter()
    items: list[dict[str, Any]] = []
    pages = 0
    for page in client.get_paginator("scan").paginate(TableName=table, **options):
        pages += 1
        items.extend(page["Items"])
    return ScanResult(items, pages, time.perf_counter() - began)


# --- DynamoDB item size (the rules bench/heartbeat.py documents and tests/unit checks) ------


_item_size_function: Callable[[dict[str, Any]], int] | None = None


def _item_size(item: dict[str, Any]) -> int:
    """``item_size`` from bench/heartbeat.py, loaded once."""
    global _item_size_function
    if _item_size_function is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "modelforge_bench_heartbeat", Path(__file__).with_name("heartbeat.py")
        )
        assert spec is not None and spec.loader is not None
        module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
        if spec.name not in sys.modules:
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        _item_size_function = module.item_size
    return _item_size_function(item)


def index_entry(item: dict[str, Any]) -> dict[str, Any]:
    """What the keys-only ``by_liveness`` index holds for a node: its keys and the table's."""
    return {name: item[name] for name in ("node_id", "liveness_shard", "heartbeat_bucket") if name in item}


# --- one fleet size ------------------------------------------------------------------------


@dataclass
class SizeResult:
    nodes: int
    stale: int
    insert_seconds: float
    insert_calls: int
    items_read: int
    late_read: int
    #: node items the store read to get the last heartbeats of the nodes the index named
    item_reads: int
    online_counted: int | None
    late_seconds: float
    count_seconds: float
    transitioned: int
    skipped: int
    held: bool
    sweep_seconds: float
    sweep_bytes: int
    scan_items: int
    scan_pages: int
    scan_seconds: float
    scan_bytes: int
    moved_ok: bool


class _Timed:
    """Wraps a function: how often it ran, its total seconds and what it returned."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.seconds = 0.0
        self.results: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            result = self.function(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - began
        self.results.append(result)
        return result


class _ItemReads:
    """Counts the node items the store's batch reads return while active (the sweep's reads of the
    last heartbeats of the nodes its index named)."""

    def __init__(self) -> None:
        self.node_ids: list[str] = []

    def __enter__(self) -> _ItemReads:
        from chalicelib.stores.models import NodeModel

        original = NodeModel.batch_get
        reads = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            for item in original(*args, **kwargs):
                reads.node_ids.append(item.node_id)
                yield item

        self._original = original
        NodeModel.batch_get = counted  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        from chalicelib.stores.models import NodeModel

        NodeModel.batch_get = self._original  # type: ignore[method-assign]


def _phase(label: str, began: float) -> None:
    print(f"  {label:<62} {time.perf_counter() - began:6.2f} s", flush=True)


def run_size(count: int, stale_percent: float) -> SizeResult:
    from modelforge_local_stack.local_stack import LocalOptions, LocalStack

    stale_count = round(count * stale_percent / 100)
    print(f"\n{count} nodes, {stale_count} of them stale ({stale_percent:g}%)", flush=True)
    # a fresh prefix per size: moto's backend outlives a stack in this process, tables included
    prefix = f"bench-sweep-{secrets.token_hex(3)}"
    stack = LocalStack(LocalOptions(host=LOOPBACK, port=0, sweep_interval_seconds=3600, resource_prefix=prefix))
    began = time.perf_counter()
    try:
        stack.start()
        _support.require_loopback(stack.aws_endpoint_url, "the AWS emulator")
        _support.require_loopback(stack.api_url, "the API server")
        from chalicelib import instance

        settings = instance.settings()
        stores = instance.stores()
        table = stack.names["MODELFORGE_NODES_TABLE"]
        if settings.names["nodes"] != table:
            raise BenchFailure(f"the control plane is bound to {settings.names['nodes']}, not this stack's {table}")
        _phase(f"start the local stack ({prefix})", began)

        began = time.perf_counter()
        now = time.time()
        node_ids = [new_node_id() for _ in range(count)]
        stale_ids = set(node_ids[:stale_count])  # the ids are random, so the first ones are as good as any
        stale_beat = now - settings.stale_after_seconds - MARGIN_SECONDS
        fresh_beat = now - MARGIN_SECONDS
        items = [
            node_item(
                node_id, stale_beat if node_id in stale_ids else fresh_beat, settings.sweep_bucket_seconds, now - 3600
            )
            for node_id in node_ids
        ]
        _phase(f"build {count} node items", began)

        client = dynamodb_client(stack.aws_endpoint_url)
        began = time.perf_counter()
        calls = put_nodes(client, table, items)
        # the nodes were written directly, not brought online by heartbeats: set the online-node
        # counter those heartbeats would have kept, as in a running fleet (a guarded, logged repair)
        instance.repair_online_counter(time.time())
        insert_seconds = time.perf_counter() - began
        _phase(f"insert them ({calls} BatchWriteItem calls, {count / insert_seconds:.0f} items/s)", began)

        began = time.perf_counter()
        scan = full_scan(client, table)
        _phase(f"full Scan of the nodes table ({len(scan.items)} items, {scan.pages} page(s))", began)
        if len(scan.items) != count:
            raise BenchFailure(f"the nodes table holds {len(scan.items)} items after inserting {count}")

        late_nodes = _Timed(stores.nodes.late_nodes)
        count_in_state = _Timed(stores.nodes.count_in_state)
        stores.nodes.late_nodes, stores.nodes.count_in_state = late_nodes, count_in_state  # type: ignore[method-assign]
        item_reads = _ItemReads()
        try:
            began = time.perf_counter()
            with item_reads:
                report = instance.run_sweep(now)
            sweep_seconds = time.perf_counter() - began
        finally:
            del stores.nodes.late_nodes, stores.nodes.count_in_state  # the store's own methods again
        _phase(f"sweep ({report.transitioned} transitions)", began)

        began = time.perf_counter()
        # only what the check needs: the emulator serialises whole items slowly
        after = full_scan(
            client,
            table,
            ConsistentRead=True,
            ProjectionExpression="node_id, liveness, liveness_shard",
        ).items
        by_state: dict[str, set[str]] = {}
        for item in after:
            by_state.setdefault(item["liveness"]["S"], set()).add(item["node_id"]["S"])
        moved_ok = (
            by_state.get("stale", set()) == stale_ids
            and by_state.get("online", set()) == set(node_ids) - stale_ids
            and set(by_state) <= {"online", "stale"}
            # and the moved nodes sit in the index partition of their new state
            and all(
                item["liveness_shard"]["S"] == instance.sweep_index_partition("stale", item["node_id"]["S"])
                for item in after
                if item["liveness"]["S"] == "stale"
            )
        )
        _phase("check by a scan which nodes moved", began)
        client.close()

        late_ids = [node_id for ids in late_nodes.results for node_id in ids]
        online_counted = count_in_state.results[0] if count_in_state.results else None
        entries = {item["node_id"]["S"]: _item_size(index_entry(item)) for item in scan.items}
        whole = {item["node_id"]["S"]: _item_size(item) for item in scan.items}
        # the index entries the sweep's queries named, the items it read (billed whole), and the
        # guard's count of every online node's entry when it ran
        named = [node_id for node_id in item_reads.node_ids if node_id in entries]
        sweep_bytes = (
            sum(entries[node_id] for node_id in named)
            + sum(whole[node_id] for node_id in named)
            + (sum(entries.values()) if online_counted is not None else 0)
        )
        return SizeResult(
            nodes=count,
            stale=stale_count,
            insert_seconds=insert_seconds,
            insert_calls=calls,
            items_read=report.items_read + len(item_reads.node_ids),
            late_read=len(late_ids),
            item_reads=len(item_reads.node_ids),
            online_counted=online_counted,
            late_seconds=late_nodes.seconds,
            count_seconds=count_in_state.seconds,
            transitioned=report.transitioned,
            skipped=report.skipped,
            held=report.held,
            sweep_seconds=sweep_seconds,
            sweep_bytes=sweep_bytes,
            scan_items=len(scan.items),
            scan_pages=scan.pages,
            scan_seconds=scan.seconds,
            scan_bytes=sum(_item_size(item) for item in scan.items),
            moved_ok=moved_ok
            and report.stale_candidates == stale_count
            and report.transitioned == stale_count
            and report.skipped == 0
            and not report.held,
        )
    finally:
        began = time.perf_counter()
        stack.stop()
        _phase("stop the local stack", began)


# --- the benchmark --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=[1000, 10000],
        help=f"fleet sizes, one fresh local stack each (1..{MAX_NODES}, at most {MAX_SIZES} sizes)",
    )
    parser.add_argument(
        "--stale-percent",
        type=float,
        default=1.0,
        help=f"percent of each fleet that is late (0..{MAX_STALE_PERCENT:g})",
    )
    args = parser.parse_args(argv)
    if not 1 <= len(args.nodes) <= MAX_SIZES:
        parser.error(f"--nodes takes 1 to {MAX_SIZES} sizes")
    if any(not 1 <= size <= MAX_NODES for size in args.nodes):
        parser.error(f"each --nodes size must be from 1 to {MAX_NODES}")
    if not 0 <= args.stale_percent <= MAX_STALE_PERCENT:
        parser.error(f"--stale-percent must be from 0 to {MAX_STALE_PERCENT:g}")
    return args


def _kb(size: int) -> str:
    return f"{size:,} B" if size < 10 * 1024 else f"{size / 1024:,.0f} KB"


def print_table(results: list[SizeResult]) -> None:
    print("\nSweep (one run) vs a full Scan of the nodes table")
    header = (
        f"{'nodes':>6} {'stale':>5} | {'read':>6} {'items':>6} {'late':>5} {'+online':>7} {'late s':>6} {'count s':>7}"
        f" {'moved':>5} {'sweep s':>7} {'data':>8} | {'read':>6} {'pages':>5} {'scan s':>6} {'data':>8} | check"
    )
    rule = "-" * len(header)
    print(f"{'':>12} | {'sweep':<{len(header.split('|')[1]) - 1}}| {'full Scan':<{len(header.split('|')[2]) - 1}}|")
    print(header)
    print(rule)
    for r in results:
        counted = "-" if r.online_counted is None else f"{r.online_counted}"
        print(
            f"{r.nodes:>6} {r.stale:>5} | {r.items_read:>6} {r.item_reads:>6} {r.late_read:>5} {counted:>7}"
            f" {r.late_seconds:>6.2f}"
            f" {r.count_seconds:>7.2f} {r.transitioned:>5} {r.sweep_seconds:>7.2f} {_kb(r.sweep_bytes):>8} |"
            f" {r.scan_items:>6} {r.scan_pages:>5} {r.scan_seconds:>6.2f} {_kb(r.scan_bytes):>8} |"
            f" {'ok' if r.moved_ok else 'WRONG'}"
        )
    print(rule)
    print(
        "read: items read (sweep: the node items read + SweepReport.items_read = late + online). items: node\n"
        "items read for their last heartbeat (one per index entry named: every node online since before the\n"
        "cutoff). late: late nodes found (stores.nodes.late_nodes); read also counts the counter item the guard reads\n"
        "when >= 10 nodes are late; online: index entries of a full recount (count_in_state), done only to\n"
        "repair a missing counter ('-' otherwise). late s / count s: time in those reads. sweep s:\n"
        "the whole sweep, its guarded writes included. data: bytes read by DynamoDB's item-size rules\n"
        "(keys-only index entries and the items read for the sweep, whole node items for the scan).\n"
        "check: exactly the stale nodes moved."
    )


def run(args: argparse.Namespace) -> int:
    # one INFO line per transition would drown the figures; warnings (a mass-stale hold) still show
    _support.prepare_stack_environment("WARNING", keep_thresholds=False)
    wall_started = time.perf_counter()
    print(
        f"ModelForge sweep benchmark: fleets of {', '.join(map(str, args.nodes))} nodes,"
        f" {args.stale_percent:g}% stale (stale_after + {MARGIN_SECONDS} s silent), the rest heartbeated"
        f" {MARGIN_SECONDS} s ago"
    )
    results = [run_size(size, args.stale_percent) for size in args.nodes]
    print_table(results)
    print(f"\ntotal wall time {time.perf_counter() - wall_started:.1f} s")
    wrong = [r for r in results if not r.moved_ok]
    for r in wrong:
        print(
            f"bench/sweep.py: FAILED: with {r.nodes} nodes the sweep did not move exactly the {r.stale} stale"
            f" nodes to 'stale' (transitioned {r.transitioned}, skipped {r.skipped}, held {r.held})",
            file=sys.stderr,
        )
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("sweep.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
