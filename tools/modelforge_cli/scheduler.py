"""Invoke the deployed scheduled function at a fixed interval, as EventBridge would."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

log = logging.getLogger("modelforge.local.scheduler")


class Scheduler:
    def __init__(self, handler: Callable[[dict[str, Any], Any], Any], interval_seconds: float) -> None:
        self._handler = handler
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._handler(scheduled_event(), None)
            except Exception:
                log.exception("scheduled function failed", extra={"event": "schedule_failed"})


def scheduled_event(region: str = "us-east-1") -> dict[str, Any]:
    """An event shaped like the one EventBridge delivers to a scheduled Lambda function."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:events:{region}:000000000000:rule/modelforge-local-liveness-sweep"],
        "detail": {},
    }
