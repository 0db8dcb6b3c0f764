"""What unit tests' services did with the in-memory stores, and the in-memory bucket.

A ``Journal`` records every event written, how many reads and successful writes, and every store
call by name. ``Journal.before_next`` runs an action inside a coming write, before its guards are
checked: a concurrent writer that moved first.

``MemoryObjectStore`` stands for the bucket: presigned URLs are fake https URLs that name the key
and expiry; ``upload`` is the agent's PUT to one. Its calls are journalled by name but are not
reads or writes, and run no ``before_next`` hook.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from chalicelib.domain.records import Event

Hook = Callable[[str], None]


@dataclass
class Journal:
    #: every event written, in order
    events: list[Event] = field(default_factory=list)
    #: successful writes (one per store write call: one UpdateItem or one transaction)
    writes: int = 0
    #: read calls (get, list_page, claimants, late_nodes, queue_front and the like)
    reads: int = 0
    #: every store call by name ("nodes.record_heartbeat"), failed writes and the bucket's included
    calls: list[str] = field(default_factory=list)
    #: called with the call's name inside every write, before its guards are checked
    before_write: list[Hook] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _in_hook: bool = field(default=False, repr=False)

    def event_types(self) -> list[str]:
        return [event.type for event in self.events]

    def events_of(self, event_type: str) -> list[Event]:
        return [event for event in self.events if event.type == event_type]

    def before_next(self, method: str, action: Callable[[], object], times: int = 1) -> None:
        """Run ``action`` inside the next ``times`` writes of ``method`` ("nodes.change_liveness"),
        before their guards are checked: someone else wrote first. Its own writes run no hooks."""
        left = [times]

        def hook(called: str) -> None:
            if called == method:
                left[0] -= 1
                if left[0] <= 0:
                    self.before_write.remove(hook)
                action()

        self.before_write.append(hook)

    def reset_counts(self) -> None:
        """Forget what was done so far (after a test's setup)."""
        self.events.clear()
        self.calls.clear()
        self.writes = self.reads = 0

    @contextmanager
    def reading(self, call: str) -> Iterator[None]:
        with self.lock:
            self.calls.append(call)
            self.reads += 1
            yield

    @contextmanager
    def writing(self, call: str, events: tuple[Event, ...]) -> Iterator[None]:
        """A write: its hooks run, then its body checks its guards and changes records; the write
        and its events count only when the body does not raise."""
        with self.lock:
            self.calls.append(call)
            if not self._in_hook:
                self._in_hook = True
                try:
                    for hook in list(self.before_write):
                        hook(call)
                finally:
                    self._in_hook = False
            yield
            self.writes += 1
            self.events.extend(copy.deepcopy(events))


class MemoryObjectStore:
    """The work bucket: key -> (body, content type)."""

    #: fake presigned URLs (https, so they pass the claim answer's URL schema)
    URL_BASE = "https://objects.memory.invalid"

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.objects: dict[str, tuple[bytes, str]] = {}

    def upload(self, key: str, body: bytes, content_type: str = "application/json") -> None:
        """The agent's PUT to a presigned URL (test setup: not journalled)."""
        with self.journal.lock:
            self.objects[key] = (bytes(body), content_type)

    def body(self, key: str) -> bytes:
        with self.journal.lock:
            return self.objects[key][0]

    def put(self, key: str, body: bytes, content_type: str) -> None:
        self.journal.calls.append("objects.put")
        self.upload(key, body, content_type)

    def presigned_get(self, key: str, expires_seconds: int) -> str:
        self.journal.calls.append("objects.presigned_get")
        return f"{self.URL_BASE}/get/{key}?expires={int(expires_seconds)}"

    def presigned_put(self, key: str, expires_seconds: int) -> str:
        self.journal.calls.append("objects.presigned_put")
        return f"{self.URL_BASE}/put/{key}?expires={int(expires_seconds)}"

    def copy(self, source_key: str, key: str) -> bool:
        self.journal.calls.append("objects.copy")
        with self.journal.lock:
            if source_key not in self.objects:
                return False
            self.objects[key] = self.objects[source_key]
        return True

    def read(self, key: str, max_bytes: int) -> bytes | int | None:
        self.journal.calls.append("objects.read")
        with self.journal.lock:
            body = self.objects.get(key, (None, ""))[0]
        if body is None:
            return None
        return len(body) if len(body) > max_bytes else body

    def digest(self, key: str, max_bytes: int) -> tuple[str | None, int] | None:
        self.journal.calls.append("objects.digest")
        with self.journal.lock:
            body = self.objects.get(key, (None, ""))[0]
        if body is None:
            return None
        return (None if len(body) > max_bytes else hashlib.sha256(body).hexdigest()), len(body)
