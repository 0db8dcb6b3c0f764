"""The partition-load simulation of bench/partition_load.py: the real DynamoDB store code against
a recording client that counts capacity units per partition key and second (``Recorder``).

See bench/partition_load.py for what it drives and what it states as inputs, docs/SCALE.md for
the figures.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import threading
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
#: Today's defaults: a heartbeat every 15 s, stale after 60 s, so the sweep's buckets are 45 s wide.
HEARTBEAT_INTERVAL_SECONDS = 15
BUCKET_SECONDS = 45
CLAIM_CANDIDATES = 10
#: Stated inputs from SPEC19 (the channel, park and wake are other modules' writes).
WAKE_PER_ITEM = 2
CAPABILITY = "diagnostic.echo"


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


def _index_entry(item: dict[str, Any] | None, hash_attr: str, range_attr: str) -> tuple[str, str] | None:
    if not item or hash_attr not in item or (range_attr and range_attr not in item):
        return None
    return str(next(iter(item[hash_attr].values()))), json.dumps(item.get(range_attr))


def _units(item: dict[str, Any], per: int) -> int:
    return max(1, math.ceil(len(json.dumps(item)) / per))


class Recorder:
    """DynamoDB as far as the work path needs it: items kept per table, GetItem and Query
    answered from them, every request's capacity counted per partition key and second."""

    def __init__(self, schemas: dict[str, tuple[str, dict[str, tuple[str, str, str]]]]) -> None:
        #: table name -> (hash key attribute, {index name: (hash attribute, range attribute, projection)})
        self.schemas = schemas
        self.items: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
        self.counts = Counts()
        self.second = 0
        #: the work store reads queue shards from several threads at once
        self._counting = threading.Lock()

    # --- counting --------------------------------------------------------------------------

    def _write(self, where: str, key: str, units: float) -> None:
        with self._counting:
            self.counts.writes[(where, key)][self.second] += units

    def _read(self, where: str, key: str, units: float) -> None:
        with self._counting:
            self.counts.reads[(where, key)][self.second] += units

    def _index_writes(self, table: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        """DynamoDB's index writes: an entry that appears or goes is one write in its partition; a
        key that changes is two (out of the old place, into the new); an entry whose keys stay is
        rewritten (one write) only when the index projects the attributes that changed (ALL)."""
        for index, (hash_attr, range_attr, projection) in self.schemas[table][1].items():
            old = _index_entry(before, hash_attr, range_attr)
            new = _index_entry(after, hash_attr, range_attr)
            where = f"{table}/{index}"
            if old is not None and new is not None and old == new:
                if projection == "ALL" and before != after:
                    self._write(where, old[0], 1)
                continue
            for entry in (old, new):
                if entry is not None:
                    self._write(where, entry[0], 1)

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
        hash_attr, range_attr, _ = self.schemas[table][1][index]
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
        if kwargs.get("ReturnValues", "NONE") == "NONE":
            return {}
        return {"Attributes": self.items[kwargs["TableName"]][self._key(kwargs["TableName"], kwargs["Key"])]}

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


def _schemas(names: dict[str, str]) -> dict[str, tuple[str, dict[str, tuple[str, str, str]]]]:
    from chalicelib.stores import models

    found: dict[str, tuple[str, dict[str, tuple[str, str, str]]]] = {}
    for model in models.MODELS_BY_LOGICAL_NAME.values():
        hash_attr = next(name for name, attr in model.get_attributes().items() if attr.is_hash_key)
        indexes = {}
        for index in model._indexes.values():
            attributes = index.Meta.attributes
            index_hash = next(name for name, attr in attributes.items() if attr.is_hash_key)
            index_range = next((name for name, attr in attributes.items() if attr.is_range_key), "")
            projection = index.Meta.projection.projection_type
            indexes[index.Meta.index_name] = (index_hash, index_range, projection)
        found[model.Meta.table_name] = (hash_attr, indexes)
    return found


def _node_item(index: int, credential: str) -> dict[str, Any]:
    from chalicelib.domain.records import Node
    from chalicelib.stores.item_records import item_of
    from chalicelib.stores.models import NodeModel

    node = Node(
        node_id=_node_id(index),
        enrollment_id=f"enr_{index:032d}",
        display_name="sim",
        hostname="sim",
        accelerator_mode="cpu",
        production_eligible=True,
        created_at=0.0,
        agent_version="1.0.0",
        protocol_version=1,
        credential_sha256=credential,
        credential_state="active",
        credential_issued_at=0.0,
        liveness="online",
        liveness_changed_at=0.0,
        last_heartbeat_at=0.0,
        capabilities={CAPABILITY},
    )
    item: dict[str, Any] = item_of(node, NodeModel).serialize()
    return item


def _node_id(index: int) -> str:
    return f"node_{(index * 2654435761) % 2**128:032x}"  # spread like random ids


def simulate(
    seconds: int,
    submits_per_second: int,
    nodes: int,
    heartbeat_interval: int = HEARTBEAT_INTERVAL_SECONDS,
    bucket_seconds: int = BUCKET_SECONDS,
) -> tuple[Recorder, float]:
    """Drive the store code for ``seconds`` simulated seconds; the recorder and the wall time."""
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "recorder")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "recorder")
    from chalicelib.config import resources
    from chalicelib.stores import models

    names = {table.name: f"sim-{table.name}" for table in resources.TABLES}
    bound = {
        name: (model.Meta.table_name, getattr(model.Meta, "region", None))
        for name, model in models.MODELS_BY_LOGICAL_NAME.items()
    }
    for table in resources.TABLES:
        model = models.MODELS_BY_LOGICAL_NAME[table.name]
        model.Meta.table_name = names[table.name]
        model.Meta.region = "us-east-1"
        model._connection = None
    try:
        return _drive(names, seconds, submits_per_second, nodes, heartbeat_interval, bucket_seconds)
    finally:  # the models' tables as they were (a test process goes on with its own)
        for name, (table_name, region) in bound.items():
            model = models.MODELS_BY_LOGICAL_NAME[name]
            model.Meta.table_name, model.Meta.region = table_name, region
            model._connection = None


def _drive(
    names: dict[str, str],
    seconds: int,
    submits_per_second: int,
    nodes: int,
    heartbeat_interval: int,
    bucket_seconds: int,
) -> tuple[Recorder, float]:
    from chalicelib.domain.records import Event, Heartbeat, WorkItem
    from chalicelib.stores.contract import Holder
    from chalicelib.stores.node_store import DynamoNodeStore
    from chalicelib.stores.work_store import DynamoWorkStore

    recorder = Recorder(_schemas(names))
    work = DynamoWorkStore(retention_seconds=86400)
    fleet = DynamoNodeStore(retention_seconds=86400, bucket_seconds=bucket_seconds)
    credential = "0" * 64
    beat = Heartbeat(health={"status": "ok"}, telemetry=[], agent_version="1.0.0", protocol_version=1)
    began = time.perf_counter()
    with recording(recorder):
        start = 1_000_000.0
        for index in range(nodes):  # the fleet, online: one node item each (seeded, not counted)
            item = _node_item(index, credential)
            # as its transition to online, one interval before its first heartbeat here, left it (a
            # steady heartbeat no longer moves the index entry)
            last = fleet._index_keys(_node_id(index), "online", start - heartbeat_interval + index % heartbeat_interval)
            item["liveness_shard"] = {"S": last["liveness_shard"]}
            item["heartbeat_bucket"] = {"N": str(last["heartbeat_bucket"])}
            recorder.items[names["nodes"]][_node_id(index)] = item
        serial = 0
        for second in range(seconds):
            recorder.second = second
            now = start + second
            for index in range(nodes):  # each node heartbeats once per interval, spread over it
                if (second - index) % heartbeat_interval == 0:
                    fleet.record_heartbeat(Holder(_node_id(index), credential), beat, now)
            for step in range(submits_per_second):
                serial += 1
                at = now + step / submits_per_second
                work_id = f"work_{serial:032x}"
                item = WorkItem(
                    work_id=work_id,
                    capability=CAPABILITY,
                    status="queued",
                    created_at=at,
                    updated_at=at,
                    attempts=0,
                    max_attempts=3,
                    lease_seconds=60,
                    epoch=0,
                    input_key=f"work-inputs/{work_id}/{'0' * 64}.json",
                    input_sha256="0" * 64,
                    input_size=64,
                    queued_at=at,
                )
                work.create(item, Event("work.submitted", {"work_id": work_id, "capability": CAPABILITY}, at))
            for step in range(submits_per_second):
                at = now + step / submits_per_second
                node_id = _node_id((serial + step) % nodes)
                fleet.get(node_id)  # the claim's node read
                front = work.queue_front(CAPABILITY, CLAIM_CANDIDATES)
                if not front:
                    continue
                candidate = front[step % len(front)]
                holder = Holder(node_id, credential)
                event = Event("work.leased", {"work_id": candidate.work_id, "node_id": node_id, "epoch": "1"}, at)
                leased = work.lease(candidate, holder, at - 60, at + 60, at, event)
                done = Event("work.succeeded", {"work_id": leased.work_id, "node_id": node_id, "epoch": "1"}, at)
                work.complete(leased, holder, {"sha256": "0" * 64, "size": 1, "key": "k"}, at, done)
            # stated inputs (SPEC19), each on one node's own item: per item, WAKE_PER_ITEM parked
            # nodes woken (an un-park write each) and as many parks when they go idle again
            for step in range(submits_per_second * WAKE_PER_ITEM):
                recorder.counts.writes[(names["nodes"], _node_id(step % nodes))][second] += 2
    return recorder, time.perf_counter() - began


def rows(recorder: Recorder) -> list[tuple[str, str, str, float, float]]:
    """(table or index, kind, hottest key, its units in its busiest second, the limit it may use)."""
    found = []
    for kind, limit in (("write", PARTITION_WRITE_UNITS), ("read", PARTITION_READ_UNITS)):
        for where, (key, value) in sorted(recorder.counts.peak(kind).items()):
            found.append((where, kind, key, value, SHARE * limit))
    return found
