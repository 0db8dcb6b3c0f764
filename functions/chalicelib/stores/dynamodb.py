"""The production stores: DynamoDB tables through PynamoDB, and objects in S3."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chalicelib.stores.channel_store import ApiGatewayChannelStore
from chalicelib.stores.contract import Stores
from chalicelib.stores.control_store import DynamoControlStore
from chalicelib.stores.enrollment_store import DynamoEnrollmentStore
from chalicelib.stores.node_store import DynamoNodeStore
from chalicelib.stores.object_store import S3ObjectStore
from chalicelib.stores.park_store import DynamoParkStore
from chalicelib.stores.work_store import DynamoWorkStore


def dynamodb_stores(
    retention_seconds: int,
    bucket_seconds: int,
    s3_client: Callable[[], Any],
    bucket: str,
    channel_management_url: str | None = None,
) -> Stores:
    """Stores over the tables ``models.bind_tables`` bound (events kept ``retention_seconds``, the
    sweep index's heartbeat buckets ``bucket_seconds`` wide), the work objects in ``bucket`` (the
    S3 client made by ``s3_client`` when first needed) and the channel's connections behind
    ``channel_management_url`` (None: no channel)."""
    return Stores(
        enrollments=DynamoEnrollmentStore(retention_seconds),
        nodes=DynamoNodeStore(retention_seconds, bucket_seconds),
        control=DynamoControlStore(retention_seconds),
        work=DynamoWorkStore(retention_seconds),
        objects=S3ObjectStore(s3_client, bucket),
        parking=DynamoParkStore(enabled=channel_management_url is not None),
        channel=ApiGatewayChannelStore(channel_management_url),
    )
