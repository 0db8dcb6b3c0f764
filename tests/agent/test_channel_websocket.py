"""The push channel against a real WebSocket server on 127.0.0.1 (plain ws:// on loopback, and
wss:// with a test CA): hints, the handshake's headers, redirects and foreign certificates refused,
fallback logged once, reconnects, the forced reconnect and the keep-alive.

Backoff waits are cut to a few milliseconds (the injected ``wait``); every test polls for the
state it needs with a deadline, never sleeps for it."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
from modelforge_node_agent.channel import Channel
from modelforge_node_agent.channel_link import LinkFailed, WebSocketOpener, tls_context
from modelforge_node_agent.work.timing import Timing

from tests.agent.channel_server import ChannelServer, poll
from tests.agent.channel_support import NODE_ID, WALL_AT_ZERO, WORK_ID, channel_block, ticket_secret

WAKE = '{"v": 1, "type": "wake"}'
CANCEL = json.dumps({"v": 1, "type": "cancel", "work_id": WORK_ID})


def _quick_wait(event: threading.Event, seconds: float) -> bool:
    return event.wait(min(seconds, 0.02))


class Live:
    """A channel on real time (backoff cut short) and the real opener, with a stand-in for the
    heartbeat: a thread that hands it a new ticket for ``url`` whenever its report asks."""

    def __init__(self, url: str, ca: Path | None = None, **options: Any) -> None:
        self.url = url
        self.hints = 0
        self.cancels: list[str] = []
        self.offered: list[str] = []
        self.channel = Channel(
            WebSocketOpener(tls_context(ca), open_seconds=5.0),
            timing=Timing(clock=time.monotonic, wait=_quick_wait),
            wall=lambda: WALL_AT_ZERO + time.monotonic(),
            random=lambda: 0.0,
            **options,
        )
        self._stop = threading.Event()
        self._heartbeats = threading.Thread(target=self._heartbeat, daemon=True)

    def offer(self) -> str:
        secret = ticket_secret(len(self.offered) + 1)
        self.offered.append(secret)
        self.channel.offer(channel_block(secret, time.monotonic(), url=self.url))
        return secret

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.01):
            if self.channel.report()["need_ticket"]:
                self.offer()

    def start(self, *, heartbeats: bool = True) -> None:
        self.channel.start(NODE_ID, on_wake=self._wake, on_cancel=self.cancels.append)
        self.offer()
        if heartbeats:
            self._heartbeats.start()

    def _wake(self) -> None:
        self.hints += 1

    @property
    def wakes(self) -> int:
        """The hints that came from ``wake`` messages (each connection hints once too)."""
        return self.hints - self.channel.connections

    def close(self) -> None:
        self._stop.set()
        self.channel.close(grace_seconds=3.0)


@contextmanager
def live(url: str, ca: Path | None = None, *, heartbeats: bool = True, **options: Any) -> Iterator[Live]:
    channel = Live(url, ca, **options)
    channel.start(heartbeats=heartbeats)
    try:
        yield channel
    finally:
        channel.close()


@contextmanager
def server(**options: Any) -> Iterator[ChannelServer]:
    running = ChannelServer(**options)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("channel-pki")
    ca, other = trustme.CA(), trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    other.cert_pem.write_to_path(str(folder / "other.pem"))
    return {"served": served, "ca": folder / "ca.pem", "other": folder / "other.pem"}


def test_channel_ws_loopback_wake_hints_and_cancel_renews() -> None:
    with server() as plane, live(plane.url) as agent:
        poll(lambda: plane.connections)
        plane.send(WAKE)
        plane.send(CANCEL)
        poll(lambda: agent.wakes == 1 and agent.cancels == [WORK_ID])
        assert agent.channel.report() == {"state": "connected", "need_ticket": False}


def test_channel_idle_longer_than_the_open_timeout_still_hears_a_wake() -> None:
    with server() as plane:
        agent = Live(plane.url)
        agent.channel = Channel(
            WebSocketOpener(tls_context(None), open_seconds=0.2),
            timing=Timing(clock=time.monotonic, wait=_quick_wait),
            wall=lambda: WALL_AT_ZERO + time.monotonic(),
        )
        agent.start()
        try:
            poll(lambda: plane.connections)
            time.sleep(0.6)  # idle past the dial's timeout (the state under test is this silence)
            plane.send(WAKE)
            poll(lambda: agent.wakes == 1)
            assert len(plane.connections) == 1
        finally:
            agent.close()


def test_channel_handshake_carries_the_node_id_and_the_ticket_only() -> None:
    with server() as plane, live(plane.url) as agent:
        poll(lambda: plane.connections)
        (headers,) = plane.handshakes
        assert headers["X-ModelForge-Node-Id"] == NODE_ID
        assert headers["Authorization"] == f"Bearer {agent.offered[0]}"
        assert headers["User-Agent"] == "modelforge-node-agent"
        assert not {"cookie", "proxy-authorization", "sec-websocket-extensions"} & {k.lower() for k in headers}


def test_channel_wss_with_the_configured_ca_connects(pki: dict[str, Any]) -> None:
    with server(tls=pki["served"]) as plane, live(plane.url, pki["ca"]) as agent:
        poll(lambda: plane.connections)
        plane.send(WAKE)
        poll(lambda: agent.wakes == 1)


def test_channel_wss_certificate_from_another_ca_is_refused(pki: dict[str, Any]) -> None:
    with server(tls=pki["served"]) as plane, live(plane.url, pki["other"], heartbeats=False) as agent:
        poll(lambda: agent.channel.report()["state"] == "fallback")
        assert agent.channel.report()["reason"] == "TLS: certificate verify failed"
        assert plane.handshakes == [] and plane.connections == []


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("where", ["another server", "the same server"])
def test_channel_redirect_on_the_handshake_is_refused(status: int, where: str) -> None:
    with server() as elsewhere:
        target = elsewhere.url if where == "another server" else "/api/v1/agent/other"
        with server(answer=lambda _: (status, {"Location": target})) as plane, live(plane.url) as agent:
            poll(lambda: agent.channel.report()["state"] == "fallback")
            assert agent.channel.report()["reason"] == f"redirect refused (HTTP {status})"
            poll(lambda: len(plane.handshakes) >= 2)  # retried in the background, never followed
        assert elsewhere.handshakes == [] and plane.connections == []


def test_channel_ws_to_a_host_that_is_not_loopback_is_refused_before_dialling() -> None:
    dialled: list[tuple[str, int]] = []

    def dial(address: tuple[str, int], _timeout: float) -> socket.socket:
        dialled.append(address)
        raise AssertionError("dialled")

    opener = WebSocketOpener(tls_context(None), open_seconds=1.0, dial=dial)
    with pytest.raises(LinkFailed) as refused, opener("ws://10.1.2.3:9/api/v1/agent/channel", NODE_ID, "t"):
        pass
    assert refused.value.reason.startswith("channel URL refused: it must use wss://")
    assert dialled == []


def _refusing_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()  # nothing listens there now: a connection is refused
    return port


def test_channel_refused_port_falls_back_logged_once_and_keeps_retrying(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "modelforge.agent")
    url = f"ws://127.0.0.1:{_refusing_port()}/api/v1/agent/channel"
    with live(url) as agent:
        poll(lambda: len([r for r in caplog.records if r.__dict__.get("event") == "channel_retry_failed"]) >= 3)
        assert agent.channel.report() == {"state": "fallback", "reason": "connection refused", "need_ticket": False}
    warnings = [r for r in caplog.records if r.__dict__.get("event") == "channel_fallback"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "connection refused" in warnings[0].getMessage()


def test_channel_reconnects_with_a_new_ticket_after_the_server_closes() -> None:
    with server(close_at_once=1001) as plane, live(plane.url) as agent:
        poll(lambda: len(plane.connections) >= 3)
        tickets = [headers["Authorization"] for headers in plane.handshakes]
        assert len(set(tickets)) == len(tickets)  # single use: each connection its own ticket
        assert agent.channel.state != "fallback"  # closed by the server is not a failure to open


def test_channel_refused_ticket_is_replaced_and_the_next_one_connects() -> None:
    refused_once: list[str] = []

    def answer(request: Any) -> tuple[int, dict[str, str]] | None:
        if not refused_once:
            refused_once.append(request.headers["Authorization"])
            return (401, {})
        return None

    with server(answer=answer) as plane, live(plane.url) as agent:
        poll(lambda: plane.connections)
        assert plane.handshakes[1]["Authorization"] != refused_once[0]
        assert agent.channel.report()["state"] == "connected"


def test_channel_reconnects_before_its_maximum_age() -> None:
    with server() as plane, live(plane.url, max_connection_seconds=0.5) as agent:
        poll(lambda: len(plane.connections) >= 3)  # renewed every 0.4 s (80 % of 0.5 s)
        first = plane.connections[0]
        poll(lambda: first.state.name == "CLOSED")
        assert first.close_code == 1000  # the agent closed the old one itself, normally
        assert agent.channel.connections >= 3


def test_channel_sends_the_keep_alive_ping() -> None:
    with server() as plane, live(plane.url, ping_seconds=0.05):
        poll(lambda: plane.received.count('{"v":1,"type":"ping"}') >= 2)


def test_channel_oversized_and_malformed_messages_are_ignored_on_a_live_connection() -> None:
    with server() as plane, live(plane.url) as agent:
        poll(lambda: plane.connections)
        plane.send('{"v": 1, "type": "wake", "pad": "' + "x" * 2048 + '"}')
        plane.send("not json")
        plane.send(b"\x00binary")
        plane.send('{"v": 9, "type": "wake"}')
        plane.send(WAKE)
        poll(lambda: agent.wakes == 1)
        assert agent.channel.malformed == 3 and agent.channel.ignored == 1
        assert len(plane.connections) == 1  # still the same connection


def test_channel_message_over_api_gateways_limit_closes_the_connection_and_it_reconnects() -> None:
    with server() as plane, live(plane.url) as agent:
        poll(lambda: plane.connections)
        plane.send("x" * (128 * 1024 + 1))
        poll(lambda: len(plane.connections) >= 2)
        plane.send(WAKE)
        poll(lambda: agent.wakes == 1)
