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
import collections
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: DynamoDB's per-partition limits, and the share of them the design may use.
PARTITION_WRITE_UNITS, PARTITION_READ_UNITS = 1000, 3000
SHARE = 0.5
#: Limits that bind before DynamoDB's (stated in docs/SCALE.md and printed with the table).
API_GATEWAY_NEW_CONNECTIONS_PER_SECOND = 500
LAMBDA_DEFAULT_CONCURRENCY = 1000
HEARTBEAT_INTERVAL_SECONDS = 60
#: Stated inputs from SPEC19 (the channel, park and wake are other modules' writes).
WAKE_PER_ITEM = 2
CAPABILITY = "diagnostic.echo"
MAX_SECONDS, MAX_SUBMITS, MAX_NODES = 10, 5000, 100_000


@dataclass
class Counts:
    #: (table or "table/index", partition key) -> second -> units
    writes: dict[tuple[str, str], collections.Counter[int]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    reads: dict[tuple[str, str], collections.Counter[float]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    requests: collections.Counter[str] = field(default_factory=collections.Counter)

    def peak(self, kind: str) -> dict[str, tuple[str, float]]:
        """Per table or index: its hottest partition key and that key's busiest second."""
        source = self.writes if kind == "write" else self.reads
        found: dict[str, tuple[str, float]] = {}
        for (where, key), seconds in source.items():
            value = max(seconds.values(), default=0)
            if value > found.get(where, ("", -1.0))[1]:
                found[where] = (key, float(value))
        return found


def _units(item: dict[str, Any], per: int) -> int:
    return max(1, math.ceil(len(json.dumps(item)) / per))


class Recorder:
    """DynamoDB as far as the work path needs it: items kept per table, GetItem and Query
    answered from them, every request's capacity counted per partition key and second."""

    def __init__(self, schemas: dict[str, tuple[str, dict[str, tuple[str, str]]]]) -> None:
        #: table name -> (hash key attribute, {index name: (hash attribute, range attribute)})
        self.schemas = schemas
        self.items: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
        self.counts = Counts()
        self.second = 0

    # --- counting --------------------------------------------------------------------------

    def _write(self, where: str, key: str, units: float) -> None:
        self.counts.writes[(where, key)][self.second] += units

    def _read(self, where: str, key: str, units: float) -> None:
        self.counts.reads[(where, key)][self.second] += units

    def _index_writes(self, table: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        for index, (hash_attr, _) in self.schemas[table][1].items():
            old = (before or {}).get(hash_attr)
            new = (after or {}).get(hash_attr)
            if old == new and old is not None and before == after:
                continue
            for value in {json.dumps(old), json.dumps(new)} - {"null"}:
                self._write(f"{table}/{index}", json.loads(value)["S"], 1)

    # --- the requests ------------------------------------------------------------------------

    def call(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.counts.requests[operation] += 1
        handler = getattr(self, f"_{operation}", None)
        if handler is None:
            raise NotImplementedError(f"the recorder does not answer {operation}")
        answer: dict[str, Any] = handler(kwargs)
        return answer

    def _key(self, table: str, key: dict[str, Any]) -> str:
        return str(key[self.schemas[table][0]]["S"])

    def _GetItem(self, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: N802 - DynamoDB's name
        table = kwargs["TableName"]
        key = self._key(table, kwargs["Key"])
        item = self.items[table].get(key)
        self._read(table, key, (1 if kwargs.get("ConsistentRead") else 0.5) * _units(item or {}, 4096))
        return {"Item": item} if item is not None else {}

    def _Query(self, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        table, index = kwargs["TableName"], kwargs["IndexName"]
        hash_attr, range_attr = self.schemas[table][1][index]
        names = kwargs.get("ExpressionAttributeNames", {})
        values = kwargs["ExpressionAttributeValues"]
        wanted = next(
            values[v]
            for n, v in re.findall(r"(#\w+) = (:\w+)", kwargs["KeyConditionExpression"])
            if names.get(n, n) == hash_attr
        )
        found = [item for item in self.items[table].values() if item.get(hash_attr) == wanted]
        found.sort(key=lambda item: float(item.get(range_attr, {}).get("N", "0")))
        found = found[: kwargs.get("Limit", len(found))]
        size = sum(len(json.dumps(item)) for item in found)
        self._read(f"{table}/{index}", wanted["S"], 0.5 * max(1, math.ceil(size / 4096)))
        return {"Items": found, "Count": len(found), "ScannedCount": len(found)}

    def _put(self, table: str, item: dict[str, Any], transactional: bool) -> None:
        key = self._key(table, item)
        before = self.items[table].get(key)
        self.items[table][key] = item
        self._write(table, key, _units(item, 1024) * (2 if transactional else 1))
        self._index_writes(table, before, item)

    def _update(self, entry: dict[str, Any], transactional: bool) -> None:
        table = entry["TableName"]
        key = self._key(table, entry["Key"])
        before = self.items[table].get(key)
        item = dict(before or entry["Key"])
        names = entry.get("ExpressionAttributeNames", {})
        values = entry.get("ExpressionAttributeValues", {})
        expression = entry.get("UpdateExpression", "")
        removing = re.search(r"REMOVE (.*?)(?: SET |$)", expression)
        setting = re.search(r"SET (.*?)(?: REMOVE |$)", expression)
        if setting:
            for name, value in re.findall(r"(#\w+) = (:\w+)", setting.group(1)):
                item[names.get(name, name)] = values[value]
        if removing:
            for name in re.findall(r"#\w+", removing.group(1)):
                item.pop(names.get(name, name), None)
        self.items[table][key] = item
        self._write(table, key, _units(item, 1024) * (2 if transactional else 1))
        self._index_writes(table, before, item)

    def _UpdateItem(self, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        self._update(kwargs, transactional=False)
        return {}

    def _PutItem(self, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        self._put(kwargs["TableName"], kwargs["Item"], transactional=False)
        return {}

    def _TransactWriteItems(self, kwargs: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        for entry in kwargs["TransactItems"]:
            ((kind, body),) = entry.items()
            if kind == "Put":
                self._put(body["TableName"], body["Item"], transactional=True)
            elif kind == "Update":
                self._update(body, transactional=True)
            elif kind == "ConditionCheck":
                # a condition check in a transaction is priced as a transactional write of the item
                table = body["TableName"]
                key = self._key(table, body["Key"])
                self._write(table, key, 2 * _units(self.items[table].get(key) or {}, 1024))
            else:
                raise NotImplementedError(f"the recorder does not answer a {kind} in a transaction")
        return {}


@contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """PynamoDB's every request goes to ``recorder`` instead of botocore."""
    from pynamodb.connection.base import Connection

    original = Connection._make_api_call

    def answer(self: Any, operation_name: str, operation_kwargs: dict[str, Any]) -> dict[str, Any]:
        return recorder.call(operation_name, operation_kwargs)

    Connection._make_api_call = answer  # type: ignore[method-assign]
    try:
        yield
    finally:
        Connection._make_api_call = original  # type: ignore[method-assign]


def _schemas(names: dict[str, str]) -> dict[str, tuple[str, dict[str, tuple[str, str]]]]:
    from chalicelib.stores import models

    found: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {}
    for model in models.MODELS_BY_LOGICAL_NAME.values():
        hash_attr = next(name for name, attr in model.get_attributes().items() if attr.is_hash_key)
        indexes = {}
        for index in model._indexes.values():
            attributes = index.Meta.attributes
            index_hash = next(name for name, attr in attributes.items() if attr.is_hash_key)
            index_range = next((name for name, attr in attributes.items() if attr.is_range_key), "")
            indexes[index.Meta.index_name] = (index_hash, index_range)
        found[model.Meta.table_name] = (hash_attr, indexes)
    return found


def simulate(seconds: int, submits_per_second: int, nodes: int) -> tuple[Recorder, float]:
    """Drive the store code for ``seconds`` simulated seconds; the recorder and the wall time."""
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "recorder")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "recorder")
    from chalicelib.config import resources
    from chalicelib.domain.records import Event, Node, WorkItem
    from chalicelib.stores import models
    from chalicelib.stores.contract import Holder
    from chalicelib.stores.node_store import DynamoNodeStore  # noqa: F401 - the node reads' store
    from chalicelib.stores.work_store import DynamoWorkStore

    names = {table.name: f"sim-{table.name}" for table in resources.TABLES}
    for table in resources.TABLES:
        model = models.MODELS_BY_LOGICAL_NAME[table.name]
        model.Meta.table_name = names[table.name]
        model.Meta.region = "us-east-1"
        model._connection = None
    recorder = Recorder(_schemas(names))
    work = DynamoWorkStore(retention_seconds=86400)
    from chalicelib.stores import node_store as node_store_module

    credential = "0" * 64
    began = time.perf_counter()
    with recording(recorder):
        # the fleet: one node item each (seeded, not counted)
        for index in range(nodes):
            node_id = f"node_{index:032d}"
            recorder.items[names["nodes"]][node_id] = {
                "node_id": {"S": node_id},
                "credential_sha256": {"S": credential},
                "credential_state": {"S": "active"},
                "liveness": {"S": "online"},
                "last_heartbeat_at": {"N": "0"},
                "capabilities": {"SS": [CAPABILITY]},
            }
        store_nodes = node_store_module.DynamoNodeStore  # type: ignore[attr-defined]
        del store_nodes
        serial = 0
        for second in range(seconds):
            recorder.second = second
            now = 1_000_000.0 + second
            for step in range(submits_per_second):
                serial += 1
                at = now + step / submits_per_second
                item = WorkItem(
                    work_id=f"work_{serial:032x}",
                    capability=CAPABILITY,
                    status="queued",
                    created_at=at,
                    updated_at=at,
                    attempts=0,
                    max_attempts=3,
                    lease_seconds=60,
                    epoch=0,
                    input_key=f"work-inputs/work_{serial:032x}/{'0' * 64}.json",
                    input_sha256="0" * 64,
                    input_size=64,
                    queued_at=at,
                )
                work.create(item, Event("work.submitted", {"work_id": item.work_id, "capability": CAPABILITY}, at))
            for step in range(submits_per_second):
                at = now + step / submits_per_second
                node_id = f"node_{(serial + step) % nodes:032d}"
                models.NodeModel.get(node_id, consistent_read=True)  # the claim's node read
                front = work.queue_front(CAPABILITY, 10)
                if not front:
                    continue
                candidate = front[step % len(front)]
                holder = Holder(node_id, credential)
                event = Event("work.leased", {"work_id": candidate.work_id, "node_id": node_id, "epoch": "1"}, at)
                leased = work.lease(candidate, holder, at - 60, at + 60, at, event)
                done = Event("work.succeeded", {"work_id": leased.work_id, "node_id": node_id, "epoch": "1"}, at)
                work.complete(leased, holder, {"sha256": "0" * 64, "size": 1, "key": "k"}, at, done)
        # stated inputs (SPEC19): per node, a heartbeat UpdateItem of its own item per interval
        # (the ticket hash inside it), one park write per idle transition, and per item at most
        # WAKE_PER_ITEM wake writes, each on one parked node's own item
        nodes_table = names["nodes"]
        for second in range(seconds):
            for index in range(nodes):
                if (index + second) % HEARTBEAT_INTERVAL_SECONDS == 0:
                    recorder.counts.writes[(nodes_table, f"node_{index:032d}")][second] += 1
            for step in range(submits_per_second):
                for wake in range(WAKE_PER_ITEM):
                    key = (nodes_table, f"node_{(step * WAKE_PER_ITEM + wake) % nodes:032d}")
                    recorder.counts.writes[key][second] += 1 + 1  # the park, then the wake's un-park
    del Node
    return recorder, time.perf_counter() - began


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


def rows(recorder: Recorder) -> list[tuple[str, str, str, float, float]]:
    """(table or index, kind, hottest key, its units in its busiest second, the limit it may use)."""
    found = []
    for kind, limit in (("write", PARTITION_WRITE_UNITS), ("read", PARTITION_READ_UNITS)):
        for where, (key, value) in sorted(recorder.counts.peak(kind).items()):
            found.append((where, kind, key, value, SHARE * limit))
    return found


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
