"""At most N app invocations at once on the local API server; the others wait in arrival order.

The local server reads each request on a thread of its own (up to ``--max-connections``), but runs
the app, which is where a request spends the emulator's CPU, for at most ``limit`` of them at a
time, as a warm Lambda pool of that size would. The rest wait their turn first come, first served,
and a request that waited ``max_wait_seconds`` is refused (503 ``server_busy``, the answer to a
connection past the limit) rather than run that late.

Measured on the 2-core local stack (docs/SCALE.md, "One line for the app"): with every connection
in the app at once, 100 claimers shared the emulator's core as 100 threads, each claim request's
few emulator calls each waited behind ~100 others, so a claim that lost a race or found the queue
empty (a few more calls) took several times the mean; in line, the same load keeps a handful of
requests in the emulator, and the wait is the same for every request.

The hand-over is strict: a finished invocation passes its place to the oldest waiter itself, so a
request that arrives meanwhile cannot take it first.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: App invocations at once by default: the better of 8 and 24 for the claim benchmark on 2
#: cores (docs/SCALE.md); an invocation mostly waits on the emulator's process.
DEFAULT_MAX_INVOCATIONS = 8
#: The longest a request waits for its turn: under API Gateway's 29 s integration timeout and the
#: admin CLI's 30 s request timeout. An agent gives up sooner (10 s by default), and a request whose
#: client has gone still runs when its turn comes: the server does not watch the socket meanwhile.
MAX_WAIT_SECONDS = 25.0


class InvocationGate:
    def __init__(self, limit: int, max_wait_seconds: float = MAX_WAIT_SECONDS) -> None:
        if limit < 1:
            raise ValueError("an invocation gate needs a limit of at least 1")
        self.limit = limit
        self._max_wait = max_wait_seconds
        self._running = 0
        self._waiting: collections.deque[threading.Event] = collections.deque()
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """Yields True once it is this request's turn (held until the block ends), or False after
        ``max_wait_seconds`` in line (nothing held: the caller refuses the request)."""
        admitted = self._enter()
        try:
            yield admitted
        finally:
            if admitted:
                self._leave()

    def _enter(self) -> bool:
        with self._lock:
            if self._running < self.limit and not self._waiting:
                self._running += 1
                return True
            ticket = threading.Event()
            self._waiting.append(ticket)
        if ticket.wait(self._max_wait):
            return True  # handed over: _leave counted this invocation as running
        with self._lock:
            if ticket.is_set():
                return True  # handed over between the timeout and the lock
            self._waiting.remove(ticket)
            return False

    def _leave(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()  # its place goes to the oldest waiter: running unchanged
            else:
                self._running -= 1
