"""A small Chalice app with the control plane's three WebSocket handler names, for testing the local
channel server on its own: ``$connect`` accepts ``Authorization: Bearer good`` (401 otherwise, 403
for ``Bearer revoked``), and every event each handler got is recorded."""

from __future__ import annotations

import json
import threading
import types
from dataclasses import dataclass, field
from typing import Any

from chalice import Chalice

GOOD = "Bearer good"


@dataclass
class Recorded:
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, route_key: str) -> list[dict[str, Any]]:
        with self.lock:
            return [event for event in self.events if event["requestContext"]["routeKey"] == route_key]

    def add(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)


def channel_app() -> tuple[types.ModuleType, Recorded]:
    """A module shaped like functions/app.py (``app`` and the three handlers), and what they saw."""
    app = Chalice(app_name="channel-test")
    app.experimental_feature_flags.update({"WEBSOCKETS"})
    recorded = Recorded()

    @app.on_ws_connect()
    def channel_connect(event: Any) -> dict[str, Any]:
        raw = event.to_dict()
        recorded.add(raw)
        authorization = {name.lower(): value for name, value in raw["headers"].items()}.get("authorization")
        if authorization == GOOD:
            return {"statusCode": 200}
        status, code = (403, "credential_revoked") if authorization == "Bearer revoked" else (401, "invalid_ticket")
        return {"statusCode": status, "body": json.dumps({"error": {"code": code, "message": "refused"}})}

    @app.on_ws_message()
    def channel_message(event: Any) -> dict[str, Any]:
        recorded.add(event.to_dict())
        return {"statusCode": 200}

    @app.on_ws_disconnect()
    def channel_disconnect(event: Any) -> dict[str, Any]:
        recorded.add(event.to_dict())
        return {"statusCode": 200}

    module = types.ModuleType("channel_test_app")
    module.app = app  # type: ignore[attr-defined]
    module.channel_connect = channel_connect  # type: ignore[attr-defined]
    module.channel_message = channel_message  # type: ignore[attr-defined]
    module.channel_disconnect = channel_disconnect  # type: ignore[attr-defined]
    return module, recorded
