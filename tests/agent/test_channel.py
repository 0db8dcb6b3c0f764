"""The push channel's client on fake time and a fake socket layer: messages as hints, the
keep-alive, the forced reconnect, backoff, fallback logged once, tickets (single use, in memory,
never logged) and the heartbeat's report."""

from __future__ import annotations

import json
import logging

import pytest
from modelforge_node_agent.channel import (
    FORCED_RECONNECT_MARGIN_SECONDS,
    MAX_CONNECTION_SECONDS,
    Channel,
)
from modelforge_node_agent.channel_link import LinkFailed
from modelforge_node_agent.channel_messages import PING

from tests.agent.channel_support import CLOSED, NODE_ID, WORK_ID, ChannelHarness, channel_block

WAKE = '{"v": 1, "type": "wake"}'
CANCEL = json.dumps({"v": 1, "type": "cancel", "work_id": WORK_ID})


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.__dict__.get("event") == event]


def test_channel_wake_and_cancel_messages_hint_the_work_loop() -> None:
    h = ChannelHarness()
    h.opener.outcomes = [h.link(WAKE, CANCEL, WAKE, CLOSED)]
    h.start()
    secret = h.offer()
    h.run()
    assert h.wakes == 2 and h.cancels == [WORK_ID]
    first = h.opener.calls[0]
    assert (first.url, first.node_id, first.ticket) == (
        "wss://channel.example.test/api/v1/agent/channel",
        NODE_ID,
        secret,
    )


def test_channel_each_connection_hints_one_claim_so_the_node_parks() -> None:
    h = ChannelHarness()
    h.opener.outcomes = [h.link(CLOSED), h.link(CLOSED), LinkFailed("connection refused")]
    h.start()
    h.offer()
    h.run()
    assert h.channel.connections == 2 and h.hints == 2 and h.wakes == 0


@pytest.mark.parametrize(
    "frame",
    [
        '{"v": 2, "type": "wake"}',
        '{"v": 1, "type": "reboot"}',
        '{"v": 1, "type": "wake2", "extra": [1]}',
    ],
)
def test_channel_unknown_version_or_type_is_ignored_with_one_debug_line(
    frame: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "modelforge.agent")
    h = ChannelHarness()
    h.opener.outcomes = [h.link(frame, WAKE, CLOSED)]
    h.start()
    h.offer()
    h.run()
    assert h.channel.ignored == 1 and h.channel.malformed == 0 and h.wakes == 1
    (line,) = _events(caplog, "channel_message_ignored")
    assert line.levelno == logging.DEBUG


@pytest.mark.parametrize(
    "frame",
    [
        b'{"v": 1, "type": "wake"}',  # binary
        "not json",
        '{"v": 1, "type": "wake", "pad": "' + "x" * 1100 + '"}',  # over 1 KiB
        '{"v": NaN, "type": "wake"}',
        "[1, 2]",
        '{"v": true, "type": "wake"}',
        '{"v": 1}',
        '{"v": 1, "type": "cancel"}',
        '{"v": 1, "type": "cancel", "work_id": "../../etc"}',
        '{"v": 1, "type": "wake", "deep": {"a": {"b": 1}}}',
    ],
)
def test_channel_malformed_message_is_counted_and_never_fatal(frame: str | bytes) -> None:
    h = ChannelHarness()
    h.opener.outcomes = [h.link(frame, WAKE, CLOSED)]
    h.start()
    h.offer()
    h.run()
    assert h.channel.malformed == 1 and h.wakes == 1 and h.cancels == []


def test_channel_keep_alive_ping_every_five_minutes_until_the_forced_reconnect() -> None:
    h = ChannelHarness(random=0.5)
    link = h.link()
    h.opener.outcomes = [link]
    h.start()
    h.offer()
    h.run()
    renew_at = MAX_CONNECTION_SECONDS * 0.8 + 0.5 * (MAX_CONNECTION_SECONDS * 0.2 - FORCED_RECONNECT_MARGIN_SECONDS)
    assert link.sent == [PING] * int(renew_at // 300)
    assert max(link.waited) <= 1.0  # the stop signal is looked at every second


@pytest.mark.parametrize("random", [0.0, 0.999999])
def test_channel_forced_reconnect_comes_in_the_last_fifth_before_two_hours(random: float) -> None:
    h = ChannelHarness(random=random)
    h.opener.outcomes = [h.link(), h.link()]
    h.start()
    h.offer()
    h.run()
    first, second = h.opener.calls[0], h.opener.calls[1]
    lived = second.at - first.at
    assert 0.8 * MAX_CONNECTION_SECONDS <= lived < MAX_CONNECTION_SECONDS - FORCED_RECONNECT_MARGIN_SECONDS + 1
    assert first.ticket != second.ticket  # single use: the renewed connection asked for a new one
    assert h.time.waits == []  # no backoff after a planned reconnect


def test_channel_server_close_reconnects_with_jittered_backoff_reset_after_a_stable_connection() -> None:
    h = ChannelHarness(random=0.5)  # jitter 0.5: 90 % of each step

    def lasted_a_while() -> None:
        h.time.now += 61

    h.opener.outcomes = [h.link(CLOSED), h.link(CLOSED), h.link(lasted_a_while, CLOSED), h.link(CLOSED)]
    h.start()
    h.offer()
    h.run()
    assert h.time.waits == pytest.approx([0.9, 1.8, 0.9, 1.8])
    assert len(h.opener.calls) == 5
    assert len({call.ticket for call in h.opener.calls}) == 5  # a new ticket for every connection


def test_channel_open_failure_falls_back_logged_once_and_retries_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = ChannelHarness(random=0.5)
    h.opener.outcomes = [LinkFailed("connection refused") for _ in range(4)]
    h.start()
    h.offer()
    h.run()
    assert h.time.waits == pytest.approx([0.9, 1.8, 3.6, 7.2])
    (line,) = _events(caplog, "channel_fallback")
    assert line.levelno == logging.WARNING and "connection refused" in line.getMessage()
    assert h.reports[0] == {"state": "fallback", "reason": "connection refused", "need_ticket": False}
    assert len({call.ticket for call in h.opener.calls}) == 1  # never presented: still good


def test_channel_fallback_is_logged_again_only_after_a_connection_opened(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "modelforge.agent")
    h = ChannelHarness()
    refused = LinkFailed("connection refused")
    h.opener.outcomes = [refused, refused, h.link(CLOSED), refused, refused]
    h.start()
    h.offer()
    h.run()
    assert len(_events(caplog, "channel_fallback")) == 2
    assert len(_events(caplog, "channel_connected")) == 1


def test_channel_refused_ticket_is_dropped_and_a_new_one_asked_for() -> None:
    h = ChannelHarness()
    h.opener.outcomes = [LinkFailed("handshake refused (HTTP 401): the ticket was not accepted", ticket_refused=True)]
    h.start()
    first = h.offer()
    h.run()
    assert h.reports[0] == {
        "state": "fallback",
        "reason": "handshake refused (HTTP 401): the ticket was not accepted",
        "need_ticket": True,
    }
    assert [call.ticket for call in h.opener.calls][0] == first
    assert h.opener.calls[1].ticket != first


def test_channel_report_asks_for_a_ticket_only_without_one_with_a_minute_left() -> None:
    h = ChannelHarness()
    assert h.channel.report() == {"state": "connecting", "need_ticket": True}
    h.offer(seconds=300)
    assert h.channel.report() == {"state": "connecting", "need_ticket": False}
    h.time.now += 241
    assert h.channel.report()["need_ticket"] is True


def test_channel_ticket_longer_than_ten_minutes_is_read_as_ten() -> None:
    h = ChannelHarness()
    h.offer(seconds=3600)
    h.time.now += 539
    assert h.channel.report()["need_ticket"] is False
    h.time.now += 2
    assert h.channel.report()["need_ticket"] is True


def test_channel_expired_ticket_is_not_used_to_connect() -> None:
    h = ChannelHarness()
    h.opener.outcomes = [h.link(CLOSED)]
    h.start()
    stale = h.offer(seconds=1)
    h.run()
    assert h.opener.calls[0].ticket != stale


def test_channel_ticket_without_a_readable_expiry_is_ignored() -> None:
    h = ChannelHarness()
    h.start()
    h.channel.offer({**channel_block("mfct_" + "0" * 43, 0.0), "expires_at": "2026-99-99T00:00:00Z"})
    assert h.channel.report()["need_ticket"] is True


def test_channel_off_reports_off_and_never_connects() -> None:
    h = ChannelHarness(enabled=False)
    h.start()
    h.offer()
    assert h.channel.report() == {"state": "off", "need_ticket": False}
    with pytest.raises(AssertionError, match="starts its loop once"):
        h.run()
    assert h.opener.calls == []


def test_channel_loop_starts_only_with_a_node_id_and_a_ticket() -> None:
    h = ChannelHarness()
    h.offer()  # the enroll answer's ticket comes before the node id is saved
    with pytest.raises(AssertionError):
        h.run()
    h.start()
    h.opener.outcomes = [h.link(CLOSED)]
    h.run()
    assert len(h.opener.calls) == 2


def test_channel_ticket_never_reaches_a_log_line_or_a_repr(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    h = ChannelHarness()
    refused = LinkFailed("handshake refused (HTTP 401): the ticket was not accepted", ticket_refused=True)
    h.opener.outcomes = [refused, h.link(WAKE, "junk", CLOSED), LinkFailed("connection refused")]
    h.start()
    h.offer()
    h.run()
    secrets = {call.ticket for call in h.opener.calls}
    assert secrets and all(secret not in caplog.text for secret in secrets)
    assert "mfct_" not in caplog.text
    h.offer()
    assert "mfct_" not in repr(h.channel.__dict__) and "mfct_" not in str(h.channel.report())


def test_channel_close_while_the_loop_waits_ends_it() -> None:
    h = ChannelHarness(heartbeats=False)
    h.opener.outcomes = [h.link(CLOSED)]
    h.start()
    h.offer()
    h.time.before_wait = h.channel.close  # the agent stops while the channel waits to reconnect
    h.run()
    assert len(h.opener.calls) == 1


def test_channel_bug_in_the_loop_falls_back_instead_of_stopping_the_agent(caplog: pytest.LogCaptureFixture) -> None:
    h = ChannelHarness()

    def broken() -> None:
        raise RuntimeError("a bug")

    h.opener.outcomes = [h.link(broken)]
    h.start()
    h.offer()
    h.run()
    assert h.channel.report()["state"] == "fallback"
    assert "RuntimeError" in h.channel.report()["reason"]
    (line,) = _events(caplog, "channel_stopped")
    assert line.levelno == logging.ERROR


def test_channel_default_spawn_runs_the_loop_on_a_daemon_thread() -> None:
    channel = Channel(lambda *_: (_ for _ in ()).throw(AssertionError("not dialled")))  # type: ignore[arg-type,misc]
    channel.close()  # closed before it starts: the loop ends at once
    channel.start(NODE_ID, on_wake=lambda: None, on_cancel=lambda _: None)
    channel.offer(channel_block("mfct_" + "1" * 43, 0.0, seconds=300))
    assert channel._thread is not None and channel._thread.daemon
    channel._thread.join(5)
    assert not channel._thread.is_alive()
