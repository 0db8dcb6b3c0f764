"""The claims bench's load generator: a process of its own, beside the local stack's.

bench/claims.py starts the local stack (API server and emulator) in its process and this module in
another (``start``), so that the claimers' HTTP clients do not share a Python interpreter, and its
lock, with the server they measure. The bench sends it commands over a pipe (``Generator``): enroll
nodes, submit items, heartbeat, run a level's timed claim phase, complete the claimed items, and
measure the emulator's raw conditional-write rate from here, where the claims come from.
Everything it talks to is on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import BenchFailure

REGION = "us-east-1"
ECHO = "diagnostic.echo"
RAW_THREADS = (1, 10)
#: A level's timed phase gives up after this long (a failure).
MAX_PHASE_SECONDS = 600
#: Consecutive 204 answers after which a node stops although items are unclaimed (then a failure).
MAX_EMPTY_IN_A_ROW = 200
EMPTY_BACKOFF_SECONDS = 0.01
#: Leases outlive the run, so nothing is re-queued between the claim and the complete.
LEASE_SECONDS = 3600
STALE_AFTER_SECONDS = 3600
SETUP_THREADS = 8
REQUEST_TIMEOUT_SECONDS = 60
#: How long the bench waits for one command's answer (a claim phase included).
COMMAND_TIMEOUT_SECONDS = MAX_PHASE_SECONDS + 4 * REQUEST_TIMEOUT_SECONDS


# --- small helpers -------------------------------------------------------------------------


def _new_client(base_url: str) -> Any:
    return _support.loopback_client(base_url, REQUEST_TIMEOUT_SECONDS)


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
        _support.mint_and_enroll(
            client,
            identity,
            index,
            f"claims bench {index:03d}",
            f"claims-bench-{index:03d}",
            inventory={**cpu_inventory(), "capabilities": ["cpu", ECHO]},
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


@dataclass(frozen=True)
class Claimed:
    work_id: str
    epoch: int
    node: int  # index into the level's nodes
    result_upload_url: str


@dataclass(frozen=True)
class Phase:
    """A timed claim phase as the load generator saw it."""

    claims: list[Claimed]
    #: every claim request's latency (200s and 204s)
    latencies_ms: list[float]
    elapsed: float
    empty_while_queued: int
    problems: list[str]


def submit(client: Any, items: int, tag: str) -> set[str]:
    ids = set()
    for index in range(items):
        response = client.submit_work(ECHO, {"bench": tag, "index": index}, lease_seconds=LEASE_SECONDS)
        if response.status_code != 201:
            raise BenchFailure(f"submitting work answered {response.status_code}: {_support.brief(response.text)}")
        ids.add(response.json()["work_id"])
    return ids


def claim_phase(nodes: list[Node], items: int) -> Phase:
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
            with guard:
                if len(claims) >= items:
                    return  # every item is claimed: no more requests
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
    return Phase(claims, latencies, elapsed, empty_while_queued[0], problems)


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
                try:
                    calls[index]()
                except StopIteration:  # nothing left to write: this thread's part is over
                    break
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


def raw_write_rates(
    endpoint_url: str, names: Mapping[str, str], seconds: float, node_id: str | None = None
) -> list[RawRun]:
    """Conditional writes straight at the emulator with boto3, on scratch copies of the work, nodes
    and outbox tables (same keys, indexes and stream as the app's, but empty).

    Each thread has its own client and its own items. ``UpdateItem``: SET epoch = e + 1 (and a
    holder and a time) on a queued work item on the condition that it is queued at epoch e, as a
    claim's item write does. ``TransactWriteItems``: that update, a ConditionCheck of the thread's
    node item (credential, credential state, liveness, heartbeat age) and a Put of a new outbox
    item on the condition that it does not exist: the shape of a claim's transaction when issue 19
    was written. Then, given ``node_id`` (an enrolled node, whose item as stored is copied), today's
    claim transaction itself (``claim_transaction``), on items shaped like the app's.
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

        kinds = [("conditional UpdateItem", updates), (CLAIM_SHAPED, transactions)]
        runs += _rates_by_threads(endpoint_url, session, seconds, kinds)
        if node_id is not None:
            template = admin.get_item(TableName=names["MODELFORGE_NODES_TABLE"], Key={"node_id": {"S": node_id}})
            if "Item" not in template:
                raise BenchFailure(f"the enrolled node {node_id} is not in the nodes table")
            runs += _claim_transaction_rates(endpoint_url, session, admin, tables, template["Item"], seconds)
    finally:
        for table in tables:
            admin.delete_table(TableName=table)
        admin.close()
    return runs


# --- today's claim transaction, raw -------------------------------------------------------

#: What the raw phases label their rows: the claim's shape when issue 19 was written, and the
#: claim's own transaction today.
CLAIM_SHAPED = "claim-shaped TransactWriteItems"
CLAIM_TRANSACTION = "the claim's own TransactWriteItems"
#: Queued items made for those phases: more than this emulator leases in their time (each lease
#: takes one for good), capped; a phase that runs out ends early, its rate still calls / time.
POOL_PER_SECOND = 400
MAX_POOL = 6000
BATCH = 25


def claim_transaction(
    work_table: str, nodes_table: str, outbox_table: str, work_id: str, node_id: str, credential: str, now: float
) -> list[dict[str, Any]]:
    """A claim's TransactWriteItems as the app sends it (stores/work_store.py ``lease``, captured
    from the local stack; tests/integration/test_claims_bench_transaction.py compares the two): the
    ``work.leased`` event (its payload the write's changes, for replay), the work item from
    queued at epoch 0 to leased at epoch 1 (out of the queue index, into the lease and holder
    indexes), and the node's busy slots up by one on the condition that it may take the item."""
    lease_until = round(now + LEASE_SECONDS, 3)
    event_id = f"{int(now * 1000)}-{uuid.uuid4().hex[:23]}"
    work_set = {
        "status": {"S": "leased"},
        "epoch": {"N": "1"},
        "attempts": {"N": "1"},
        "node_id": {"S": node_id},
        "lease_expires_at": {"N": str(lease_until)},
        "updated_at": {"N": str(round(now, 3))},
        "lease_partition": {"S": f"leased#{int(work_id[-2:], 16) % 16}"},
        "lease_holder": {"S": node_id},
    }
    payload = {
        "changes": [
            {
                "key": {"work_id": {"S": work_id}},
                "op": "update",
                "remove": ["queue_key", "queued_at"],
                "set": dict(sorted(work_set.items())),
                "table": "work",
            },
            {
                "add": {"sb": {"N": "1"}},
                "key": {"node_id": {"S": node_id}},
                "op": "update",
                "remove": [],
                "set": {},
                "table": "nodes",
            },
        ],
        "event_id": event_id,
        "occurred_at": round(now, 3),
        "subject": {"epoch": "1", "node_id": node_id, "work_id": work_id},
        "type": "work.leased",
    }
    names = ["status", "epoch", "attempts", "node_id", "lease_expires_at", "updated_at", "lease_partition"]
    return [
        {
            "Put": {
                "TableName": outbox_table,
                "Item": {
                    "event_id": {"S": event_id},
                    "event_type": {"S": "work.leased"},
                    "expires_at": {"N": str(int(now) + 7 * 86400)},
                    "occurred_at": {"N": str(round(now, 3))},
                    "payload": {"S": json.dumps(payload, separators=(",", ":"), sort_keys=True)},
                },
                "ConditionExpression": "attribute_not_exists (#0)",
                "ExpressionAttributeNames": {"#0": "event_id"},
            }
        },
        {
            "Update": {
                "TableName": work_table,
                "Key": {"work_id": {"S": work_id}},
                "ConditionExpression": "(#0 = :0 AND #1 = :1)",
                "UpdateExpression": "SET #0 = :2, #1 = :3, #2 = :4, #3 = :5, #4 = :6, #5 = :7, #6 = :8, #7 = :9"
                " REMOVE #8, #9",
                "ExpressionAttributeNames": {
                    **{f"#{n}": name for n, name in enumerate([*names, "lease_holder"])},
                    "#8": "queued_at",
                    "#9": "queue_key",
                },
                "ExpressionAttributeValues": {
                    ":0": {"S": "queued"},
                    ":1": {"N": "0"},
                    **{f":{n + 2}": work_set[name] for n, name in enumerate([*names, "lease_holder"])},
                },
            }
        },
        {
            "Update": {
                "TableName": nodes_table,
                "Key": {"node_id": {"S": node_id}},
                "ConditionExpression": "((((((#0 = :0 AND #1 = :1) AND (#2 = :2 AND #3 > :3)) AND contains (#4, :4))"
                " AND attribute_not_exists (#5)) AND (attribute_not_exists (#6) OR #6 < :5)) AND"
                " ((attribute_not_exists (#7) OR (attribute_not_exists (#8) AND #7 > :6)) OR #8 < #7))",
                "UpdateExpression": "ADD #8 :7",
                "ExpressionAttributeNames": {
                    "#0": "credential_sha256",
                    "#1": "credential_state",
                    "#2": "liveness",
                    "#3": "last_heartbeat_at",
                    "#4": "capabilities",
                    "#5": "pk",
                    "#6": "gb",
                    "#7": "sq",
                    "#8": "sb",
                },
                "ExpressionAttributeValues": {
                    ":0": {"S": credential},
                    ":1": {"S": "active"},
                    ":2": {"S": "online"},
                    ":3": {"N": str(now - STALE_AFTER_SECONDS)},
                    ":4": {"S": ECHO},
                    ":5": {"N": "2"},
                    ":6": {"N": "0"},
                    ":7": {"N": "1"},
                },
            }
        },
    ]


def _queued_work_item(work_id: str, now: float) -> dict[str, Any]:
    """A queued echo item as a submit stores it (the fields of stores/models.py ``WorkModel``)."""
    return {
        "work_id": {"S": work_id},
        "capability": {"S": ECHO},
        "status": {"S": "queued"},
        "created_at": {"N": str(round(now, 3))},
        "updated_at": {"N": str(round(now, 3))},
        "attempts": {"N": "0"},
        "max_attempts": {"N": "3"},
        "lease_seconds": {"N": str(LEASE_SECONDS)},
        "epoch": {"N": "0"},
        "input_key": {"S": f"work/input/{work_id}/{'0' * 64}.json"},
        "input_sha256": {"S": "0" * 64},
        "input_size": {"N": "64"},
        "queue_key": {"S": f"{ECHO}#{int(work_id[-2:], 16) % 16}"},
        "queued_at": {"N": str(round(now, 3))},
    }


def _claim_transaction_rates(
    endpoint_url: str,
    session: Any,
    admin: Any,
    tables: list[str],
    node_template: Mapping[str, Any],
    seconds: float,
) -> list[RawRun]:
    """Today's claim transaction at 1 and 10 threads, each call leasing an item of its own from a
    pool of queued items, each thread with a node item of its own made from ``node_template``."""
    work_table, nodes_table, outbox_table = tables
    credential, now = "1" * 64, time.time()
    pool = [f"work_{uuid.uuid4().hex}" for _ in range(min(MAX_POOL, int(2 * POOL_PER_SECOND * seconds)))]
    for start in range(0, len(pool), BATCH):
        requests = [
            {"PutRequest": {"Item": _queued_work_item(work_id, now)}} for work_id in pool[start : start + BATCH]
        ]
        while requests:
            left = admin.batch_write_item(RequestItems={work_table: requests}).get("UnprocessedItems", {})
            requests = left.get(work_table, [])
    node_ids = [f"node_{secrets.token_hex(16)}" for _ in range(max(RAW_THREADS))]
    for node_id in node_ids:
        item = {name: value for name, value in node_template.items() if name not in ("pk", "gb", "sq", "sb")}
        item.update(
            node_id={"S": node_id},
            credential_sha256={"S": credential},
            credential_state={"S": "active"},
            liveness={"S": "online"},
            last_heartbeat_at={"N": str(round(now, 3))},
        )
        admin.put_item(TableName=nodes_table, Item=item)
    left = iter(pool)
    lock = threading.Lock()

    def lease(client: Any, node_id: str) -> Callable[[], None]:
        def call() -> None:
            with lock:
                work_id = next(left, None)
            if work_id is None:
                raise StopIteration
            client.transact_write_items(
                TransactItems=claim_transaction(
                    work_table, nodes_table, outbox_table, work_id, node_id, credential, time.time()
                )
            )

        return call

    return _rates_by_threads(endpoint_url, session, seconds, [(CLAIM_TRANSACTION, lambda c, i: lease(c, node_ids[i]))])


def _rates_by_threads(
    endpoint_url: str, session: Any, seconds: float, kinds: list[tuple[str, Callable[[Any, int], Callable[[], None]]]]
) -> list[RawRun]:
    """Each kind of write for ``seconds`` at each of ``RAW_THREADS``, a client per thread: ``make(client,
    thread index)`` gives a thread its call."""
    runs = []
    for threads in RAW_THREADS:
        clients = [
            _support.emulator_dynamodb(endpoint_url, REGION, REQUEST_TIMEOUT_SECONDS, session) for _ in range(threads)
        ]
        try:
            for what, make in kinds:
                calls, elapsed, latencies = _run_for([make(clients[i], i) for i in range(threads)], seconds)
                runs.append(RawRun(what, threads, calls, elapsed, latencies))
        finally:
            for client in clients:
                client.close()
    return runs


# --- the process and its commands ---------------------------------------------------------


class _Serving:
    """The load generator's state between commands: the nodes it enrolled."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.admin: Any = None

    def enroll(self, base_url: str, count: int) -> int:
        _support.require_loopback(base_url, "the API server")
        self.admin = _new_client(base_url)
        self.nodes = enroll_nodes(base_url, count)
        return len(self.nodes)

    def submit(self, items: int, tag: str) -> set[str]:
        return submit(self.admin, items, tag)

    def heartbeat(self, count: int) -> None:
        heartbeat(self.nodes[:count])

    def claim(self, count: int, items: int) -> Phase:
        return claim_phase(self.nodes[:count], items)

    def warm(self) -> None:
        """One claim, untimed, while nothing is queued: the control plane imports a route's
        services on its first request (a cold start, not what a claim costs)."""
        node = self.nodes[0]
        heartbeat([node])
        answer = node.client.claim(node.identity)
        if answer.status_code != 204:
            raise BenchFailure(f"the warm-up claim answered {answer.status_code}: {_support.brief(answer.text)}")

    def complete(self, claims: list[Claimed], base_url: str) -> list[str]:
        return complete_all(self.nodes, claims, base_url)

    def raw(self, endpoint_url: str, names: dict[str, str], seconds: float) -> list[RawRun]:
        """The raw rates, today's claim transaction on a copy of the first enrolled node's item."""
        _support.require_loopback(endpoint_url, "the AWS emulator")
        node_id = self.nodes[0].identity.node_id if self.nodes else None
        if node_id is None:
            raise BenchFailure("no node is enrolled to copy for the raw claim transaction")
        return raw_write_rates(endpoint_url, names, seconds, node_id)

    def close(self) -> None:
        for node in self.nodes:
            node.client.session.close()
        if self.admin is not None:
            self.admin.session.close()


def serve(connection: Any) -> None:
    """The load generator's main: answer each ``(command, args)`` with ``("ok", value)`` or
    ``("failed", message)`` until ``stop`` (or the bench's end of the pipe closes)."""
    _support.add_loopback_to_no_proxy()
    serving = _Serving()
    try:
        while True:
            try:
                command, args = connection.recv()
            except EOFError:
                return
            if command == "stop":
                return
            try:
                answer: tuple[str, Any] = ("ok", getattr(serving, command)(*args))
            except BenchFailure as failure:
                answer = ("failed", str(failure))
            except Exception as error:  # noqa: BLE001 - reported to the bench, which fails the run
                answer = ("failed", f"unexpected {type(error).__name__}: {error}")
            connection.send(answer)
    finally:
        serving.close()


class Generator:
    """The bench's handle on the load-generator process (spawned: a fresh interpreter)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=serve, args=(child,), name="claims-load-generator", daemon=True)
        self._process.start()
        child.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def call(self, command: str, *args: Any) -> Any:
        self._pipe.send((command, args))
        if not self._pipe.poll(COMMAND_TIMEOUT_SECONDS):
            raise BenchFailure(f"the load generator did not answer {command} within {COMMAND_TIMEOUT_SECONDS} s")
        status, value = self._pipe.recv()
        if status != "ok":
            raise BenchFailure(f"load generator, {command}: {value}")
        return value

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._pipe.send(("stop", ()))
        self._process.join(timeout=15)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)
        self._pipe.close()
