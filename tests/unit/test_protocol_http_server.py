"""The bottom layer's hardened HTTP base: framing rules, the connection cap and the deadlines, on a
tiny standard-library server in this process (real sockets, no sleeps: polls with deadlines)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from modelforge_protocol import http_server
from modelforge_protocol.http_server import BodyRefused, Framing, HardenedServer, request_body_length

from tests.support.polling import wait_until
from tests.support.raw_http import closed_within

STRICT = Framing(max_digits=12, repeated_identical_lengths=False)
LENIENT = Framing(max_digits=9, repeated_identical_lengths=True)


def _headers(*fields: tuple[str, str]) -> Message:
    message = Message()
    for name, value in fields:
        message[name] = value
    return message


def test_request_body_length_one_valid_length_is_returned() -> None:
    assert request_body_length(_headers(("Content-Length", "12")), 100, STRICT) == 12
    assert request_body_length(_headers(), 100, STRICT) == 0


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ([("Transfer-Encoding", "chunked")], http_server.CHUNKED),
        ([("Transfer-Encoding", "gzip, chunked")], http_server.CHUNKED),
        ([("Transfer-Encoding", "gzip")], http_server.TRANSFER_ENCODING),
        ([("Transfer-Encoding", " , ")], http_server.TRANSFER_ENCODING_MALFORMED),
        ([("Content-Length", "-1")], http_server.CONTENT_LENGTH_INVALID),
        ([("Content-Length", "²")], http_server.CONTENT_LENGTH_INVALID),
        ([("Content-Length", "2"), ("Content-Length", "3")], http_server.CONTENT_LENGTH_INVALID),
        ([("Content-Length", "101")], http_server.TOO_LARGE),
    ],
)
def test_request_body_length_bad_framing_is_refused_before_reading(fields: list[tuple[str, str]], kind: str) -> None:
    with pytest.raises(BodyRefused) as refused:
        request_body_length(_headers(*fields), 100, STRICT)
    assert refused.value.kind == kind


def test_request_body_length_too_large_carries_the_declared_length_and_413() -> None:
    with pytest.raises(BodyRefused) as refused:
        request_body_length(_headers(("Content-Length", "101")), 100, STRICT)
    assert (refused.value.length, refused.value.limit, refused.value.status) == (101, 100, 413)


def test_request_body_length_repeated_identical_lengths_follow_the_framing() -> None:
    twice = _headers(("Content-Length", "5"), ("Content-Length", "5"))
    assert request_body_length(twice, 100, LENIENT) == 5
    with pytest.raises(BodyRefused):
        request_body_length(twice, 100, STRICT)


def test_request_body_length_more_digits_than_the_framing_allows_is_invalid() -> None:
    with pytest.raises(BodyRefused) as refused:
        request_body_length(_headers(("Content-Length", "0000000001")), 10**12, LENIENT)
    assert refused.value.kind == http_server.CONTENT_LENGTH_INVALID


# --- a tiny server on the base --------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Tiny

    def handle_one_request(self) -> None:
        self.server.arm_deadline("request")
        super().handle_one_request()

    def do_GET(self) -> None:
        self.server.pause_deadline()
        self.server.arm_deadline("responding")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _Tiny(HardenedServer, HTTPServer):
    busy_response = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy"

    def __init__(self, max_connections: int, timeout: float) -> None:
        self.init_hardening(max_connections=max_connections, connection_timeout_seconds=timeout)
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@pytest.fixture()
def tiny() -> Iterator[_Tiny]:
    server = _Tiny(max_connections=2, timeout=0.5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _connect(server: _Tiny) -> socket.socket:
    return socket.create_connection(server.server_address[:2], timeout=5)  # type: ignore[arg-type]


def test_hardened_server_idle_and_trickling_connections_are_cut_off_at_the_deadline(tiny: _Tiny) -> None:
    with _connect(tiny) as idle:
        assert closed_within(idle, within=5) is not None
    with _connect(tiny) as slow:
        closed = closed_within(slow, within=5, trickle=b"GET / HTTP/1.1\r\nX-Slow: " + b"a" * 200)
    assert closed is not None and closed < 3


def test_hardened_server_past_the_cap_answers_busy_and_recovers(tiny: _Tiny) -> None:
    held = [_connect(tiny), _connect(tiny)]
    try:
        wait_until(lambda: tiny.open_connections == 2, 5, "both connections accepted")
        with _connect(tiny) as third:
            third.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert third.recv(1024).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: tiny.open_connections == 0, 5, "the slots to free up")
    with _connect(tiny) as fourth:
        fourth.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert fourth.recv(1024).startswith(b"HTTP/1.1 200")


def test_hardened_server_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        _Tiny(max_connections=0, timeout=1)
