"""Wait for a state by polling with a deadline: the suite's one way to wait (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Call ``predicate`` until it returns something true, and return that.

    After ``timeout`` seconds, fail with an AssertionError naming ``what`` was waited for (and
    ``detail()``, e.g. a process's output, when given). An exception raised by ``predicate`` ends
    the wait at once: that is how a caller stops waiting on a process that has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout} s waiting for {what}"
            raise AssertionError(f"{message}:\n{detail()}" if detail else message)
        time.sleep(interval)
