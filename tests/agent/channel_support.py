"""The push channel under test: a fake socket layer (``FakeOpener`` yielding ``FakeLink``s) on fake
time (``FakeTime``), and tickets as the control plane's answers carry them.

A ``FakeLink`` plays a script: each ``recv`` takes the next step (a frame to return, ``CLOSED`` to
lose the connection, a callable to run) and, once the script is done, lets ``timeout`` seconds pass
on the fake clock. The channel's loop runs in the test's own thread (``ChannelHarness.run``), so a
test reads what happened without waiting on any thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from modelforge_node_agent.channel import Channel
from modelforge_node_agent.channel_link import Link, LinkFailed

from tests.agent.fake_time import FakeTime

NODE_ID = "node_" + "c" * 32
WORK_ID = "work_" + "a" * 32
#: The wall clock's reading when the fake monotonic clock reads 0.
WALL_AT_ZERO = 1_800_000_000.0
CHANNEL_URL = "wss://channel.example.test/api/v1/agent/channel"


def ticket_secret(number: int) -> str:
    return "mfct_" + f"{number:043d}"


def channel_block(secret: str, now: float, *, url: str = CHANNEL_URL, seconds: float = 300) -> dict[str, Any]:
    """An answer's ``channel`` block minted at fake-clock time ``now`` for ``seconds``."""
    expires = datetime.fromtimestamp(WALL_AT_ZERO + now + seconds, UTC)
    return {"url": url, "ticket": secret, "expires_at": expires.isoformat().replace("+00:00", "Z")}


#: A script step: lose the connection (as a server's close would).
CLOSED = "<closed>"


@dataclass
class FakeLink:
    time: FakeTime
    script: list[Any] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    #: every timeout ``recv`` was asked to wait, in order
    waited: list[float] = field(default_factory=list)

    def recv(self, timeout: float) -> str | bytes | None:
        self.waited.append(timeout)
        while self.script:
            step = self.script.pop(0)
            if step == CLOSED:
                raise LinkFailed("closed by the server (code 1001)")
            if callable(step):
                step()
                continue
            return step  # type: ignore[no-any-return]
        self.time.now += timeout
        return None

    def send(self, text: str) -> None:
        self.sent.append(text)


@dataclass
class Opened:
    url: str
    node_id: str
    ticket: str
    at: float


class FakeOpener:
    """Each call takes the next outcome: a ``FakeLink`` to yield or a ``LinkFailed`` to raise.
    Out of outcomes, it stops the channel (``on_empty``)."""

    def __init__(self, time: FakeTime, outcomes: list[FakeLink | LinkFailed]) -> None:
        self.time = time
        self.outcomes = outcomes
        self.calls: list[Opened] = []
        self.on_empty: Callable[[], None] = lambda: None

    @contextlib.contextmanager
    def __call__(self, url: str, node_id: str, ticket: str) -> Iterator[Link]:
        self.calls.append(Opened(url, node_id, ticket, self.time.now))
        if not self.outcomes:
            self.on_empty()
            raise LinkFailed("no more outcomes")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, LinkFailed):
            raise outcome
        yield outcome


class ChannelTime(FakeTime):
    """Fake time whose every wait first runs ``before_wait`` (the harness's heartbeat)."""

    def __init__(self) -> None:
        super().__init__(now=0.0)
        self.before_wait: Callable[[], None] = lambda: None

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.before_wait()
        assert len(self.waits) < 100_000, "the channel waits forever"
        return super().wait(event, seconds)


class ChannelHarness:
    """A ``Channel`` on fake time and a fake opener, its loop run in the test's thread. With
    ``heartbeats``, every wait of the channel's own is first a heartbeat: it hands the channel a
    new ticket when its report asks for one, as the control plane would."""

    def __init__(
        self,
        outcomes: list[FakeLink | LinkFailed] | None = None,
        *,
        random: float = 0.5,
        heartbeats: bool = True,
        **options: Any,
    ):
        self.time = ChannelTime()
        self.opener = FakeOpener(self.time, outcomes or [])
        #: every on_wake: one per connection (the claim that parks the node), then one per wake
        self.hints = 0
        self.cancels: list[str] = []
        self._spawned: list[Callable[[], None]] = []
        self.channel = Channel(
            self.opener,
            timing=self.time.timing(),
            wall=lambda: WALL_AT_ZERO + self.time.now,
            random=lambda: random,
            spawn=self._spawned.append,
            **options,
        )
        self.opener.on_empty = self.channel.close
        self._tickets = 0
        #: every push_channel report a heartbeat carried
        self.reports: list[dict[str, Any]] = []
        if heartbeats:
            self.time.before_wait = self.heartbeat

    def heartbeat(self) -> None:
        report = self.channel.report()
        self.reports.append(report)
        if report["need_ticket"]:
            self.offer()

    def link(self, *script: Any) -> FakeLink:
        return FakeLink(self.time, list(script))

    def offer(self, *, seconds: float = 300, url: str = CHANNEL_URL) -> str:
        self._tickets += 1
        secret = ticket_secret(self._tickets)
        self.channel.offer(channel_block(secret, self.time.now, url=url, seconds=seconds))
        return secret

    def start(self) -> None:
        self.channel.start(NODE_ID, on_wake=self._wake, on_cancel=self.cancels.append)

    @property
    def started(self) -> bool:
        """Whether the channel started its connection loop."""
        return bool(self._spawned)

    def run(self) -> None:
        """Run the channel's loop here until it stops (the opener ran out of outcomes)."""
        assert len(self._spawned) == 1, "the channel starts its loop once, when it has a node id and a ticket"
        self._spawned[0]()

    def _wake(self) -> None:
        self.hints += 1

    @property
    def wakes(self) -> int:
        """The hints that came from ``wake`` messages."""
        return self.hints - self.channel.connections
