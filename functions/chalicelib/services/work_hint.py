"""The heartbeat's work hint: does claimable work exist for one of this node's capabilities?

Correctness never depends on it (a claim finds out for itself), so each function instance keeps a
short-lived memory of which capabilities had queued work: a steady heartbeat still costs its one
UpdateItem, plus at most one keys-only Query per work capability per ``ttl_seconds`` per instance,
whatever the fleet's size. Submitting costs nothing in proportion to the fleet. Nodes that serve no
work capability (no runtime worker) cost no read at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from modelforge_protocol.work import CAPABILITIES

#: How stale the hint may be: work submitted now is hinted to nodes within this many seconds.
DEFAULT_TTL_SECONDS = 5.0


class WorkHint:
    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        self._ttl = ttl_seconds
        self._seen: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def waiting(self, capabilities: Iterable[str], any_queued: Callable[[str], bool], now: float) -> bool:
        """Whether any of ``capabilities`` has queued work, as of at most ``ttl_seconds`` ago."""
        for capability in sorted(set(capabilities) & set(CAPABILITIES)):
            if self._queued(capability, any_queued, now):
                return True
        return False

    def _queued(self, capability: str, any_queued: Callable[[str], bool], now: float) -> bool:
        with self._lock:
            seen = self._seen.get(capability)
            if seen is not None and 0 <= now - seen[0] < self._ttl:
                return seen[1]
        queued = any_queued(capability)
        with self._lock:
            self._seen[capability] = (now, queued)
        return queued

    def forget(self) -> None:
        with self._lock:
            self._seen.clear()
