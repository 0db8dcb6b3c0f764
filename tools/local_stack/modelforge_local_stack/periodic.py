"""A daemon thread that runs one action at a fixed interval until stopped (the local stand-in for
a Lambda trigger): a failure is logged once per run and the loop goes on."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any


class Periodic:
    def __init__(
        self,
        name: str,
        interval_seconds: float,
        action: Callable[[], Any],
        *,
        log: logging.Logger,
        failure: str,
        failure_event: str,
        run_first: bool = False,
    ) -> None:
        """``run_first``: run once at start, then every interval (else: wait an interval first)."""
        self._interval = interval_seconds
        self._action = action
        self._log, self._failure, self._failure_event = log, failure, failure_event
        self._run_first = run_first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        if not self._run_first and self._stop.wait(self._interval):
            return
        while not self._stop.is_set():
            try:
                self._action()
            except Exception:
                self._log.exception(self._failure, extra={"event": self._failure_event})
            self._stop.wait(self._interval)
