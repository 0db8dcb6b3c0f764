"""Enrolled-node items written straight into a nodes table (``BatchWriteItem``, no API calls), for
bench/sweep.py and tests/integration/test_sweep_scale.py: a fleet at a size the API would take
minutes to enroll."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from typing import Any

from .support import BenchFailure, emulator_dynamodb

REGION = "us-east-1"
#: BatchWriteItem's limit on items per call.
BATCH_SIZE = 25
#: GPUs in each synthetic node's telemetry (the node item is as large as a real 8-GPU node's).
GPUS = 8
REQUEST_TIMEOUT_SECONDS = 60


def new_node_id(prefix: str = "") -> str:
    """A node id shaped like the enrollment's (``node_`` + 32 hex); ``prefix`` (hex) leads."""
    return "node_" + (prefix + secrets.token_hex(16))[:32]


def telemetry_rows(gpus: int = GPUS) -> list[list[float]]:
    """Per-GPU rows in ``TELEMETRY_COLUMNS`` order, with the values the test agent reports."""
    return [[index, 87.5, 101234567890, 143771336704, 64, 612.4] for index in range(gpus)]


def node_item(node_id: str, last_heartbeat_at: float, bucket_seconds: int, created_at: float) -> dict[str, Any]:
    """The raw DynamoDB item of an enrolled node that is online and last heartbeated then.

    Built with ``NodeModel`` (so every required attribute is there, typed as the model types
    it) and serialised to the low-level wire format ``BatchWriteItem`` takes. The sweep's index
    keys are what a heartbeat writes: ``liveness_shard = index_partition('online', node_id)`` and
    ``heartbeat_bucket = bucket(last_heartbeat_at, settings.sweep_bucket_seconds)``.
    """
    from chalicelib.domain import liveness
    from chalicelib.stores.models import NodeModel

    beat = round(last_heartbeat_at, 3)
    created = round(created_at, 3)
    node = NodeModel(
        node_id,
        enrollment_id="enr_" + node_id[5:],
        display_name=f"sweep bench {node_id[-6:]}",
        hostname=f"bench-{node_id[-12:]}",
        accelerator_mode="nvidia",
        production_eligible=False,
        created_at=created,
        agent_version="1.3.0",
        protocol_version=1,
        credential_sha256=secrets.token_hex(32),
        credential_state="active",
        credential_issued_at=created,
        liveness=liveness.ONLINE,
        liveness_changed_at=created,
        last_heartbeat_at=beat,
        health={"status": "ok"},
        telemetry=telemetry_rows(),
        liveness_shard=liveness.index_partition(liveness.ONLINE, node_id),
        heartbeat_bucket=liveness.bucket(beat, bucket_seconds),
    )
    return node.serialize()


def dynamodb_client(endpoint_url: str) -> Any:
    """A low-level DynamoDB client for the emulator on 127.0.0.1 (no proxies, no retries)."""
    return emulator_dynamodb(endpoint_url, REGION, REQUEST_TIMEOUT_SECONDS)


def batch_write(client: Any, table: str, requests: Iterable[dict[str, Any]]) -> int:
    """``BatchWriteItem`` in calls of 25 requests, resending unprocessed ones; returns the calls made.

    Each request is ``{"PutRequest": {"Item": ...}}`` or ``{"DeleteRequest": {"Key": ...}}``.
    """
    pending = list(requests)
    calls = 0
    for start in range(0, len(pending), BATCH_SIZE):
        chunk = {table: pending[start : start + BATCH_SIZE]}
        for _ in range(10):
            calls += 1
            chunk = client.batch_write_item(RequestItems=chunk).get("UnprocessedItems") or {}
            if not chunk:
                break
            time.sleep(0.05)
        else:
            raise BenchFailure(f"BatchWriteItem left items unprocessed after 10 tries on {table}")
    return calls


def put_nodes(client: Any, table: str, items: Iterable[dict[str, Any]]) -> int:
    return batch_write(client, table, ({"PutRequest": {"Item": item}} for item in items))


def delete_nodes(client: Any, table: str, node_ids: Iterable[str]) -> int:
    return batch_write(client, table, ({"DeleteRequest": {"Key": {"node_id": {"S": node_id}}}} for node_id in node_ids))
