"""NVML calls with a time bound: each batch runs on a daemon thread and is waited for at most
``timeout_seconds``.

A wedged driver can block inside the NVML library forever, and it must never hang the agent. A
caller that gives up gets ``NoAnswer``; if the call answers later, its value is handed to
``discard`` (for example to shut down a probe nobody will use), so a late answer never leaks an
open NVML session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from .gpu import GpuProbe

T = TypeVar("T")

#: The default time bound of one batch of NVML calls (MODELFORGE_AGENT_PREFLIGHT_TIMEOUT_SECONDS).
DEFAULT_TIMEOUT_SECONDS = 10.0


class NoAnswer(Exception):
    """The call did not finish within its time bound."""


class BoundedCall(Generic[T]):
    """One call run in a daemon thread, handed back only if the caller is still waiting."""

    def __init__(self, work: Callable[[], T], discard: Callable[[T], None] | None = None) -> None:
        self._work = work
        self._discard = discard
        self._lock = threading.Lock()
        self._finished = False
        self._abandoned = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self.done = threading.Event()

    def start(self, name: str) -> BoundedCall[T]:
        threading.Thread(target=self._run, name=name, daemon=True).start()
        return self

    def _run(self) -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = self._work()
        except BaseException as caught:  # noqa: BLE001 - handed to the caller, who re-raises it
            error = caught
        with self._lock:
            self._finished, self._value, self._error = True, value, error
            late = self._abandoned
        self.done.set()
        if late and error is None and self._discard is not None:
            self._discard(value)  # type: ignore[arg-type]

    def result(self, timeout_seconds: float) -> T:
        """The value, the call's own exception, or ``NoAnswer`` after ``timeout_seconds``."""
        self.done.wait(timeout_seconds)
        with self._lock:
            if not self._finished:
                self._abandoned = True
                raise NoAnswer()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def check_timeout(timeout_seconds: float) -> None:
    if not timeout_seconds > 0:
        raise ValueError("timeout_seconds must be positive")


def no_answer_cause(timeout_seconds: float, doing: str) -> str:
    return f"NVML did not answer within {timeout_seconds:g} s while {doing} (is the NVIDIA driver wedged?)"


def shutdown_quietly(probe: GpuProbe) -> None:
    """Best effort: a failing shutdown must not hide the result or error that preceded it."""
    with contextlib.suppress(Exception):
        probe.shutdown()


def close_probe(probe: GpuProbe | None, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """Shut NVML down, best effort and bounded: an agent that is stopping must not hang here."""
    if probe is None:
        return
    check_timeout(timeout_seconds)
    with contextlib.suppress(NoAnswer):
        BoundedCall(lambda: shutdown_quietly(probe)).start("nvml-shutdown").result(timeout_seconds)
