"""Invoke the deployed scheduled function at a fixed interval, as EventBridge would."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .periodic import Periodic

log = logging.getLogger("modelforge.local.scheduler")


class Scheduler:
    def __init__(self, handler: Callable[[dict[str, Any], Any], Any], interval_seconds: float) -> None:
        self._loop = Periodic(
            "scheduler",
            interval_seconds,
            lambda: handler(scheduled_event(), None),
            log=log,
            failure="scheduled function failed",
            failure_event="schedule_failed",
        )

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()


def scheduled_event(region: str = "us-east-1") -> dict[str, Any]:
    """An event shaped like the one EventBridge delivers to a scheduled Lambda function."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:events:{region}:000000000000:rule/modelforge-local-liveness-sweep"],
        "detail": {},
    }
