"""What this instance last read of each capability's queue front: a cost saving only.

A claim reads the front of its capabilities' queues (up to ``CLAIM_CANDIDATES`` items each, one
Query per capability) and leases one item. The items it did not try stay here, and the instance's
next claims take one each without a read, until the front runs out, is ``FRONT_SECONDS`` old, or
a lease of an item of that capability is lost. Each remembered item goes to one claim only, so the
claims of one instance never race each other for an item they both remember.

A lost lease (of a remembered item, or of one just read) means others are taking from the same
fronts, and on DynamoDB a lost transaction costs more than the reads the memory saves (its write
units). So the capability's front is forgotten and the instance remembers none of it for
``COOL_OFF_SECONDS``: its claims read the queue each time, as they would without this memory.
Under contention across instances the memory costs at most one lost transaction per instance and
capability every ``COOL_OFF_SECONDS``; without it, it saves the read of all but one claim in
twenty.

Correctness never depends on this memory. The lease transaction requires the item to be queued
at the epoch that was read, so an item leased, cancelled or re-queued elsewhere since costs one
lost transaction, never a wrong lease. An empty front is never remembered: a queue that looks
empty is always judged on a fresh read before a node parks (docs/DISPATCH.md, "No lost
wake-up"). The memory is per instance and bounded: one front (at most ``CLAIM_CANDIDATES`` items)
per work capability.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable

from chalicelib.domain.records import WorkItem

#: A remembered front older than this is read again: items submitted meanwhile are no further than
#: this from a claim of this instance, and a front other instances drained costs at most one lost
#: transaction. At one claimer a front of 20 lasts about half a second on the local stack.
FRONT_SECONDS = 2.0
#: After a lost lease of an item of a capability, its claims on this instance read the queue
#: each time for this long (see the module's docstring).
COOL_OFF_SECONDS = 10.0


class QueueFronts:
    def __init__(self, front_seconds: float = FRONT_SECONDS, cool_off_seconds: float = COOL_OFF_SECONDS) -> None:
        self._seconds = front_seconds
        self._cool_off = cool_off_seconds
        self._fronts: dict[str, tuple[float, list[WorkItem]]] = {}
        #: capability -> until when its fronts are not remembered (a lease of one was lost)
        self._cooling: dict[str, float] = {}
        self._lock = threading.Lock()

    def take(self, capabilities: Iterable[str], now: float) -> WorkItem | None:
        """One remembered item of ``capabilities``, no longer remembered; None unless every one of
        them has a front read at most ``FRONT_SECONDS`` ago (then the claim reads them all, so a
        node serving several capabilities takes from each alike). The item is drawn at random
        over the remembered items, as a fresh read's candidates are."""
        with self._lock:
            fronts = []
            for capability in set(capabilities):
                front = self._fronts.get(capability)
                if front is None or not 0 <= now - front[0] <= self._seconds:
                    self._fronts.pop(capability, None)
                    return None
                fronts.append((capability, front[1]))
            if not fronts:
                return None
            pick = random.randrange(sum(len(items) for _, items in fronts))
            for capability, items in fronts:
                if pick < len(items):
                    item = items.pop(pick)
                    if not items:
                        del self._fronts[capability]
                    return item
                pick -= len(items)
        raise AssertionError("unreachable: the pick is within the remembered items")

    def keep(self, capabilities: Iterable[str], items: Iterable[WorkItem], now: float) -> None:
        """A fresh read of ``capabilities``' fronts left ``items`` untried: they are those fronts
        now, in place of any remembered before (a capability with none of them keeps nothing)."""
        read: dict[str, list[WorkItem]] = {capability: [] for capability in capabilities}
        for item in items:
            read.setdefault(item.capability, []).append(item)
        with self._lock:
            for capability, front in read.items():
                if front and not self._cooling_off(capability, now):
                    self._fronts[capability] = (now, front)
                else:
                    self._fronts.pop(capability, None)

    def forget(self, capability: str, now: float) -> None:
        """A lease of an item of ``capability`` (remembered or just read) was lost at ``now``: others
        are taking from its fronts. Forget its front, and remember none for ``COOL_OFF_SECONDS``."""
        with self._lock:
            self._fronts.pop(capability, None)
            self._cooling[capability] = now + self._cool_off

    def _cooling_off(self, capability: str, now: float) -> bool:
        until = self._cooling.get(capability)
        if until is None:
            return False
        if now < until and until - now <= self._cool_off:  # a clock gone back ends it too
            return True
        del self._cooling[capability]
        return False

    def remembered(self, capability: str) -> int:
        """How many items of ``capability`` are remembered (for tests and logs)."""
        with self._lock:
            front = self._fronts.get(capability)
            return 0 if front is None else len(front[1])
