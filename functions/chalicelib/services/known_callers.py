"""Callers this function instance has already seen prove their credential: a cost saving only.

An unauthenticated request must cost the control plane no write, so a node credential that this
instance has not verified is checked with one read before anything is written. Once verified,
the pair (node id, credential digest) is remembered here, and later heartbeats go straight to
the one conditional UpdateItem, which checks the credential again inside DynamoDB. Correctness
never depends on this memory: a revoked credential fails that condition, is forgotten, and the
caller is read again. The memory is bounded (least recently used first out) and per instance.

A claim also remembers what it read of its node (``ClaimView``: capabilities, park state,
liveness), so that the next claims of that node skip the node read. The claim transaction checks
every one of those facts again at the moment of the write (docs/DISPATCH.md, "The claim's view of
its node"), so a view that is out of date costs one lost transaction and a read, never a wrong
lease.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from dataclasses import dataclass

from chalicelib.domain.records import NODE_DRAINED, Node

#: About 300 bytes an entry with its view: 20,000 entries stay under 10 MB of a Lambda instance's
#: memory.
DEFAULT_CAPACITY = 20_000
#: A claim view older than this is read again even if nothing failed: a bound on how long a
#: change the claim transaction does not check (none today) could go unseen.
VIEW_SECONDS = 60.0

Caller = tuple[str, str]


@dataclass(frozen=True)
class ClaimView:
    """What a claim needs of its node, as this instance last read it, and when."""

    capabilities: frozenset[str]
    #: the node's park stamp (None: not parked); the claim transaction requires the same
    parked_at: float | None
    liveness: str
    last_heartbeat_at: float | None
    read_at: float
    #: an admin drained the node, or it has no free slot: it takes no new work now (the claim
    #: transaction checks both too)
    drained: bool = False
    #: free slots as read (None: its agent reports none, no limit); a lease by this view takes one
    slots_left: int | None = None

    @classmethod
    def of(cls, node: Node, now: float) -> ClaimView:
        drained = bool((node.gpu_blocks or 0) & NODE_DRAINED)
        schedulable = node.slots_schedulable
        left = None if schedulable is None else int(schedulable) - int(node.slots_busy or 0)
        return cls(
            frozenset(node.capabilities or ()),
            node.parked_at,
            node.liveness,
            node.last_heartbeat_at,
            now,
            drained,
            left,
        )

    @property
    def slot_free(self) -> bool:
        return self.slots_left is None or self.slots_left > 0

    def took_slot(self) -> ClaimView:
        """The view after a lease it made (a finish elsewhere is seen on the next fresh read)."""
        return self if self.slots_left is None else dataclasses.replace(self, slots_left=self.slots_left - 1)

    def online(self, heartbeat_after: float) -> bool:
        """The claim transaction's liveness test, on the view."""
        return (
            self.liveness == "online"
            and self.last_heartbeat_at is not None
            and self.last_heartbeat_at > heartbeat_after
        )


class KnownCallers:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._entries: collections.OrderedDict[Caller, ClaimView | None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, caller: Caller) -> bool:
        with self._lock:
            if caller not in self._entries:
                return False
            self._entries.move_to_end(caller)
            return True

    def remember(self, caller: Caller) -> None:
        """``caller`` proved its credential (a claim view it has is kept)."""
        with self._lock:
            self._put(caller, self._entries.get(caller))

    def remember_view(self, caller: Caller, view: ClaimView | None) -> None:
        """``caller`` proved its credential, and its claim read ``view`` of its node (None: keep no
        view)."""
        with self._lock:
            self._put(caller, view)

    def _put(self, caller: Caller, view: ClaimView | None) -> None:
        self._entries[caller] = view
        self._entries.move_to_end(caller)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def claim_view(self, caller: Caller, now: float) -> ClaimView | None:
        """The view a claim of ``caller`` remembered, if one is and it is at most ``VIEW_SECONDS`` old."""
        with self._lock:
            view = self._entries.get(caller)
            if view is None or not 0 <= now - view.read_at <= VIEW_SECONDS:
                return None
            self._entries.move_to_end(caller)
            return view

    def forget(self, caller: Caller) -> None:
        with self._lock:
            self._entries.pop(caller, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
