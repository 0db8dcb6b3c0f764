"""The push channel's client: one outbound WebSocket to the control plane, kept open on its own
thread, whose messages are hints for the work loop.

- **Tickets.** The control plane names the channel and a short-lived, single-use ticket in the
  enroll answer and, when the heartbeat asked (``need_ticket``), in a heartbeat answer
  (``offer``). The latest ticket is kept in memory only: never persisted, never logged. It is
  dropped once a connection opened with it (the control plane consumed it) or the handshake
  refused it (401/403: a new one is needed; a revoked credential shows on the HTTP path, fatal as
  before).
- **Report.** ``report()`` is the heartbeat's ``push_channel``: ``connected``, ``connecting``,
  ``fallback`` (the channel could not be opened; ``reason`` says why) or ``off``
  (``MODELFORGE_AGENT_PUSH_CHANNEL=off``), and ``need_ticket`` when the state is neither
  ``connected`` nor ``off`` and no ticket has ``TICKET_MARGIN_SECONDS`` left.
- **Fallback.** Until a connection opens, the heartbeat's ``work_waiting`` hint does the work, as
  for every agent before the channel. Falling back is logged once, with the reason (not once per
  retry); the channel keeps retrying in the background with the 1..16 s jittered backoff.
- **Life of a connection.** A ``ping`` every ``CHANNEL_PING_SECONDS`` (API Gateway closes a
  connection idle for 10 minutes); a forced reconnect at a random point in the last 20 % of
  ``MAX_CONNECTION_SECONDS`` (API Gateway's 2 h), so a fleet does not reconnect in step; after the
  server closes it, a reconnect with backoff (reset once a connection lasted
  ``STABLE_SECONDS``).
- **On every connection** the channel calls ``on_wake`` once: the work loop claims, and a claim
  that finds nothing parks the node, so the control plane knows to wake it (a wake sent while it
  was not connected was lost, and its item is claimed now).
- **Messages** (``channel_messages``): ``wake`` -> ``on_wake`` (the work loop's ``hint``),
  ``cancel`` -> ``on_cancel(work_id)`` (renew that work now); anything else is ignored, a
  malformed one counted, none is fatal.

Time is injected (``work.timing.Timing``: the clock and the only way it sleeps), and so are the
wall clock (to read a ticket's expiry), the random source and the ``Opener`` (the socket layer:
``channel_link``), so tests drive all of it without real time.
"""

from __future__ import annotations

import logging
import random as random_module
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from modelforge_protocol.backoff import Backoff
from modelforge_protocol.schemas import CHANNEL_PING_SECONDS

from . import channel_messages
from .channel_link import Link, LinkFailed, Opener, WebSocketOpener, tls_context
from .config import AgentConfig
from .work.timing import Timing

log = logging.getLogger("modelforge.agent")

CONNECTED, CONNECTING, FALLBACK, OFF = "connected", "connecting", "fallback", "off"
#: API Gateway's longest connection; the agent reconnects before it, in the last 20 % of it.
MAX_CONNECTION_SECONDS = 2 * 3600.0
FORCED_RECONNECT_FROM = 0.8
#: The forced reconnect comes at least this long before the server would cut the connection.
FORCED_RECONNECT_MARGIN_SECONDS = 30.0
#: A connection that lasted this long resets the backoff.
STABLE_SECONDS = 60.0
#: A ticket with less than this left is asked for again (``need_ticket``).
TICKET_MARGIN_SECONDS = 60.0
#: A ticket with less than this left is not used to connect (it could expire on the way).
TICKET_USE_MARGIN_SECONDS = 2.0
#: Tickets live at most this long (the issue's bound); a longer expiry is read as this.
MAX_TICKET_SECONDS = 600.0
#: The longest ``reason`` the heartbeat's report carries (the heartbeat schema's bound).
MAX_REASON_CHARS = 200
#: The longest the connection's thread waits for a message before looking at its stop signal.
POLL_SECONDS = 1.0
#: The longest the connection's thread waits for a ticket before looking again (a ticket's
#: arrival and ``close`` wake it at once).
TICKET_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Ticket:
    url: str
    secret: str = field(repr=False)
    #: on the channel's monotonic clock
    expires: float

    def left(self, now: float) -> float:
        return self.expires - now


def ticket_from(block: Mapping[str, Any], now: float, wall_now: float) -> Ticket | None:
    """The answer's ``channel`` block (its shape checked by the answer schema) as a ``Ticket``
    that expires on the monotonic clock; None when its ``expires_at`` cannot be read."""
    try:
        expires_at = datetime.fromisoformat(str(block["expires_at"]))
    except ValueError:
        return None
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=UTC)
    left = min(MAX_TICKET_SECONDS, max(0.0, expires_at.timestamp() - wall_now))
    return Ticket(str(block["url"]), str(block["ticket"]), now + left)


def _ignore_work_id(_work_id: str) -> None:
    """No work loop: a cancel has nothing to renew."""


class Channel:
    def __init__(
        self,
        opener: Opener,
        *,
        enabled: bool = True,
        timing: Timing | None = None,
        wall: Callable[[], float] = time.time,
        random: Callable[[], float] = random_module.random,
        max_connection_seconds: float = MAX_CONNECTION_SECONDS,
        ping_seconds: float = CHANNEL_PING_SECONDS,
        spawn: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self._opener = opener
        self._enabled = enabled
        self._timing = timing or Timing()
        self._wall = wall
        self._random = random
        self._max_connection_seconds = max_connection_seconds
        self._ping_seconds = ping_seconds
        self._lock = threading.Lock()
        self._state = CONNECTING if enabled else OFF
        self._reason: str | None = None
        self._ticket: Ticket | None = None
        self._stop = threading.Event()
        #: set when a ticket arrives (and on ``close``): the thread waiting for one looks again
        self._wakeup = threading.Event()
        self._spawn = spawn or self._on_thread
        self._thread: threading.Thread | None = None
        self._started = False
        self._node_id: str | None = None
        self._on_wake: Callable[[], None] = _nothing
        self._on_cancel: Callable[[str], None] = _ignore_work_id
        self._fallback_logged = False
        self._ever_connected = False
        #: what the channel did, for tests and the curious: connections opened, pings sent,
        #: messages ignored (unknown version or type) and malformed ones
        self.connections = 0
        self.pings_sent = 0
        self.ignored = 0
        self.malformed = 0

    # --- the publishing thread's side ----------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    def report(self) -> dict[str, Any]:
        """The heartbeat's ``push_channel`` (sent only when the control plane advertises it)."""
        with self._lock:
            state, reason, ticket = self._state, self._reason, self._ticket
        need = state not in (CONNECTED, OFF) and (
            ticket is None or ticket.left(self._timing.clock()) < TICKET_MARGIN_SECONDS
        )
        report: dict[str, Any] = {"state": state, "need_ticket": need}
        if reason:
            report["reason"] = reason[:MAX_REASON_CHARS]
        return report

    def offer(self, block: Mapping[str, Any]) -> None:
        """An answer's ``channel`` block: keep its ticket (the latest wins) and connect with it."""
        if not self._enabled:
            return
        ticket = ticket_from(block, self._timing.clock(), self._wall())
        if ticket is None:
            log.debug("channel ticket ignored: its expiry is no timestamp", extra={"event": "channel_ticket_ignored"})
            return
        with self._lock:
            self._ticket = ticket
        self._wakeup.set()
        self._start_thread()

    def start(self, node_id: str, on_wake: Callable[[], None], on_cancel: Callable[[str], None]) -> None:
        """Enrolled as ``node_id``: the channel may connect (once it holds a ticket)."""
        self._node_id, self._on_wake, self._on_cancel = node_id, on_wake, on_cancel
        self._start_thread()

    def close(self, grace_seconds: float = 0.0) -> None:
        """Stop; the connection's thread closes the connection (it never holds up the agent's exit)."""
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None and grace_seconds > 0:
            self._thread.join(grace_seconds)

    def _start_thread(self) -> None:
        """Start the connection's loop once, when the channel has both a node id and a ticket."""
        with self._lock:
            if self._started or not self._enabled or self._node_id is None or self._ticket is None:
                return
            self._started = True
        self._spawn(self._run)

    def _on_thread(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name="modelforge-channel", daemon=True)
        self._thread.start()

    # --- the connection's thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._keep_connected()
        except Exception as bug:  # noqa: BLE001 - a bug here must not stop the agent: the heartbeat's hint remains
            log.error(
                f"push channel stopped ({type(bug).__name__}); the heartbeat's hint carries on",
                extra={"event": "channel_stopped", "error": type(bug).__name__},
            )
            self._set(FALLBACK, f"channel stopped (internal error: {type(bug).__name__})")

    def _keep_connected(self) -> None:
        backoff = Backoff(self._random)
        while not self._stop.is_set():
            ticket = self._next_ticket()
            if ticket is None:
                return
            opened_at: list[float] = []
            try:
                forced = self._connect(ticket, opened_at)
            except LinkFailed as failed:
                if failed.ticket_refused:
                    self._drop(ticket)
                if not opened_at:
                    self._fall_back(failed.reason)
                else:
                    self._set(CONNECTING, failed.reason)
                    log.debug(f"push channel closed: {failed.reason}", extra={"event": "channel_closed"})
                forced = False
            if opened_at and self._timing.clock() - opened_at[0] >= STABLE_SECONDS:
                backoff.reset()
            if not forced and self._timing.wait(self._stop, backoff.jittered(backoff.next_delay())):
                return

    def _next_ticket(self) -> Ticket | None:
        """The ticket to connect with, waiting until one arrives; None once stopped."""
        while True:
            self._wakeup.clear()
            if self._stop.is_set():
                return None
            with self._lock:
                ticket = self._ticket
            if ticket is not None and ticket.left(self._timing.clock()) > TICKET_USE_MARGIN_SECONDS:
                return ticket
            self._timing.wait(self._wakeup, TICKET_WAIT_SECONDS)

    def _connect(self, ticket: Ticket, opened_at: list[float]) -> bool:
        """One connection, until it is to be renewed (True), stopped (False) or lost (``LinkFailed``)."""
        assert self._node_id is not None
        with self._opener(ticket.url, self._node_id, ticket.secret) as link:
            opened_at.append(self._timing.clock())
            self._drop(ticket)  # single use: the control plane consumed it
            self.connections += 1
            self._connected()
            # A claim that finds nothing parks the node for wakes; while it was not connected a
            # wake could not reach it (and the control plane unparks a node it failed to wake):
            # claim once now, as a heartbeat's work_waiting would make it.
            self._on_wake()
            forced = self._session(link, opened_at[0])
        if forced:
            self._set(CONNECTING, "reconnecting before the connection's maximum age")
            log.debug("push channel renewed before its maximum age", extra={"event": "channel_renewing"})
        return forced

    def _session(self, link: Link, opened: float) -> bool:
        """Read messages and send the keep-alive until the connection's life ends (True) or the
        channel stops (False); ``LinkFailed`` when the connection is lost."""
        window = self._max_connection_seconds * (1 - FORCED_RECONNECT_FROM) - FORCED_RECONNECT_MARGIN_SECONDS
        renew_at = opened + self._max_connection_seconds * FORCED_RECONNECT_FROM + max(0.0, window) * self._random()
        next_ping = opened + self._ping_seconds
        while not self._stop.is_set():
            now = self._timing.clock()
            if now >= renew_at:
                return True
            if now >= next_ping:
                link.send(channel_messages.PING)
                self.pings_sent += 1
                next_ping = now + self._ping_seconds
            frame = link.recv(min(POLL_SECONDS, next_ping - now, renew_at - now))
            if frame is not None:
                self._handle(frame)
        return False

    def _handle(self, frame: str | bytes) -> None:
        try:
            message = channel_messages.read(frame)
        except channel_messages.Malformed as malformed:
            self.malformed += 1
            log.debug(f"channel message ignored: {malformed.reason}", extra={"event": "channel_message_malformed"})
            return
        if isinstance(message, channel_messages.Wake):
            log.debug("channel: wake", extra={"event": "channel_wake"})
            self._on_wake()
        elif isinstance(message, channel_messages.Cancel):
            log.info(
                f"channel: cancel of {message.work_id}; renewing it now",
                extra={"event": "channel_cancel", "work_id": message.work_id},
            )
            self._on_cancel(message.work_id)
        else:
            self.ignored += 1
            log.debug(f"channel message ignored: {message.why}", extra={"event": "channel_message_ignored"})

    # --- state --------------------------------------------------------------------------------

    def _set(self, state: str, reason: str | None) -> None:
        with self._lock:
            self._state, self._reason = state, reason

    def _drop(self, ticket: Ticket) -> None:
        with self._lock:
            if self._ticket is ticket:
                self._ticket = None

    def _connected(self) -> None:
        recovered = self._fallback_logged or not self._ever_connected
        self._set(CONNECTED, None)
        self._fallback_logged, self._ever_connected = False, True
        if recovered:
            log.info("push channel connected", extra={"event": "channel_connected"})
        else:
            log.debug("push channel connected", extra={"event": "channel_connected"})

    def _fall_back(self, reason: str) -> None:
        self._set(FALLBACK, reason)
        if self._fallback_logged:
            log.debug(f"push channel still unavailable: {reason}", extra={"event": "channel_retry_failed"})
            return
        self._fallback_logged = True
        log.warning(
            f"push channel unavailable ({reason}): work is claimed on the heartbeat's hint meanwhile; "
            "retrying in the background",
            extra={"event": "channel_fallback", "reason": reason},
        )


def _nothing() -> None:
    """No work loop: a wake has nothing to hint."""


def for_config(config: AgentConfig) -> Channel:
    """The agent's channel: ``MODELFORGE_AGENT_PUSH_CHANNEL`` on or off, TLS verified with the
    configured CA, through ``MODELFORGE_AGENT_HTTPS_PROXY`` when set, the handshake under the
    request timeout."""
    opener = WebSocketOpener(
        tls_context(config.ca_cert_path), open_seconds=config.request_timeout_seconds, proxy=config.https_proxy
    )
    return Channel(opener, enabled=config.push_channel == "on")
