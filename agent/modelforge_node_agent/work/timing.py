"""The work loop's time, injected: a monotonic ``clock`` and ``wait``, the only way it sleeps.

``wait(event, seconds)`` waits until ``event`` is set or ``seconds`` pass and says whether the
event was set (``threading.Event.wait``). A test passes a fake that advances a fake clock instead
of sleeping, so no test of the work loop waits on real time for a renewal or a backoff.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]
Wait = Callable[[threading.Event, float], bool]


def wait_on(event: threading.Event, seconds: float) -> bool:
    """Real time: block until ``event`` is set or ``seconds`` pass."""
    return event.wait(seconds)


@dataclass(frozen=True)
class Timing:
    clock: Clock = time.monotonic
    wait: Wait = wait_on
