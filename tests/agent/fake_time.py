"""Fake time for the work loop's pieces (``work.timing.Timing``): ``wait`` advances the clock
instead of sleeping, so a renewal or a backoff is scheduled without waiting on real time."""

from __future__ import annotations

import threading

from modelforge_node_agent.work.timing import Timing


class FakeTime:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        #: every wait asked for, in seconds, in order
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Set already: True at once; else the clock moves ``seconds`` on and the event is looked at."""
        if event.is_set():
            return True
        self.waits.append(seconds)
        self.now += seconds
        return event.is_set()

    def timing(self) -> Timing:
        return Timing(clock=self.clock, wait=self.wait)


class StillTime(FakeTime):
    """Fake time that moves only when a test moves it: ``wait`` returns when its event is set
    (a thread waiting on a renewal interval waits until it is stopped), never by timing out."""

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        return event.wait(10.0)  # a bound on a broken test, not a timing
