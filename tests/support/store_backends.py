"""The two implementations of the store contract, behind one face, for the contract suite
(tests/contract/): the in-memory fakes (``memory_stores.py``) and the DynamoDB stores on the
embedded emulator (tables per test module, emptied before each test).

A contract test seeds records (no guard, no event), reads what a service would read, then lets a
concurrent writer move the item with ``meanwhile`` and calls the store write with the stale read.
``meanwhile`` is a direct write to the table on DynamoDB (made before the call: nothing else runs
between it and the write) and the journal's ``before_next`` hook on the fakes (inside the write,
before its guards are checked). ``refused`` then shows that the write raised GuardFailed and that
nothing changed: every item of every table (the state log's outbox and the online counter
included) or every record, event and write count of the fakes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from chalicelib.config import resources
from chalicelib.domain.errors import GuardFailed
from chalicelib.domain.records import ControlItem, Enrollment, Inventory, Node, WorkItem
from chalicelib.stores import transactions
from chalicelib.stores.contract import Stores
from chalicelib.stores.dynamodb import dynamodb_stores
from chalicelib.stores.item_records import item_of
from chalicelib.stores.models import (
    MODELS_BY_LOGICAL_NAME,
    ControlModel,
    EnrollmentModel,
    GpuClaimModel,
    InventoryModel,
    NodeModel,
    OutboxModel,
    WorkModel,
)
from chalicelib.stores.node_store import bucket, index_partition
from chalicelib.stores.update_actions import update_actions
from chalicelib.stores.work_store import with_index_keys
from modelforge_local_stack.provision import create_table_request, load_resources

from tests.support.emulators import CLIENT_OPTIONS
from tests.support.memory_stores import memory_stores

#: Heartbeat buckets of the node store (as wide as service_bodies.SETTINGS has them).
BUCKET_SECONDS = 45
RETENTION_SECONDS = 86_400
#: What a record kind is called in ``meanwhile`` and ``seed``.
KINDS = ("enrollments", "nodes", "inventories", "control", "work")


class Backend:
    """One implementation of every store, and a concurrent writer that bypasses it."""

    name = ""
    stores: Stores

    def seed(self, record: Any) -> None:
        """Store ``record`` as it is: no guard, no event."""
        raise NotImplementedError

    def meanwhile(self, method: str, kind: str, key: str, **values: Any) -> None:
        """Before the next ``method`` ("work.renew") guard check, someone else sets ``values`` on
        the ``kind`` record ``key`` (None removes a field)."""
        raise NotImplementedError

    def meanwhile_delete(self, method: str, kind: str, key: str) -> None:
        raise NotImplementedError

    def meanwhile_seed(self, method: str, record: Any) -> None:
        """Before the next ``method`` guard check, someone else creates ``record``."""
        raise NotImplementedError

    def snapshot(self) -> Any:
        """Everything stored, the state log and the counters: equal when nothing changed."""
        raise NotImplementedError

    def event_types(self) -> list[str]:
        """The state log's events so far, in order."""
        raise NotImplementedError

    def claims(self, node_id: str) -> set[str]:
        """The GPU UUIDs the node holds a claim on (its claim items on DynamoDB)."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------

    _baseline: Any = None

    def refused(self, write: Callable[[], object]) -> GuardFailed:
        """``write`` raises GuardFailed and changes nothing (after what ``meanwhile`` changed)."""
        self._baseline = self.snapshot()
        with pytest.raises(GuardFailed) as raised:
            write()
        self._after_write()
        assert self.snapshot() == self._baseline
        return raised.value

    def _after_write(self) -> None:
        """Check that every concurrent write the test planned did happen."""


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self) -> None:
        self.stores = memory_stores(BUCKET_SECONDS)

    def _records(self, kind: str) -> dict[str, Any]:
        stores = self.stores
        return {
            "enrollments": stores.enrollments.records,
            "nodes": stores.nodes.records,
            "inventories": stores.nodes.inventories,
            "control": stores.control.records,
            "work": stores.work.records,
        }[kind]

    def seed(self, record: Any) -> None:
        kind = _kind_of(record)
        key = getattr(record, _KEY_OF[kind])
        with self.stores.journal.lock:
            self._records(kind)[key] = copy.deepcopy(record)

    def meanwhile(self, method: str, kind: str, key: str, **values: Any) -> None:
        def write() -> None:
            records = self._records(kind)
            records[key] = dataclasses.replace(records[key], **copy.deepcopy(values))
            self._baseline = self.snapshot()

        self.stores.journal.before_next(method, write)

    def meanwhile_delete(self, method: str, kind: str, key: str) -> None:
        def delete() -> None:
            del self._records(kind)[key]
            self._baseline = self.snapshot()

        self.stores.journal.before_next(method, delete)

    def meanwhile_seed(self, method: str, record: Any) -> None:
        def create() -> None:
            self.seed(record)
            self._baseline = self.snapshot()

        self.stores.journal.before_next(method, create)

    def snapshot(self) -> Any:
        journal = self.stores.journal
        with journal.lock:
            records = {kind: copy.deepcopy(self._records(kind)) for kind in KINDS}
            return records, copy.deepcopy(journal.events), journal.writes

    def event_types(self) -> list[str]:
        return self.stores.journal.event_types()

    def claims(self, node_id: str) -> set[str]:
        return self.stores.nodes.claimed_by(node_id)

    def _after_write(self) -> None:
        assert not self.stores.journal.before_write, "the concurrent write did not run"


_KEY_OF = {
    "enrollments": "enrollment_id",
    "nodes": "node_id",
    "inventories": "node_id",
    "control": "name",
    "work": "work_id",
}
_MODEL_OF = {
    "enrollments": EnrollmentModel,
    "nodes": NodeModel,
    "inventories": InventoryModel,
    "control": ControlModel,
    "work": WorkModel,
}


def _kind_of(record: Any) -> str:
    kinds = {Enrollment: "enrollments", Node: "nodes", Inventory: "inventories", ControlItem: "control"}
    return {**kinds, WorkItem: "work"}[type(record)]


class DynamoBackend(Backend):
    """The DynamoDB stores on the tables ``dynamodb_tables`` made (emptied by ``clear``)."""

    name = "dynamodb"

    def __init__(self, endpoint_url: str, names: dict[str, str]) -> None:
        self.names = names
        definitions = load_resources()
        self.keys = {table.name: definitions[table.logical_id]["Properties"]["KeySchema"] for table in resources.TABLES}
        self.client = boto3.client("dynamodb", endpoint_url=endpoint_url, **CLIENT_OPTIONS)
        # a channel "configured" (never reached: no contract test sends) so that nodes may park
        self.stores = dynamodb_stores(RETENTION_SECONDS, BUCKET_SECONDS, lambda: None, "unused", "http://127.0.0.1:9")

    def seed(self, record: Any) -> None:
        kind = _kind_of(record)
        item = item_of(record, _MODEL_OF[kind])
        if kind == "work":
            keys = with_index_keys(record, {"status": record.status, "queued_at": record.queued_at})
            for name, value in keys.items():
                setattr(item, name, value)
        elif kind == "nodes" and record.last_heartbeat_at is not None:
            item.liveness_shard = index_partition(record.liveness, record.node_id)
            item.heartbeat_bucket = bucket(record.last_heartbeat_at, BUCKET_SECONDS)
        elif kind == "inventories":
            for uuid in record.claimed_uuids or ():
                GpuClaimModel(uuid, record.node_id, claimed_at=record.updated_at).save()
        item.save()

    def meanwhile(self, method: str, kind: str, key: str, **values: Any) -> None:
        model = _MODEL_OF[kind]
        if kind == "work":
            stored = self.stores.work.get(key)
            assert stored is not None
            values = with_index_keys(stored, values)
        model(key).update(actions=update_actions(model, values))

    def meanwhile_delete(self, method: str, kind: str, key: str) -> None:
        _MODEL_OF[kind](key).delete()

    def meanwhile_seed(self, method: str, record: Any) -> None:
        self.seed(record)

    def clear(self) -> None:
        """Delete every item of every table (a fresh start for the next test)."""
        for table in resources.TABLES:
            key_names = [key["AttributeName"] for key in self.keys[table.name]]
            pages = self.client.get_paginator("scan").paginate(TableName=self.names[table.name], ConsistentRead=True)
            for item in [item for page in pages for item in page["Items"]]:
                key = {name: item[name] for name in key_names}
                self.client.delete_item(TableName=self.names[table.name], Key=key)

    def _items(self, table: str) -> list[str]:
        pages = self.client.get_paginator("scan").paginate(TableName=self.names[table], ConsistentRead=True)
        return sorted(json.dumps(item, sort_keys=True) for page in pages for item in page["Items"])

    def snapshot(self) -> Any:
        return {table.name: self._items(table.name) for table in resources.TABLES}

    def event_types(self) -> list[str]:
        events = [json.loads(item) for item in self._items(resources.OUTBOX.name)]
        return [event["event_type"]["S"] for event in sorted(events, key=lambda event: event["event_id"]["S"])]

    def claims(self, node_id: str) -> set[str]:
        found = [json.loads(item) for item in self._items(resources.GPU_CLAIMS.name)]
        return {item["gpu_uuid"]["S"] for item in found if item["node_id"]["S"] == node_id}


@contextmanager
def dynamodb_tables(endpoint_url: str) -> Iterator[dict[str, str]]:
    """Fresh tables on the emulator at ``endpoint_url``, bound to the models while in use (a module
    of tests: binding makes new clients, which is slow); the models, the transaction connection and
    the endpoint are as they were afterwards (so an in-process control plane of another test module
    keeps its own tables)."""
    client = boto3.client("dynamodb", endpoint_url=endpoint_url, **CLIENT_OPTIONS)
    prefix = "contract-" + secrets.token_hex(4)
    names = {table.name: f"{prefix}-{table.name}" for table in resources.TABLES}
    definitions = load_resources()
    for table in resources.TABLES:
        client.create_table(**create_table_request(definitions[table.logical_id]["Properties"], names[table.name]))
    saved_env = {name: os.environ.get(name) for name in _ENVIRONMENT}
    saved_models = {model: (model.Meta.table_name, getattr(model.Meta, "region", None)) for model in _MODELS}
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint_url,
        AWS_ACCESS_KEY_ID=CLIENT_OPTIONS["aws_access_key_id"],
        AWS_SECRET_ACCESS_KEY=CLIENT_OPTIONS["aws_secret_access_key"],
        AWS_DEFAULT_REGION=CLIENT_OPTIONS["region_name"],
        AWS_REGION=CLIENT_OPTIONS["region_name"],
    )
    _bind({model: (names[name], CLIENT_OPTIONS["region_name"]) for name, model in MODELS_BY_LOGICAL_NAME.items()})
    try:
        yield names
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _bind(saved_models)
        for name in names.values():
            client.delete_table(TableName=name)


_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION")
_MODELS = (*MODELS_BY_LOGICAL_NAME.values(), OutboxModel)


def _bind(tables: dict[Any, tuple[str, str | None]]) -> None:
    for model, (table_name, region) in tables.items():
        model.Meta.table_name = table_name
        model.Meta.region = region
        model._connection = None
    transactions.reset_connection()
