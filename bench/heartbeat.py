#!/usr/bin/env python
"""Heartbeat benchmark: what one steady-state heartbeat costs, and how fast the local stack takes them.

Run from the repository root:

    .venv/bin/python bench/heartbeat.py [--nodes 50] [--seconds 10] [--gpus 8]

It starts the control plane in this process (``LocalStack``: the Chalice app over HTTP on a
moto emulator, all on 127.0.0.1), enrolls ``--nodes`` simulated nodes through the HTTP API and
prints four figures:

1. AWS calls per steady-state heartbeat, by operation, app traffic only (emulator counters);
2. the DynamoDB item size of the node item a heartbeat writes, in bytes and 1 KB write units,
   and the inventory item's size next to it;
3. heartbeats per second through the local HTTP server with ``--nodes`` concurrent nodes, next
   to the emulator's raw conditional-UpdateItem rate at the same concurrency and duration;
4. p50/p99 handler latency, server-side (the app's ``http_request`` access-log ``duration_ms``),
   with client-side request latency alongside for reference.

This is a benchmark, not a test: the absolute rates are those of one Python process sharing
its GIL between load generator, API server and emulator. It exits non-zero, with a message on
stderr, when anything fails (a heartbeat that is not 200, a failed enrollment, an AWS call
profile that is not one UpdateItem per heartbeat).
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import LOOPBACK, BenchFailure
from modelforge_cli.item_size import WRITE_UNIT_BYTES, item_size, item_size_breakdown, write_units

HEARTBEAT_PATH = "/api/v1/agent/heartbeat"
REGION = "us-east-1"

#: Bounds on the options, so a run stays bounded in count and time.
MAX_NODES = 200
MAX_SECONDS = 60
MAX_GPUS = 64  # the protocol's limit (modelforge_protocol.schemas.MAX_GPUS)
MAX_COST_HEARTBEATS = 2000
#: Per-thread cap in the timed phases, in case a loop runs far faster than expected.
MAX_CALLS_PER_THREAD = 100_000
REQUEST_TIMEOUT_SECONDS = 10


# --- small helpers -------------------------------------------------------------------------


class AccessLogCapture(logging.Handler):
    """Collect the app's own ``http_request`` access-log records for the heartbeat route."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self._records: list[float] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) != "http_request" or getattr(record, "path", None) != HEARTBEAT_PATH:
            return
        with self._guard:
            self._records.append(float(record.duration_ms))  # type: ignore[attr-defined]

    def take(self) -> list[float]:
        """Durations (ms) of heartbeat requests logged since the last call."""
        with self._guard:
            taken, self._records = self._records, []
        return taken


@dataclass
class Node:
    identity: Any
    client: Any  # ControlPlane with its own requests.Session (keep-alive)


@dataclass
class TimedRun:
    calls: int
    elapsed: float
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.calls / self.elapsed if self.elapsed > 0 else 0.0


def run_concurrently(workers: list[Callable[[], None]], seconds: float) -> TimedRun:
    """Run each worker's one call in a loop on its own thread for ``seconds``; stop all on a failure."""
    stop = threading.Event()
    start = threading.Barrier(len(workers) + 1)
    failures: list[str] = []
    counts = [0] * len(workers)
    latencies: list[list[float]] = [[] for _ in workers]

    def loop(index: int, call: Callable[[], None]) -> None:
        try:
            start.wait(timeout=30)
        except threading.BrokenBarrierError:
            return
        deadline = time.perf_counter() + seconds
        try:
            while not stop.is_set() and counts[index] < MAX_CALLS_PER_THREAD:
                began = time.perf_counter()
                if began >= deadline:
                    break
                call()
                latencies[index].append((time.perf_counter() - began) * 1000)
                counts[index] += 1
        except BaseException as error:  # noqa: BLE001 - any failure ends the run
            failures.append(f"worker {index}: {error}")
            stop.set()

    threads = [
        threading.Thread(target=loop, args=(index, call), name=f"bench-{index}", daemon=True)
        for index, call in enumerate(workers)
    ]
    elapsed = _support.run_together(
        threads,
        start,
        start_timeout=30,
        give_up_after=seconds + 2 * REQUEST_TIMEOUT_SECONDS,
        what="a benchmark thread",
        stop=stop,
    )
    if failures:
        raise BenchFailure(f"{len(failures)} worker(s) failed; first: {failures[0]}")
    return TimedRun(calls=sum(counts), elapsed=elapsed, latencies_ms=[x for each in latencies for x in each])


# --- the benchmark --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50, help=f"simulated nodes = concurrent clients (1..{MAX_NODES})")
    parser.add_argument(
        "--seconds", type=float, default=10, help=f"duration of each of the two timed phases (1..{MAX_SECONDS})"
    )
    parser.add_argument("--gpus", type=int, default=8, help=f"GPUs per simulated node (0..{MAX_GPUS})")
    parser.add_argument(
        "--cost-heartbeats",
        type=int,
        default=200,
        help=f"sequential heartbeats counted for the per-heartbeat AWS calls (1..{MAX_COST_HEARTBEATS})",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes must be from 1 to {MAX_NODES}")
    if not 1 <= args.seconds <= MAX_SECONDS:
        parser.error(f"--seconds must be from 1 to {MAX_SECONDS}")
    if not 0 <= args.gpus <= MAX_GPUS:
        parser.error(f"--gpus must be from 0 to {MAX_GPUS}")
    if not 1 <= args.cost_heartbeats <= MAX_COST_HEARTBEATS:
        parser.error(f"--cost-heartbeats must be from 1 to {MAX_COST_HEARTBEATS}")
    return args


def _quiet_app_log() -> AccessLogCapture:
    """Keep the app's INFO lines off stderr (warnings still show) and capture its access log."""
    for handler in logging.getLogger("modelforge").handlers:
        if getattr(handler, "_modelforge", False):
            handler.setLevel(logging.WARNING)
    capture = AccessLogCapture()
    logging.getLogger("modelforge.api").addHandler(capture)
    return capture


def _new_client(base_url: str) -> Any:
    return _support.loopback_client(base_url, REQUEST_TIMEOUT_SECONDS)


_boto_session: Any = None


def _dynamodb(endpoint_url: str) -> Any:
    """A DynamoDB client for the emulator (call from the main thread: clients share one session)."""
    global _boto_session
    import boto3

    if _boto_session is None:
        _boto_session = boto3.session.Session()
    return _support.emulator_dynamodb(endpoint_url, REGION, REQUEST_TIMEOUT_SECONDS, _boto_session)


def enroll_nodes(base_url: str, count: int, gpus: int, capabilities: list[str] | None = None) -> list[Node]:
    """Mint, enroll and bring online ``count`` nodes (first heartbeat: pending -> online);
    ``capabilities`` replaces the inventory's (a node with a runtime worker lists its work).

    Each node keeps its own client (its own requests.Session) for the timed phase.
    """
    from modelforge_cli.api_client import AgentIdentity, cpu_inventory, gpu_inventory

    def one(index: int) -> Node:
        client = _new_client(base_url)
        identity = AgentIdentity()
        _support.mint_and_enroll(
            client,
            identity,
            index,
            f"bench node {index:03d}",
            f"bench-node-{index:03d}",
            accelerator_mode="nvidia" if gpus else "cpu",
            inventory={
                **(gpu_inventory(gpus) if gpus else cpu_inventory()),
                **({"capabilities": capabilities} if capabilities else {}),
            },
        )
        beat = client.heartbeat(identity, gpus=gpus)
        if beat.status_code != 200 or beat.json().get("status") != "online":
            raise BenchFailure(
                f"first heartbeat of node {index} answered {beat.status_code}: {_support.brief(beat.text)}"
            )
        return Node(identity=identity, client=client)

    # one at a time: on a couple of cores, concurrent enrollment only adds GIL contention
    return [one(index) for index in range(count)]


def heartbeat_once(node: Node, gpus: int) -> None:
    response = node.client.heartbeat(node.identity, gpus=gpus)
    if response.status_code != 200:
        raise BenchFailure(
            f"heartbeat of {node.identity.node_id} answered {response.status_code}: {_support.brief(response.text)}"
        )


def raw_update_item_rate(endpoint_url: str, concurrency: int, seconds: float, node_item: Mapping[str, Any]) -> TimedRun:
    """Conditional UpdateItem calls straight at the emulator, on a scratch table created for it.

    Each thread has its own boto3 client and its own item, and writes the same attributes the
    steady-state heartbeat writes (same telemetry and health values) under the same kind of
    condition (credential matches, credential active, node online).
    """
    admin = _dynamodb(endpoint_url)
    table = f"bench-scratch-{secrets.token_hex(4)}"
    admin.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "node_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "node_id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    try:
        admin.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 0.1, "MaxAttempts": 50})
        credential = "0" * 64
        for index in range(concurrency):
            admin.put_item(
                TableName=table,
                Item={
                    "node_id": {"S": f"scratch-{index:03d}"},
                    "credential_sha256": {"S": credential},
                    "credential_state": {"S": "active"},
                    "liveness": {"S": "online"},
                },
            )
        clients = [_dynamodb(endpoint_url) for _ in range(concurrency)]

        def worker(index: int) -> Callable[[], None]:
            client = clients[index]
            key = {"node_id": {"S": f"scratch-{index:03d}"}}

            def call() -> None:
                client.update_item(
                    TableName=table,
                    Key=key,
                    UpdateExpression=("SET #t = :t, #l = :online, #h = :h, #tel = :tel, #av = :av, #pv = :pv"),
                    ConditionExpression="#c = :c AND #cs = :active AND #l = :online",
                    ExpressionAttributeNames={
                        "#t": "last_heartbeat_at",
                        "#l": "liveness",
                        "#h": "health",
                        "#tel": "telemetry",
                        "#av": "agent_version",
                        "#pv": "protocol_version",
                        "#c": "credential_sha256",
                        "#cs": "credential_state",
                    },
                    ExpressionAttributeValues={
                        ":t": {"N": str(round(time.time(), 3))},
                        ":online": {"S": "online"},
                        ":h": node_item.get("health", {"S": "{}"}),
                        ":tel": node_item.get("telemetry", {"S": "[]"}),
                        ":av": node_item.get("agent_version", {"S": "1.3.0"}),
                        ":pv": node_item.get("protocol_version", {"N": "1"}),
                        ":c": {"S": credential},
                        ":active": {"S": "active"},
                    },
                )

            return call

        result = run_concurrently([worker(i) for i in range(concurrency)], seconds)
        for client in clients:
            client.close()
        return result
    finally:
        admin.delete_table(TableName=table)
        admin.close()


#: What a node with a runtime worker advertises (the hint reads the queue of each work capability).
WORKER_CAPABILITIES = ["cpu", "ocr", "diagnostic.echo"]
HINT_NODES = 10
#: chalicelib.services.work_hint.DEFAULT_TTL_SECONDS (bench/ does not import the functions' package)
HINT_TTL_SECONDS = 5.0


def work_hint_reads(stack: Any, args: argparse.Namespace) -> list[str]:
    """AWS calls per heartbeat of nodes that serve work, without queued work and with it."""
    from modelforge_local_stack.emulator import operations_delta

    nodes = enroll_nodes(stack.api_url, HINT_NODES, args.gpus, WORKER_CAPABILITIES)
    admin = nodes[0].client
    problems: list[str] = []
    print()
    print(
        f"[1b] AWS calls per heartbeat of {HINT_NODES} nodes with a runtime worker ({', '.join(WORKER_CAPABILITIES)})"
    )
    for label, queued in (("no work queued", False), ("work queued   ", True)):
        if queued:
            submitted = admin.submit_work("diagnostic.echo", {"bench": "hint"})
            if submitted.status_code != 201:
                raise BenchFailure(
                    f"submitting work answered {submitted.status_code}: {_support.brief(submitted.text)}"
                )
        stack.drain_state_log()
        # let the instance's memory of the queue (the hint's cache) expire, so this phase pays for
        # its own reads: at most one Query per work capability per TTL
        time.sleep(HINT_TTL_SECONDS + 0.5)
        before = _support.app_operations(stack.aws_operations())
        began = time.monotonic()
        hinted = 0
        for count in range(args.cost_heartbeats):
            response = nodes[count % len(nodes)].client.heartbeat(nodes[count % len(nodes)].identity, gpus=args.gpus)
            if response.status_code != 200:
                raise BenchFailure(f"heartbeat answered {response.status_code}: {_support.brief(response.text)}")
            hinted += bool(response.json().get("work_waiting"))
        seconds = time.monotonic() - began
        stack.drain_state_log()
        delta = operations_delta(before, _support.app_operations(stack.aws_operations()))
        reads = sum(count for name, count in delta.items() if name in ("Query", "GetItem", "Scan", "BatchGetItem"))
        print(
            f"    {label}: {_support.format_ops({name: n / args.cost_heartbeats for name, n in delta.items()})}"
            " per heartbeat;"
            f" reads {reads / args.cost_heartbeats:.3f} per heartbeat ({reads} in {seconds:.1f} s);"
            f" work_waiting in {hinted} of {args.cost_heartbeats} answers"
        )
        if delta.get("UpdateItem") != args.cost_heartbeats:
            problems.append(
                f"heartbeats of worker nodes ({label.strip()}) did not cost one UpdateItem each:"
                f" {_support.format_ops(delta)}"
            )
        if queued and hinted == 0:
            problems.append("no heartbeat answer hinted at the queued work")
    print(
        "    (the hint reads each work capability's queue at most once per"
        f" {HINT_TTL_SECONDS:g} s per function instance)"
    )
    claimed = nodes[0].client.claim(nodes[0].identity)
    if claimed.status_code == 200:  # leave nothing running for the later phases
        body = claimed.json()
        nodes[0].client.lease_call(
            nodes[0].identity, body["work_id"], "fail", {"epoch": body["epoch"], "reason": "bench", "retryable": False}
        )
    return problems


def run(args: argparse.Namespace) -> int:
    # the access log (INFO) carries the server-side latency
    _support.prepare_stack_environment("INFO", keep_thresholds=True)
    from modelforge_local_stack.local_stack import LocalOptions, LocalStack

    problems: list[str] = []
    wall_started = time.monotonic()
    print(
        f"ModelForge heartbeat benchmark: {args.nodes} nodes, {args.gpus} GPUs each, {args.seconds:g} s per timed phase"
    )
    stack = LocalStack(LocalOptions(host=LOOPBACK, port=0, sweep_interval_seconds=3600))
    nodes: list[Node] = []
    try:
        stack.start()
        if stack.emulator is None:
            raise BenchFailure("the local stack has no embedded emulator, so AWS calls cannot be counted")
        endpoint = stack.emulator.endpoint_url
        _support.require_loopback(stack.api_url, "the API server")
        _support.require_loopback(endpoint, "the AWS emulator")
        capture = _quiet_app_log()
        print(f"local stack: API {stack.api_url}, emulator {endpoint}")
        print("(control-plane INFO log lines are kept off stderr; warnings and errors still show)")

        started = time.monotonic()
        nodes = enroll_nodes(stack.api_url, args.nodes, args.gpus)
        stack.drain_state_log()
        print(f"enrolled {len(nodes)} nodes and brought them online in {time.monotonic() - started:.1f} s")
        capture.take()

        sequential_client_ms, sequential_server_ms = _measure_calls(stack, nodes, args, capture, problems)

        # 1b. the work hint: reads per heartbeat of nodes with a runtime worker -------------
        problems += work_hint_reads(stack, args)

        node_item = _item_sizes(stack, endpoint, nodes, args, problems)
        http, raw, loaded_server_ms = _throughput(stack, endpoint, nodes, args, capture, node_item, problems)
        latencies = [
            ("server-side", "sequential, 1 client", sequential_server_ms),
            ("server-side", f"under load, {len(nodes)} clients", loaded_server_ms),
            ("client-side", "sequential, 1 client", sequential_client_ms),
            ("client-side", f"under load, {len(nodes)} clients", http.latencies_ms),
            ("client-side", f"raw emulator UpdateItem, {len(nodes)} clients", raw.latencies_ms),
        ]
        _print_latency(latencies)
        if not sequential_server_ms or not loaded_server_ms:
            problems.append("no access-log records captured for the server-side latency")
    finally:
        for node in nodes:
            node.client.session.close()
        stack.stop()

    print()
    print(f"total wall time {time.monotonic() - wall_started:.1f} s")
    if problems:
        for problem in problems:
            print(f"bench/heartbeat.py: FAILED: {problem}", file=sys.stderr)
        return 1
    return 0


def _measure_calls(
    stack: Any, nodes: list[Node], args: argparse.Namespace, capture: AccessLogCapture, problems: list[str]
) -> tuple[list[float], list[float]]:
    """Section 1: AWS calls per steady-state heartbeat; the sequential heartbeats' client-side and
    server-side latencies."""
    from modelforge_local_stack.emulator import operations_delta

    before = _support.app_operations(stack.aws_operations())
    sequential_client_ms: list[float] = []
    for count in range(args.cost_heartbeats):
        began = time.perf_counter()
        heartbeat_once(nodes[count % len(nodes)], args.gpus)
        sequential_client_ms.append((time.perf_counter() - began) * 1000)
    stack.drain_state_log()  # any state-log event a heartbeat wrote is shipped (S3) and counted now
    delta = operations_delta(before, _support.app_operations(stack.aws_operations()))
    sequential_server_ms = capture.take()
    per_heartbeat = {name: count / args.cost_heartbeats for name, count in delta.items()}
    s3_calls = sum(count for name, count in delta.items() if name.startswith("S3:"))
    print()
    print(f"[1] AWS calls per steady-state heartbeat (app traffic, over {args.cost_heartbeats} sequential heartbeats)")
    print(f"    totals:        {_support.format_ops(delta)}")
    print(f"    per heartbeat: {_support.format_ops(per_heartbeat)}")
    print(f"    S3 calls:      {s3_calls}")
    if delta == {"UpdateItem": args.cost_heartbeats}:
        print("    as expected:   1 UpdateItem, no S3 write")
    else:
        problems.append(
            f"steady-state heartbeat made {_support.format_ops(per_heartbeat)} per heartbeat, not 1 UpdateItem"
        )
        print("    UNEXPECTED:    expected exactly 1 UpdateItem and nothing else per heartbeat")
    return sequential_client_ms, sequential_server_ms


def _item_sizes(
    stack: Any, endpoint: str, nodes: list[Node], args: argparse.Namespace, problems: list[str]
) -> dict[str, Any]:
    """Section 2: the DynamoDB sizes of a node item and its inventory item; the node item."""
    dynamodb = _dynamodb(endpoint)
    node_id = nodes[0].identity.node_id
    node_item = dynamodb.get_item(
        TableName=stack.names["MODELFORGE_NODES_TABLE"], Key={"node_id": {"S": node_id}}, ConsistentRead=True
    ).get("Item")
    inventory_item = dynamodb.get_item(
        TableName=stack.names["MODELFORGE_INVENTORIES_TABLE"], Key={"node_id": {"S": node_id}}, ConsistentRead=True
    ).get("Item")
    dynamodb.close()
    if not node_item or not inventory_item:
        raise BenchFailure(f"node {node_id} or its inventory item is missing from the emulator's tables")
    node_bytes = item_size(node_item)
    inventory_bytes = item_size(inventory_item)
    breakdown = sorted(item_size_breakdown(node_item).items(), key=lambda pair: -pair[1])
    print()
    print(f"[2] DynamoDB item size (item-size rules, raw get_item from the emulator), {args.gpus}-GPU node")
    print(
        f"    node item (rewritten by every heartbeat): {node_bytes} bytes"
        f" = {write_units(node_bytes)} write unit(s) of 1 KB"
        + (
            f"; {WRITE_UNIT_BYTES - node_bytes} bytes of headroom under 1 KB"
            if node_bytes <= WRITE_UNIT_BYTES
            else f"; {node_bytes - WRITE_UNIT_BYTES} bytes over 1 KB"
        )
    )
    print("      bytes by attribute (name + value):")
    for start in range(0, len(breakdown), 4):
        print("        " + "  ".join(f"{name} {size}" for name, size in breakdown[start : start + 4]))
    print(
        f"    inventory item (separate table, not written by heartbeats): {inventory_bytes} bytes"
        f" = {write_units(inventory_bytes)} write unit(s)"
    )
    if "inventory" in node_item:
        problems.append("the node item carries an 'inventory' attribute")
    if node_bytes > WRITE_UNIT_BYTES:
        print("    NOTE: the node item is over 1 KB, so each heartbeat costs more than one write unit")
    return node_item


def _throughput(
    stack: Any,
    endpoint: str,
    nodes: list[Node],
    args: argparse.Namespace,
    capture: AccessLogCapture,
    node_item: dict[str, Any],
    problems: list[str],
) -> tuple[TimedRun, TimedRun, list[float]]:
    """Section 3: heartbeats per second over HTTP next to the emulator's raw UpdateItem rate; both
    runs, and the server-side latencies under load."""
    from modelforge_local_stack.emulator import operations_delta

    stack.drain_state_log()  # events shipped late would count as the heartbeats' own S3 writes
    before = _support.app_operations(stack.aws_operations())
    http = run_concurrently([lambda node=node: heartbeat_once(node, args.gpus) for node in nodes], args.seconds)
    stack.drain_state_log()
    http_delta = operations_delta(before, _support.app_operations(stack.aws_operations()))
    loaded_server_ms = capture.take()
    if http_delta != {"UpdateItem": http.calls}:
        problems.append(f"{http.calls} concurrent heartbeats made {_support.format_ops(http_delta)}")
    raw = raw_update_item_rate(endpoint, len(nodes), args.seconds, node_item)
    print()
    print(f"[3] Throughput, {len(nodes)} concurrent clients, {args.seconds:g} s each (one process, loopback)")
    print(
        f"    heartbeats via the HTTP API:     {http.rate:8.1f} /s  ({http.calls} in {http.elapsed:.2f} s;"
        f" emulator saw {_support.format_ops(http_delta)})"
    )
    print(
        f"    raw emulator UpdateItem (boto3): {raw.rate:8.1f} /s  ({raw.calls} in {raw.elapsed:.2f} s;"
        " conditional, on a scratch table)"
    )
    if raw.rate > 0:
        print(f"    HTTP heartbeat rate is {http.rate / raw.rate:.0%} of the raw UpdateItem rate")
    return http, raw, loaded_server_ms


def _print_latency(rows: list[tuple[str, str, list[float]]]) -> None:
    """Section 4: p50 / p99 of each latency series."""
    print()
    print("[4] Heartbeat latency, ms (p50 / p99)")
    print("    server-side = the app's access log 'duration_ms' (the Chalice middleware around the handler,")
    print("                  including its DynamoDB call); client-side = whole HTTP request seen by the client")
    for side, label, values in rows:
        figures = (
            f"{_support.percentile(values, 50):8.2f} / {_support.percentile(values, 99):8.2f}  (n={len(values)})"
            if values
            else "no samples"
        )
        print(f"    {side}, {label:<40} {figures}")


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("heartbeat.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
