"""What the work thread and the publishing thread tell each other: the stop signal, the hint that
work is waiting, and the first fatal failure, handed over to stop the agent as a heartbeat would
(``halt``; the publishing thread raises ``fatal`` and ``exit_codes`` maps it)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..failures import Classified, Kind


class Signals:
    def __init__(self, stop: threading.Event | None = None) -> None:
        #: set when the work loop is to stop (``WorkRunner.close``, or a fatal failure)
        self.stop = stop if stop is not None else threading.Event()
        #: set by a heartbeat answer saying ``work_waiting`` (and by ``close``, to wake the thread)
        self.hinted = threading.Event()
        #: the first fatal failure on the work thread
        self.fatal: BaseException | None = None
        #: what the control plane advertises (its answers' ``features``), as last heard
        self.features: frozenset[str] = frozenset()
        self._wake: Callable[[], None] | None = None

    def wake_with(self, wake: Callable[[], None] | None) -> None:
        """What to call so the publishing thread looks at ``fatal`` at once (its stop's ``set``)."""
        self._wake = wake

    def stopping(self) -> bool:
        return self.stop.is_set()

    def close(self) -> None:
        self.stop.set()
        self.hinted.set()

    def halt(self, error: BaseException) -> None:
        """Stop the work loop and hand ``error`` to the publishing thread (the first one wins)."""
        if self.fatal is None:
            self.fatal = error
        self.close()
        if self._wake is not None:
            self._wake()

    def take(self, failure: Classified) -> bool:
        """Halt on a fatal control-plane failure (a redirect, a refused credential); whether it was one."""
        if failure.kind is Kind.FATAL:
            self.halt(failure.error)
            return True
        return False
