"""Exponential backoff for transient failures: 1, 2, 4, 8, 16 s with jitter, reset on success."""

from __future__ import annotations

import random
from collections.abc import Callable

#: The nominal delays, in seconds; the last repeats.
STEPS = (1.0, 2.0, 4.0, 8.0, 16.0)
CAP = STEPS[-1]


def jittered(step: float, jitter: Callable[[], float] = random.random) -> float:
    """Between 80% and 100% of the step, so a fleet that lost the control plane together does
    not come back in lockstep; never above the 16 s cap. ``jitter()`` returns a number in [0, 1)."""
    return min(CAP, step * (0.8 + 0.2 * jitter()))


class Backoff:
    """The delay before each retry: ``next_delay()`` after a failure, ``reset()`` after a success."""

    def __init__(self, jitter: Callable[[], float] = random.random) -> None:
        self._failures = 0
        self._jitter = jitter

    def next_delay(self) -> float:
        """The nominal step for this failure (1..16 s), advanced for the next one."""
        step = STEPS[min(self._failures, len(STEPS) - 1)]
        self._failures += 1
        return step

    def jittered(self, step: float) -> float:
        """``step`` with this backoff's jitter (see the module's ``jittered``)."""
        return jittered(step, self._jitter)

    def reset(self) -> None:
        self._failures = 0

    @property
    def failures(self) -> int:
        return self._failures
