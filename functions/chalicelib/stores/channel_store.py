"""Sending on the nodes' channel connections: API Gateway's management API (stores.ChannelStore).

The client is made on first use (boto3 is not imported at cold start), with the endpoint settings
name (``MODELFORGE_CHANNEL_MANAGEMENT_URL``: the WebSocket API stage's https endpoint on AWS, the
local stack's management port locally). A connection that is gone answers 410 (GoneException).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from modelforge_protocol import schemas

#: Seconds a post or delete may take, tried once: a send is a hint (the heartbeat's hint is the
#: backstop), never worth holding the submit or cancel that makes it for long.
CONNECT_TIMEOUT_SECONDS = 1
READ_TIMEOUT_SECONDS = 2


class ApiGatewayChannelStore:
    def __init__(self, endpoint_url: str | None) -> None:
        self._endpoint_url = endpoint_url
        self._client: Any = None
        self._lock = threading.Lock()

    def _management(self) -> Any:
        with self._lock:
            if self._client is None:
                if not self._endpoint_url:
                    raise RuntimeError("no channel management URL is configured (MODELFORGE_CHANNEL_MANAGEMENT_URL)")
                import boto3
                from botocore.config import Config

                config = Config(
                    connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    read_timeout=READ_TIMEOUT_SECONDS,
                    retries={"total_max_attempts": 1},
                )
                region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
                self._client = boto3.client(
                    "apigatewaymanagementapi", endpoint_url=self._endpoint_url, region_name=region, config=config
                )
            return self._client

    def send(self, connection_id: str, message: dict[str, Any]) -> bool:
        data = json.dumps(message, separators=(",", ":")).encode("utf-8")
        if len(data) > schemas.MAX_CHANNEL_MESSAGE_BYTES:
            raise ValueError("a channel message is at most MAX_CHANNEL_MESSAGE_BYTES")
        management = self._management()
        try:
            management.post_to_connection(ConnectionId=connection_id, Data=data)
        except management.exceptions.GoneException:
            return False
        return True

    def close(self, connection_id: str) -> None:
        management = self._management()
        try:
            management.delete_connection(ConnectionId=connection_id)
        except management.exceptions.GoneException:
            return
