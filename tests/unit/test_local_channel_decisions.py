"""The local push channel's decisions, without a server: its port, its limits, connection ids, how a
handler's answer reads, and the events' shapes."""

from __future__ import annotations

import argparse
import re

import pytest
from modelforge_local_stack import channel_events as events
from modelforge_local_stack.channel_server import ChannelLimits
from modelforge_local_stack.local_stack import LocalOptions, channel_port
from modelforge_local_stack.local_up import _channel_options, add_arguments


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_channel_port_defaults_to_the_api_port_plus_1000() -> None:
    assert channel_port(LocalOptions(port=8000)) == 9000
    assert channel_port(LocalOptions(port=8001)) == 9001


def test_channel_port_is_any_free_one_when_the_api_port_is() -> None:
    assert channel_port(LocalOptions(port=0)) == 0


def test_channel_port_option_wins_over_the_default() -> None:
    assert channel_port(LocalOptions(port=8000, channel_port=0)) == 0
    assert channel_port(LocalOptions(port=8000, channel_port=7777)) == 7777


def test_local_up_channel_options_refuse_a_default_port_above_65535(capsys: pytest.CaptureFixture[str]) -> None:
    assert _channel_options(_args("--port", "65000")) is None
    assert "--channel-port" in capsys.readouterr().err
    assert _channel_options(_args("--port", "65000", "--channel-port", "0")) is not None


def test_local_up_channel_options_carry_the_shortened_limits() -> None:
    options = _channel_options(_args("--channel-max-seconds", "2", "--channel-idle-seconds", "0.5"))
    assert options is not None
    assert options["channel_limits"].max_seconds == 2 and options["channel_limits"].idle_seconds == 0.5
    assert options["channel_limits"].frame_bytes == 32 * 1024  # API Gateway's, not shortened


def test_channel_limits_default_to_api_gateways_and_refuse_nonsense() -> None:
    limits = ChannelLimits()
    assert (limits.max_seconds, limits.idle_seconds, limits.frame_bytes, limits.message_bytes) == (
        7200,
        600,
        32768,
        131072,
    )
    with pytest.raises(ValueError, match="greater than 0"):
        ChannelLimits(idle_seconds=0)
    with pytest.raises(ValueError, match="at least 1"):
        ChannelLimits(max_connections=0)


def test_connection_id_is_16_url_safe_characters_like_api_gateways() -> None:
    ids = {events.new_connection_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{14}==", connection_id) for connection_id in ids)


@pytest.mark.parametrize(
    ("answer", "status"),
    [({"statusCode": 200}, 200), ({"statusCode": 401, "body": "{}"}, 401), ({}, 200), (None, 500),
     ({"statusCode": "200"}, 500), ({"statusCode": True}, 500), ({"statusCode": 99}, 500)],
)  # fmt: skip
def test_status_of_a_handler_answer_reads_like_api_gateway(answer: object, status: int) -> None:
    assert events.status_of(answer) == status


def _context() -> events.ConnectionContext:
    return events.ConnectionContext("abcdefghijklmn==", "127.0.0.1:9000", "api", "127.0.0.1", "agent/1", 1000)


def test_connect_event_keeps_the_last_value_of_a_repeated_header_and_every_value_in_multi() -> None:
    event = events.connect_event(_context(), [("Authorization", "Bearer a"), ("Authorization", "Bearer b")])
    assert event["headers"] == {"Authorization": "Bearer b"}
    assert event["multiValueHeaders"] == {"Authorization": ["Bearer a", "Bearer b"]}
    context = event["requestContext"]
    assert (context["routeKey"], context["eventType"], context["connectionId"]) == (
        "$connect",
        "CONNECT",
        "abcdefghijklmn==",
    )
    assert context["apiId"] == events.LOCAL_API_ID and context["stage"] == "api" and context["connectedAt"] == 1000


def test_disconnect_event_carries_the_close_code_or_1006_when_there_was_none() -> None:
    closed = events.disconnect_event(_context(), 1001, "idle")["requestContext"]
    assert (closed["eventType"], closed["disconnectStatusCode"], closed["disconnectReason"]) == (
        "DISCONNECT",
        1001,
        "idle",
    )
    assert events.disconnect_event(_context(), None, "")["requestContext"]["disconnectStatusCode"] == 1006


def test_handlers_of_an_app_without_websocket_handlers_says_which_are_missing() -> None:
    import types

    from chalice import Chalice

    module = types.ModuleType("no_channel")
    module.app = Chalice(app_name="no-channel")  # type: ignore[attr-defined]
    with pytest.raises(events.NoChannelHandlers, match=r"\$connect"):
        events.handlers_of(module)
