"""Invoke the deployed scheduled function at a fixed interval, as EventBridge would."""

from __future__ import annotations

import logging
import threading
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
                self._handler({"source": "modelforge.local.scheduler", "detail-type": "Scheduled Event"}, None)
            except Exception:
                log.exception("scheduled function failed", extra={"event": "schedule_failed"})
