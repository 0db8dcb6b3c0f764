"""Callers this function instance has already seen prove their credential: a cost saving only.

An unauthenticated request must cost the control plane no write, so a node credential that this
instance has not verified is checked with one read before anything is written. Once verified,
the pair (node id, credential digest) is remembered here, and later heartbeats go straight to
the one conditional UpdateItem, which checks the credential again inside DynamoDB. Correctness
never depends on this memory: a revoked credential fails that condition, is forgotten, and the
caller is read again. The memory is bounded (least recently used first out) and per instance.
"""

from __future__ import annotations

import collections
import threading

#: About 200 bytes an entry: 20,000 entries stay under 5 MB of a Lambda instance's memory.
DEFAULT_CAPACITY = 20_000


class KnownCallers:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._entries: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, caller: tuple[str, str]) -> bool:
        with self._lock:
            if caller not in self._entries:
                return False
            self._entries.move_to_end(caller)
            return True

    def remember(self, caller: tuple[str, str]) -> None:
        with self._lock:
            self._entries[caller] = None
            self._entries.move_to_end(caller)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def forget(self, caller: tuple[str, str]) -> None:
        with self._lock:
            self._entries.pop(caller, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
