#!/usr/bin/env python
"""Claim benchmark: how fast nodes claim work, what one claim costs, and whether any item goes twice.

Run from the repository root:

    .venv/bin/python bench/claims.py [--nodes 1 10 50] [--items 200] [--raw-seconds 3]

It starts a fresh control plane in this process (``LocalStack``: the Chalice app over HTTP on a
moto emulator, all on 127.0.0.1), enrolls as many simulated nodes as the largest ``--nodes``
level through the HTTP API, each serving ``diagnostic.echo`` with its own requests.Session, and
for each level:

1. submits ``--items`` echo items (untimed) and heartbeats the level's nodes;
2. timed: releases that many nodes together, each claiming in a loop until every item is
   claimed (claims only: the items stay leased, so the emulator's counters hold nothing but
   claims), and prints claims per second, p50/p99 client-side claim latency, the 204 answers
   a node got while items were still queued (lost races), and the AWS requests per claim by
   operation (the emulator's counters, the local stream poller's traffic left out);
3. untimed: each holder uploads a result and completes its items, and every item must end
   ``succeeded``.

Beside them it measures the emulator's raw conditional-write rate with boto3 on a scratch table,
1 and 10 threads: a conditional UpdateItem, and a TransactWriteItems shaped like a claim's
(conditional Update + ConditionCheck + conditional Put). This is a benchmark, not a test: the
absolute rates are those of one Python process sharing its GIL between load generator, API
server and emulator. It exits non-zero, with a message on stderr, on a correctness failure: an
item claimed twice (a double claim), an item never claimed or not ``succeeded`` at the end, or
an answer that is not 200/204 to a claim or 200 to a complete.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import LOOPBACK, BenchFailure

REGION = "us-east-1"
ECHO = "diagnostic.echo"
CLAIM_PATH = "/api/v1/agent/work/claim"

#: Bounds on the options, so a run stays bounded in count and time.
MAX_LEVELS = 4
MAX_NODES = 100
MAX_ITEMS = 2000
MAX_RAW_SECONDS = 30
RAW_THREADS = (1, 10)
#: A level's timed phase gives up after this long (a failure).
MAX_PHASE_SECONDS = 300
#: Consecutive 204 answers after which a node stops although items are unclaimed (then a failure).
MAX_EMPTY_IN_A_ROW = 200
EMPTY_BACKOFF_SECONDS = 0.01
#: Leases outlive the run, so nothing is re-queued between the claim and the complete.
LEASE_SECONDS = 3600
#: The liveness thresholds the stack runs with: long enough that no node goes stale in a long
#: level (a heartbeat in the timed phase would add its UpdateItem to the claims' counts).
STALE_AFTER_SECONDS, OFFLINE_AFTER_SECONDS = 3600, 7200
SETUP_THREADS = 8
REQUEST_TIMEOUT_SECONDS = 60


# --- small helpers -------------------------------------------------------------------------


def _new_client(base_url: str) -> Any:
    import requests
    from modelforge_cli.api_client import ControlPlane

    session = requests.Session()
    session.trust_env = False  # no proxies, no netrc: 127.0.0.1 only
    return ControlPlane(
        base_url, os.environ["MODELFORGE_ADMIN_TOKEN"], session=session, timeout=REQUEST_TIMEOUT_SECONDS
    )


@dataclass
class Node:
    identity: Any
    client: Any  # ControlPlane with its own requests.Session (keep-alive)


def enroll_nodes(base_url: str, count: int) -> list[Node]:
    """Mint and enroll ``count`` nodes that serve ``diagnostic.echo`` (one at a time)."""
    from modelforge_cli.api_client import AgentIdentity, cpu_inventory

    nodes = []
    for index in range(count):
        client = _new_client(base_url)
        identity = AgentIdentity()
        minted = client.admin(
            "POST",
            "/api/v1/admin/node-enrollments",
            json={"display_name": f"claims bench {index:03d}", "expires_in_seconds": 900},
        )
        if minted.status_code != 201:
            raise BenchFailure(
                f"minting an enrollment token answered {minted.status_code}: {_support.brief(minted.text)}"
            )
        response = client.enroll(
            minted.json()["token"],
            identity,
            hostname=f"claims-bench-{index:03d}",
            inventory={**cpu_inventory(), "capabilities": ["cpu", ECHO]},
        )
        if response.status_code != 201:
            raise BenchFailure(
                f"enrolling node {index} answered {response.status_code}: {_support.brief(response.text)}"
            )
        nodes.append(Node(identity=identity, client=client))
    return nodes


def heartbeat(nodes: list[Node]) -> None:
    for node in nodes:
        beat = node.client.heartbeat(node.identity)
        if beat.status_code != 200 or beat.json().get("status") != "online":
            raise BenchFailure(
                f"heartbeat of {node.identity.node_id} answered {beat.status_code}: {_support.brief(beat.text)}"
            )


# --- one level ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    work_id: str
    epoch: int
    node: int  # index into the level's nodes
    result_upload_url: str


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


def submit(client: Any, items: int, tag: str) -> set[str]:
    ids = set()
    for index in range(items):
        response = client.submit_work(ECHO, {"bench": tag, "index": index}, lease_seconds=LEASE_SECONDS)
        if response.status_code != 201:
            raise BenchFailure(f"submitting work answered {response.status_code}: {_support.brief(response.text)}")
        ids.add(response.json()["work_id"])
    return ids


def claim_phase(nodes: list[Node], items: int) -> tuple[list[Claimed], list[float], float, int, list[str]]:
    """Every node claims in a loop, all released together, until ``items`` claims were answered."""
    start = threading.Barrier(len(nodes) + 1)
    guard = threading.Lock()
    claims: list[Claimed] = []
    latencies: list[float] = []
    problems: list[str] = []
    empty_while_queued = [0]
    stop = threading.Event()

    def loop(index: int) -> None:
        node = nodes[index]
        try:
            start.wait(timeout=REQUEST_TIMEOUT_SECONDS)
        except threading.BrokenBarrierError:
            return
        deadline = time.monotonic() + MAX_PHASE_SECONDS
        empty = 0
        while not stop.is_set():
            if time.monotonic() > deadline:
                with guard:
                    problems.append(f"node {index}: the phase ran past {MAX_PHASE_SECONDS} s")
                return
            began = time.perf_counter()
            try:
                response = node.client.claim(node.identity)
            except Exception as error:  # noqa: BLE001 - any failure ends the run
                with guard:
                    problems.append(f"claim by node {index}: {type(error).__name__}: {error}")
                stop.set()
                return
            latency = (time.perf_counter() - began) * 1000
            if response.status_code == 200:
                answer = response.json()
                with guard:
                    latencies.append(latency)
                    claims.append(Claimed(answer["work_id"], int(answer["epoch"]), index, answer["result_upload_url"]))
                empty = 0
                continue
            if response.status_code != 204:
                with guard:
                    problems.append(
                        f"claim by node {index} answered {response.status_code}: {_support.brief(response.text)}"
                    )
                stop.set()
                return
            with guard:
                latencies.append(latency)
                done = len(claims) >= items
                if not done:
                    empty_while_queued[0] += 1
            if done:
                return
            empty += 1
            if empty >= MAX_EMPTY_IN_A_ROW:
                with guard:
                    problems.append(f"node {index}: {empty} empty claims in a row with items unclaimed")
                return
            time.sleep(EMPTY_BACKOFF_SECONDS)

    threads = [
        threading.Thread(target=loop, args=(index,), name=f"claimer-{index}", daemon=True)
        for index in range(len(nodes))
    ]
    elapsed = _support.run_together(
        threads,
        start,
        start_timeout=REQUEST_TIMEOUT_SECONDS,
        give_up_after=MAX_PHASE_SECONDS + 2 * REQUEST_TIMEOUT_SECONDS,
        what="a claimer thread",
        stop=stop,
    )
    return claims, latencies, elapsed, empty_while_queued[0], problems


def complete_all(nodes: list[Node], claims: list[Claimed], base_url: str) -> list[str]:
    """Each holder uploads a result and completes; the answers that were not 200."""
    import requests

    local = threading.local()
    made: list[Any] = []
    lock = threading.Lock()

    def client() -> Any:
        if getattr(local, "client", None) is None:
            local.client = _new_client(base_url)
            with lock:
                made.append(local.client)
        return local.client

    def one(claim: Claimed) -> str | None:
        body = f'{{"echo":"{claim.work_id}"}}'.encode()
        upload = requests.put(
            claim.result_upload_url, data=body, timeout=REQUEST_TIMEOUT_SECONDS, allow_redirects=False
        )
        if upload.status_code != 200:
            return f"upload of {claim.work_id} answered {upload.status_code}"
        done = client().lease_call(
            nodes[claim.node].identity,
            claim.work_id,
            "complete",
            {"epoch": claim.epoch, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)},
        )
        if done.status_code != 200:
            return f"complete of {claim.work_id}@{claim.epoch} answered {done.status_code}: {_support.brief(done.text)}"
        return None

    try:
        with ThreadPoolExecutor(max_workers=SETUP_THREADS) as pool:
            return [problem for problem in pool.map(one, claims) if problem]
    finally:
        for each in made:
            each.session.close()


def run_level(stack: Any, nodes: list[Node], items: int) -> LevelResult:
    from chalicelib import instance
    from modelforge_local_stack.emulator import operations_delta

    print(f"\n{len(nodes)} concurrent node(s), {items} items", flush=True)
    admin = nodes[0].client
    began = time.perf_counter()
    submitted = submit(admin, items, f"level-{len(nodes)}-{secrets.token_hex(3)}")
    heartbeat(nodes)
    stack.drain_state_log()
    print(f"  submitted {items} items and heartbeated the nodes in {time.perf_counter() - began:.1f} s", flush=True)

    before = _support.app_operations(stack.aws_operations())
    claims, latencies, elapsed, empty, problems = claim_phase(nodes, items)
    stack.drain_state_log()  # the claims' state-log events are shipped (S3) and counted now
    delta = operations_delta(before, _support.app_operations(stack.aws_operations()))
    print(f"  claimed {len(claims)} items in {elapsed:.2f} s", flush=True)

    counts = collections.Counter(claim.work_id for claim in claims)
    double = sorted(work_id for work_id, count in counts.items() if count > 1)
    foreign = sorted(set(counts) - submitted)
    if foreign:
        problems.append(f"{len(foreign)} claimed items were not submitted by this level")

    began = time.perf_counter()
    # complete each item once, by its first holder (a double claim is reported, not completed twice)
    first = {claim.work_id: claim for claim in reversed(claims)}
    problems += complete_all(nodes, list(first.values()), stack.api_url)
    work = instance.get().stores.work
    final = {work_id: (item.status if (item := work.get(work_id)) else "missing") for work_id in sorted(submitted)}
    print(f"  completed them and read every item back in {time.perf_counter() - began:.1f} s", flush=True)
    return LevelResult(
        nodes=len(nodes),
        items=items,
        claims=claims,
        latencies_ms=latencies,
        elapsed=elapsed,
        empty_while_queued=empty,
        operations=delta,
        problems=problems,
        double_claims=double,
        not_succeeded={work_id: status for work_id, status in final.items() if status != "succeeded"},
    )


# --- the emulator's raw conditional-write rate ------------------------------------------------


@dataclass
class RawRun:
    what: str
    threads: int
    calls: int
    elapsed: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.calls / self.elapsed if self.elapsed > 0 else 0.0


def _run_for(calls: list[Callable[[], None]], seconds: float) -> tuple[int, float, list[float]]:
    start = threading.Barrier(len(calls) + 1)
    counts = [0] * len(calls)
    latencies: list[list[float]] = [[] for _ in calls]
    failures: list[str] = []

    def loop(index: int) -> None:
        start.wait(timeout=REQUEST_TIMEOUT_SECONDS)
        deadline = time.perf_counter() + seconds
        try:
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                calls[index]()
                latencies[index].append((time.perf_counter() - began) * 1000)
                counts[index] += 1
        except Exception as error:  # noqa: BLE001 - any failure ends the run
            failures.append(f"thread {index}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=loop, args=(index,), daemon=True) for index in range(len(calls))]
    elapsed = _support.run_together(
        threads,
        start,
        start_timeout=REQUEST_TIMEOUT_SECONDS,
        give_up_after=seconds + 2 * REQUEST_TIMEOUT_SECONDS,
        what="a raw-write thread",
    )
    if failures:
        raise BenchFailure(f"raw conditional writes failed; first: {failures[0]}")
    return sum(counts), elapsed, [value for each in latencies for value in each]


def _scratch_copy(admin: Any, source: str, name: str) -> str:
    """A new empty table with ``source``'s keys, indexes and stream: writes to it cost what writes
    to ``source`` cost, without touching the app's data or the emulator's counts of it."""
    described = admin.describe_table(TableName=source)["Table"]
    options: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": described["AttributeDefinitions"],
        "KeySchema": described["KeySchema"],
        "BillingMode": "PAY_PER_REQUEST",
    }
    indexes = [
        {"IndexName": index["IndexName"], "KeySchema": index["KeySchema"], "Projection": index["Projection"]}
        for index in described.get("GlobalSecondaryIndexes", [])
    ]
    if indexes:
        options["GlobalSecondaryIndexes"] = indexes
    stream = described.get("StreamSpecification")
    if stream and stream.get("StreamEnabled"):
        options["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    admin.create_table(**options)
    admin.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 50})
    return name


def raw_write_rates(endpoint_url: str, names: Mapping[str, str], seconds: float) -> list[RawRun]:
    """Conditional writes straight at the emulator with boto3, on scratch copies of the work, nodes
    and outbox tables (same keys, indexes and stream as the app's, but empty).

    Each thread has its own client and its own items. ``UpdateItem``: SET epoch = e + 1 (and a
    holder and a time) on a queued work item on the condition that it is queued at epoch e, as a
    claim's item write does. ``TransactWriteItems``: that update, a ConditionCheck of the thread's
    node item (credential, credential state, liveness, heartbeat age) and a Put of a new outbox
    item on the condition that it does not exist: the shape of a claim's transaction.
    """
    import boto3

    session = boto3.session.Session()
    admin = _support.emulator_dynamodb(endpoint_url, REGION, REQUEST_TIMEOUT_SECONDS, session)
    scratch = f"bench-claims-scratch-{secrets.token_hex(4)}"
    tables: list[str] = []
    runs: list[RawRun] = []
    try:
        for role in ("WORK", "NODES", "OUTBOX"):
            tables.append(_scratch_copy(admin, names[f"MODELFORGE_{role}_TABLE"], f"{scratch}-{role.lower()}"))
        work_table, nodes_table, outbox_table = tables
        credential = "0" * 64
        now = time.time()
        for index in range(max(RAW_THREADS)):
            admin.put_item(
                TableName=work_table,
                Item={
                    "work_id": {"S": f"work_scratch{index:03d}"},
                    "capability": {"S": ECHO},
                    "status": {"S": "queued"},
                    "epoch": {"N": "0"},
                    "queue_key": {"S": ECHO},
                    "queued_at": {"N": str(round(now, 3))},
                },
            )
            admin.put_item(
                TableName=nodes_table,
                Item={
                    "node_id": {"S": f"node_scratch{index:03d}"},
                    "credential_sha256": {"S": credential},
                    "credential_state": {"S": "active"},
                    "liveness": {"S": "online"},
                    "last_heartbeat_at": {"N": str(round(now, 3))},
                },
            )
        epochs = [0] * max(RAW_THREADS)

        def update(index: int) -> dict[str, Any]:
            epoch = epochs[index]
            epochs[index] += 1
            return {
                "TableName": work_table,
                "Key": {"work_id": {"S": f"work_scratch{index:03d}"}},
                "UpdateExpression": "SET epoch = :next, lease_holder = :node, updated_at = :now",
                "ConditionExpression": "#s = :queued AND epoch = :epoch",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {
                    ":next": {"N": str(epoch + 1)},
                    ":epoch": {"N": str(epoch)},
                    ":queued": {"S": "queued"},
                    ":node": {"S": f"node_scratch{index:03d}"},
                    ":now": {"N": str(round(time.time(), 3))},
                },
            }

        def node_check(index: int) -> dict[str, Any]:
            return {
                "TableName": nodes_table,
                "Key": {"node_id": {"S": f"node_scratch{index:03d}"}},
                "ConditionExpression": (
                    "credential_sha256 = :c AND credential_state = :active AND liveness = :online"
                    " AND last_heartbeat_at > :after"
                ),
                "ExpressionAttributeValues": {
                    ":c": {"S": credential},
                    ":active": {"S": "active"},
                    ":online": {"S": "online"},
                    ":after": {"N": str(time.time() - STALE_AFTER_SECONDS)},
                },
            }

        def event() -> dict[str, Any]:
            return {
                "TableName": outbox_table,
                "Item": {
                    "event_id": {"S": uuid.uuid4().hex},
                    "type": {"S": "work.leased"},
                    "at": {"N": str(round(time.time(), 3))},
                },
                "ConditionExpression": "attribute_not_exists(event_id)",
            }

        def updates(client: Any, index: int) -> Callable[[], None]:
            return lambda: client.update_item(**update(index))

        def transactions(client: Any, index: int) -> Callable[[], None]:
            return lambda: client.transact_write_items(
                TransactItems=[{"Update": update(index)}, {"ConditionCheck": node_check(index)}, {"Put": event()}]
            )

        for threads in RAW_THREADS:
            clients = [
                _support.emulator_dynamodb(endpoint_url, REGION, REQUEST_TIMEOUT_SECONDS, session)
                for _ in range(threads)
            ]
            try:
                for what, make in (
                    ("conditional UpdateItem", updates),
                    ("claim-shaped TransactWriteItems", transactions),
                ):
                    calls, elapsed, latencies = _run_for([make(clients[i], i) for i in range(threads)], seconds)
                    runs.append(RawRun(what, threads, calls, elapsed, latencies))
            finally:
                for client in clients:
                    client.close()
    finally:
        for table in tables:
            admin.delete_table(TableName=table)
        admin.close()
    return runs


# --- the benchmark --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=[1, 10, 50],
        help=f"concurrent nodes of each level (1..{MAX_NODES}, at most {MAX_LEVELS} levels)",
    )
    parser.add_argument("--items", type=int, default=200, help=f"items claimed in each level (1..{MAX_ITEMS})")
    parser.add_argument(
        "--raw-seconds",
        type=float,
        default=3,
        help=f"duration of each raw conditional-write phase, 4 in all (1..{MAX_RAW_SECONDS})",
    )
    args = parser.parse_args(argv)
    if not 1 <= len(args.nodes) <= MAX_LEVELS:
        parser.error(f"--nodes takes 1 to {MAX_LEVELS} levels")
    if any(not 1 <= count <= MAX_NODES for count in args.nodes):
        parser.error(f"each --nodes level must be from 1 to {MAX_NODES}")
    if not 1 <= args.items <= MAX_ITEMS:
        parser.error(f"--items must be from 1 to {MAX_ITEMS}")
    if not 1 <= args.raw_seconds <= MAX_RAW_SECONDS:
        parser.error(f"--raw-seconds must be from 1 to {MAX_RAW_SECONDS}")
    return args


def _latency(values: list[float]) -> str:
    return (
        f"{_support.percentile(values, 50):7.1f} {_support.percentile(values, 99):7.1f}"
        if values
        else f"{'-':>7} {'-':>7}"
    )


def print_tables(levels: list[LevelResult], raw: list[RawRun]) -> None:
    print("\nClaims over HTTP (client-side latency of every claim request, 204s included)")
    header = f"{'nodes':>5} {'items':>5} | {'claims/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'lost races':>10} | DynamoDB requests per claim | {'S3':>4} | check"
    print(header)
    print("-" * len(header))
    for level in levels:
        check = "ok" if level.ok else ("DOUBLE CLAIM" if level.double_claims else "WRONG")
        print(
            f"{level.nodes:>5} {level.items:>5} | {level.rate:>8.1f} {_latency(level.latencies_ms)} {level.empty_while_queued:>10} |"
            f" {_support.format_ops(level.dynamodb_per_claim):<27} | {level.s3_per_claim:>4.2f} | {check}"
        )
    print("-" * len(header))
    print(
        "claims/s: items claimed / the timed phase (claims only; no upload or complete in it).\n"
        "lost races: 204 answers while items of the level were still unclaimed. DynamoDB requests per\n"
        "claim: every AWS request the app made in the timed phase / items claimed (failed transactions of\n"
        "lost races included, and each node's last, empty claim: one GetItem and one Query per node);\n"
        "S3: the state-log objects the claims' events became."
    )
    print("\nThe emulator's raw conditional writes (boto3, scratch table, same emulator)")
    print(f"{'write':<32} {'threads':>7} | {'writes/s':>8} {'p50 ms':>7} {'p99 ms':>7} | {'calls':>6}")
    for run in raw:
        print(f"{run.what:<32} {run.threads:>7} | {run.rate:>8.1f} {_latency(run.latencies_ms)} | {run.calls:>6}")


def run(args: argparse.Namespace) -> int:
    _support.prepare_stack_environment("WARNING", keep_thresholds=False)
    os.environ["MODELFORGE_NODE_STALE_AFTER_SECONDS"] = str(STALE_AFTER_SECONDS)
    os.environ["MODELFORGE_NODE_OFFLINE_AFTER_SECONDS"] = str(OFFLINE_AFTER_SECONDS)
    from modelforge_local_stack.local_stack import LocalOptions, LocalStack

    wall_started = time.perf_counter()
    print(
        f"ModelForge claim benchmark: {', '.join(map(str, args.nodes))} concurrent node(s), {args.items} items each;"
        f" raw conditional writes {args.raw_seconds:g} s x {2 * len(RAW_THREADS)}"
    )
    # a fresh prefix: moto's backend outlives a stack in this process, tables included
    prefix = f"bench-claims-{secrets.token_hex(3)}"
    stack = LocalStack(LocalOptions(host=LOOPBACK, port=0, sweep_interval_seconds=3600, resource_prefix=prefix))
    nodes: list[Node] = []
    try:
        stack.start()
        if stack.emulator is None:
            raise BenchFailure("the local stack has no embedded emulator, so AWS calls cannot be counted")
        _support.require_loopback(stack.api_url, "the API server")
        _support.require_loopback(stack.aws_endpoint_url, "the AWS emulator")
        print(f"local stack: API {stack.api_url}, emulator {stack.aws_endpoint_url}")
        began = time.perf_counter()
        nodes = enroll_nodes(stack.api_url, max(args.nodes))
        print(f"enrolled {len(nodes)} nodes in {time.perf_counter() - began:.1f} s", flush=True)
        levels = [run_level(stack, nodes[:count], args.items) for count in args.nodes]
        began = time.perf_counter()
        raw = raw_write_rates(stack.aws_endpoint_url, stack.names, args.raw_seconds)
        print(f"\nraw conditional writes measured in {time.perf_counter() - began:.1f} s", flush=True)
    finally:
        for node in nodes:
            node.client.session.close()
        stack.stop()
    print_tables(levels, raw)
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
