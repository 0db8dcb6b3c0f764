"""Feed the outbox table's DynamoDB Stream to the deployed state-log handler, as Lambda would."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

from .emulator import POLLER_USER_AGENT
from .periodic import Periodic

log = logging.getLogger("modelforge.local.stream")


class StreamPoller:
    """Poll every shard of one table's stream and hand batches to ``handler(event, context)``.

    A batch is delivered until the handler returns without raising (at-least-once, like the
    Lambda event source mapping); the handler must therefore be idempotent.
    """

    def __init__(
        self,
        endpoint_url: str,
        table_name: str,
        handler: Callable[[dict[str, Any], Any], Any],
        *,
        region: str = "us-east-1",
        interval_seconds: float = 0.2,
    ) -> None:
        tagged = Config(user_agent_extra=POLLER_USER_AGENT)
        self._dynamodb = boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region, config=tagged)
        self._streams = boto3.client("dynamodbstreams", endpoint_url=endpoint_url, region_name=region, config=tagged)
        self._table_name = table_name
        self._handler = handler
        self._iterators: dict[str, str] = {}
        self._poll_lock = threading.Lock()
        self._loop = Periodic(
            "stream-poller",
            interval_seconds,
            self.poll_once,
            log=log,
            failure="stream poll failed; retrying",
            failure_event="stream_poll_failed",
            run_first=True,
        )
        self.delivered = 0

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def poll_once(self) -> int:
        """Deliver every record available now; return how many were delivered."""
        with self._poll_lock:
            return self._poll_all_shards()

    def _poll_all_shards(self) -> int:
        stream_arn = self._dynamodb.describe_table(TableName=self._table_name)["Table"]["LatestStreamArn"]
        shards = self._streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]
        delivered = 0
        for shard in shards:
            shard_id = shard["ShardId"]
            if shard_id not in self._iterators:
                self._iterators[shard_id] = self._streams.get_shard_iterator(
                    StreamArn=stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            while True:
                page = self._streams.get_records(ShardIterator=self._iterators[shard_id], Limit=100)
                records = page.get("Records", [])
                if records:
                    for record in records:
                        _as_lambda_record(record, stream_arn)
                    self._handler({"Records": records}, None)
                    delivered += len(records)
                # advance only after the handler succeeded (at-least-once)
                next_iterator = page.get("NextShardIterator")
                if next_iterator is None:  # the shard is closed and fully read
                    del self._iterators[shard_id]
                    break
                self._iterators[shard_id] = next_iterator
                if not records:
                    break
        self.delivered += delivered
        return delivered


def _as_lambda_record(record: dict[str, Any], stream_arn: str) -> None:
    """Shape a GetRecords record like the one Lambda delivers (epoch seconds, source ARN)."""
    record.setdefault("eventSourceARN", stream_arn)
    created = record.get("dynamodb", {}).get("ApproximateCreationDateTime")
    if hasattr(created, "timestamp"):
        record["dynamodb"]["ApproximateCreationDateTime"] = created.timestamp()
