"""The local push channel's server on 127.0.0.1, driving a small Chalice app with the control plane's
handler names: API Gateway's events, its management API through boto3 (as the control plane calls
it), and its limits, shortened."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore.config import Config
from modelforge_local_stack.channel_events import handlers_of
from modelforge_local_stack.channel_server import CHANNEL_PATH, ChannelLimits, ChannelServer
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support import raw_http
from tests.support.channel_app import GOOD, Recorded, channel_app
from tests.support.polling import wait_until


@pytest.fixture(autouse=True)
def _region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # Chalice's handler configures its client with it


@contextmanager
def running(limits: ChannelLimits | None = None) -> Iterator[tuple[ChannelServer, Recorded]]:
    module, recorded = channel_app()
    server = ChannelServer("127.0.0.1", 0, handlers_of(module), limits)
    server.start()
    try:
        yield server, recorded
    finally:
        server.stop()


def open_channel(server: ChannelServer, authorization: str = GOOD, **kwargs: Any) -> ClientConnection:
    headers = {"Authorization": authorization, "X-ModelForge-Node-Id": "node_test"}
    return connect(server.channel_url, additional_headers=headers, proxy=None, open_timeout=5, **kwargs)


def management(server: ChannelServer) -> Any:
    config = Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5)
    return boto3.client(
        "apigatewaymanagementapi",
        endpoint_url=server.management_url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=config,
    )


def connection_id(recorded: Recorded) -> str:
    accepted = wait_until(lambda: recorded.of("$connect"), 5, "a $connect")
    return str(accepted[-1]["requestContext"]["connectionId"])


def closed_with(channel: ClientConnection) -> tuple[int | None, str | None]:
    with pytest.raises(ConnectionClosed):
        channel.recv(timeout=10)
    return channel.close_code, channel.close_reason


@pytest.mark.parametrize(("authorization", "status"), [("", 401), ("Bearer other", 401), ("Bearer revoked", 403)])
def test_channel_refuses_the_handshake_with_the_connect_handlers_status(authorization: str, status: int) -> None:
    with running() as (server, recorded):
        with pytest.raises(InvalidStatus) as refused:
            open_channel(server, authorization)
        assert refused.value.response.status_code == status
        assert json.loads(refused.value.response.body)["error"]["code"]
        assert server.connection_ids == []
        assert recorded.of("$disconnect") == []  # nothing was connected, so nothing disconnects


def test_channel_connect_event_is_shaped_as_api_gateway_sends_it() -> None:
    with running() as (server, recorded), open_channel(server):
        (event,) = recorded.of("$connect")
        context = event["requestContext"]
        assert context["routeKey"] == "$connect" and context["eventType"] == "CONNECT"
        assert context["apiId"] and context["stage"] == "api" and context["domainName"].startswith("127.0.0.1:")
        assert len(context["connectionId"]) == 16 and context["connectionId"] in server.connection_ids
        assert event["headers"]["Authorization"] == GOOD
        assert event["headers"]["X-ModelForge-Node-Id"] == "node_test"


def test_channel_messages_reach_the_default_handler_and_binary_arrives_as_base64_text() -> None:
    with running() as (server, recorded), open_channel(server) as channel:
        channel.send('{"v": 1, "type": "ping"}')
        channel.send(b"\x00\x01")
        messages = wait_until(lambda: len(recorded.of("$default")) == 2 and recorded.of("$default"), 5, "2 messages")
        assert [m["body"] for m in messages] == ['{"v": 1, "type": "ping"}', base64.b64encode(b"\x00\x01").decode()]
        assert messages[0]["requestContext"]["eventType"] == "MESSAGE"
        assert messages[0]["requestContext"]["connectionId"] == connection_id(recorded)


def test_channel_management_post_delivers_one_text_message_and_get_describes_the_connection() -> None:
    with running() as (server, recorded), open_channel(server) as channel:
        client = management(server)
        client.post_to_connection(ConnectionId=connection_id(recorded), Data=b'{"v":1,"type":"wake"}')
        assert channel.recv(timeout=5) == '{"v":1,"type":"wake"}'
        described = client.get_connection(ConnectionId=connection_id(recorded))
        assert described["Identity"]["SourceIp"] == "127.0.0.1"


def test_channel_management_post_splits_a_long_message_into_frames_the_client_reassembles() -> None:
    with running() as (server, recorded), open_channel(server, max_size=2**20) as channel:
        text = "x" * (100 * 1024)
        management(server).post_to_connection(ConnectionId=connection_id(recorded), Data=text.encode())
        assert channel.recv(timeout=5) == text


def test_channel_management_answers_410_gone_for_an_unknown_connection() -> None:
    with running() as (server, _):
        client = management(server)
        with pytest.raises(client.exceptions.GoneException):
            client.post_to_connection(ConnectionId="AAAAAAAAAAAAAAA=", Data=b"{}")
        with pytest.raises(client.exceptions.GoneException):
            client.delete_connection(ConnectionId="AAAAAAAAAAAAAAA=")


def test_channel_management_delete_closes_the_connection_and_it_disconnects() -> None:
    with running() as (server, recorded), open_channel(server) as channel:
        client = management(server)
        connection = connection_id(recorded)
        client.delete_connection(ConnectionId=connection)
        assert closed_with(channel)[0] == 1000
        (event,) = wait_until(lambda: recorded.of("$disconnect"), 5, "a $disconnect")
        assert event["requestContext"]["connectionId"] == connection
        assert event["requestContext"]["disconnectStatusCode"] == 1000
        with pytest.raises(client.exceptions.GoneException):
            client.post_to_connection(ConnectionId=connection, Data=b"{}")


def test_channel_management_refuses_an_unsigned_request_and_an_oversized_message() -> None:
    with running() as (server, recorded), open_channel(server):
        target = f"/@connections/{connection_id(recorded)}"
        assert _raw(server, f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}").startswith(
            b"HTTP/1.1 403"
        )
        with pytest.raises(management(server).exceptions.PayloadTooLargeException):
            management(server).post_to_connection(ConnectionId=connection_id(recorded), Data=b"x" * (128 * 1024 + 1))


def test_channel_closes_an_idle_connection_with_1001_and_says_why() -> None:
    with running(ChannelLimits(idle_seconds=0.3)) as (server, recorded), open_channel(server) as channel:
        code, reason = closed_with(channel)
        assert code == 1001 and reason is not None and "idle" in reason
        wait_until(lambda: recorded.of("$disconnect"), 5, "a $disconnect")


def test_channel_closes_a_connection_at_its_maximum_age_even_while_it_talks() -> None:
    with running(ChannelLimits(max_seconds=0.6, idle_seconds=5)) as (server, _), open_channel(server) as channel:

        def closed() -> bool:
            try:
                channel.send('{"v": 1, "type": "ping"}')
            except ConnectionClosed:
                return True
            return False

        wait_until(closed, 5, "the close at the maximum age", interval=0.1)
        assert channel.close_code == 1001 and "maximum" in (channel.close_reason or "")


@pytest.mark.parametrize("fragments", [[33 * 1024], [32 * 1024] * 4 + [1024]], ids=["frame", "message"])
def test_channel_closes_with_1009_a_frame_over_32_kb_or_a_message_over_128_kb(fragments: list[int]) -> None:
    with running() as (server, recorded), open_channel(server) as channel:
        parts = ["x" * size for size in fragments]
        try:
            channel.send(parts if len(parts) > 1 else parts[0])
        except ConnectionClosed:
            # the server closed before the client had sent every fragment: the close is the answer
            assert channel.close_code == 1009
        else:
            assert closed_with(channel)[0] == 1009
        assert recorded.of("$default") == []


def test_channel_accepts_a_message_of_several_frames_within_the_limits() -> None:
    with running() as (server, recorded), open_channel(server) as channel:
        channel.send(["y" * (30 * 1024)] * 4)
        (message,) = wait_until(lambda: recorded.of("$default"), 5, "the message")
        assert len(message["body"]) == 120 * 1024


def test_channel_caps_connections_and_refuses_the_next_one_without_calling_the_app() -> None:
    """Over the cap the accept loop answers 503 at once and closes, before it reads the handshake,
    so the third client is a raw socket (a WebSocket client still sending its handshake can meet the
    close first and report it in its own way). The app never hears of it."""
    with running(ChannelLimits(max_connections=2)) as (server, recorded), open_channel(server), open_channel(server):
        wait_until(lambda: server.open_connections == 2, 5, "two connections")
        with raw_http.connect(server.channel_url.replace("ws://", "http://", 1)) as third:
            answer = raw_http.read_until_closed(third, within=5)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert len(recorded.of("$connect")) == 2


def test_channel_refuses_oversized_handshake_headers_and_a_plain_get_without_calling_the_app() -> None:
    with running(ChannelLimits(handshake_header_bytes=1024)) as (server, recorded):
        with pytest.raises(InvalidStatus) as refused:
            open_channel(server, GOOD + " " + "x" * 2048)
        assert refused.value.response.status_code == 431
        answer = _raw(server, f"GET {CHANNEL_PATH} HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 426")
        assert recorded.of("$connect") == []


def test_channel_stop_closes_open_connections_with_1001_and_each_disconnects() -> None:
    module, recorded = channel_app()
    server = ChannelServer("127.0.0.1", 0, handlers_of(module))
    server.start()
    with open_channel(server) as first, open_channel(server) as second:
        server.stop()
        for channel in (first, second):
            assert closed_with(channel)[0] == 1001
    assert len(recorded.of("$disconnect")) == 2
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", server.port)) != 0  # nothing listens any more


def _raw(server: ChannelServer, request: str) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request.encode())
        return sock.recv(4096)
