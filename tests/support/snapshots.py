"""Read the whole local state (tables and state-log bucket) to compare before and after."""

from __future__ import annotations

from typing import Any

import boto3
from chalicelib.config import resources
from modelforge_local_stack.emulator import READ_OPERATIONS

TABLE_VARS = tuple(table.env_var for table in resources.TABLES)


def _client(service: str, endpoint_url: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def scan_table(endpoint_url: str, table: str) -> list[dict[str, Any]]:
    dynamodb = _client("dynamodb", endpoint_url)
    items: list[dict[str, Any]] = []
    for page in dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        items.extend(page["Items"])
    return items


def bucket_objects(endpoint_url: str, bucket: str, prefix: str = "") -> dict[str, bytes]:
    s3 = _client("s3", endpoint_url)
    objects = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for entry in page.get("Contents", []):
            objects[entry["Key"]] = s3.get_object(Bucket=bucket, Key=entry["Key"])["Body"].read()
    return objects


def writes_so_far(stack: Any) -> dict[str, int]:
    """The emulator's count of every operation that can change state, by operation (the app's
    own calls: the stream poller's, prefixed "poller:", are left out), accepted or refused."""
    return {
        operation: count
        for operation, count in stack.aws_operations().items()
        if not operation.startswith("poller:") and operation not in READ_OPERATIONS
    }


def accepted_writes(stack: Any) -> int:
    """How many app writes the emulator has accepted so far. DynamoDB and S3 change nothing on a
    refused write, so while this has not moved, no app request has changed the state."""
    return int(stack.aws_changes())


def state_log_objects(endpoint_url: str, bucket: str) -> dict[str, bytes]:
    """The state log's event objects (the bucket also holds work inputs and results)."""
    return bucket_objects(endpoint_url, bucket, resources.STATE_LOG_PREFIX)


def state(endpoint_url: str, names: dict[str, str]) -> dict[str, Any]:
    """Every item of every table, keyed for order-independent comparison, and every log object."""
    snapshot: dict[str, Any] = {}
    for var in TABLE_VARS:
        items = scan_table(endpoint_url, names[var])
        snapshot[var] = sorted(items, key=lambda item: repr(sorted(item.items())))
    snapshot["state_log"] = bucket_objects(endpoint_url, names["MODELFORGE_STATE_LOG_BUCKET"])
    return snapshot
