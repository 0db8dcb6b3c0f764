"""Opening the push channel: which URLs the agent dials at all, and how a failure is named (a few
plain words, never a URL, a Location or a ticket)."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import pytest
from modelforge_node_agent.channel_link import failure_reason, url_problem
from websockets.datastructures import Headers
from websockets.exceptions import InvalidMessage, InvalidStatus
from websockets.http11 import Response


@pytest.mark.parametrize(
    "url",
    [
        "wss://abc123.execute-api.eu-west-1.amazonaws.com/prod",
        "wss://channel.example.test:8443/api/v1/agent/channel",
        "ws://127.0.0.1:9000/api/v1/agent/channel",
        "ws://localhost:9000/api/v1/agent/channel",
        "ws://[::1]:9000/api/v1/agent/channel",
    ],
)
def test_channel_link_url_wss_or_ws_to_loopback_is_accepted(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(
    "url, problem",
    [
        ("ws://10.0.0.5:9000/c", "it must use wss:// (plain ws:// is allowed only for loopback addresses)"),
        ("ws://channel.example.test/c", "it must use wss:// (plain ws:// is allowed only for loopback addresses)"),
        ("https://channel.example.test/c", "it must be a wss:// URL"),
        ("wss:///c", "it must be a wss:// URL"),
        ("wss://user:pw@channel.example.test/c", "it must not carry user information or a fragment"),
        ("wss://channel.example.test/c#x", "it must not carry user information or a fragment"),
        ("wss://channel.example.test:99999/c", "its port is not a port number"),
    ],
)
def test_channel_link_url_other_schemes_hosts_and_shapes_are_refused(url: str, problem: str) -> None:
    assert url_problem(url) == f"channel URL refused: {problem}"


def _status(code: int, location: str | None = None) -> InvalidStatus:
    headers = Headers({"Location": location} if location else {})
    return InvalidStatus(Response(code, "x", headers, b"body with mfct_secret"))


def _redirect_declined(code: int) -> ValueError:
    """What websockets raises when it declines to follow a redirect (a preexisting socket)."""
    try:
        raise _status(code, "wss://elsewhere.test/?ticket=mfct_x")
    except InvalidStatus as status:
        try:
            raise ValueError("cannot follow redirect to wss://elsewhere.test/?ticket=mfct_x") from status
        except ValueError as declined:
            return declined


@pytest.mark.parametrize(
    "error, reason",
    [
        (_redirect_declined(302), "redirect refused (HTTP 302)"),
        (_status(308, "wss://elsewhere.test/"), "redirect refused (HTTP 308)"),
        (_status(401), "handshake refused (HTTP 401): the ticket was not accepted"),
        (_status(403), "handshake refused (HTTP 403): the ticket was not accepted"),
        (_status(426), "handshake refused (HTTP 426)"),
        (_status(503), "handshake refused (HTTP 503)"),
        (
            ssl.SSLCertVerificationError("certificate verify failed: unable to get local issuer"),
            "TLS: certificate verify failed",
        ),
        (
            ssl.SSLCertVerificationError("Hostname mismatch, certificate is not valid for 'x'. match"),
            "TLS: certificate does not match the host name",
        ),
        (ssl.SSLError("WRONG_VERSION_NUMBER"), "TLS handshake failed"),
        (ConnectionRefusedError(111, "refused"), "connection refused"),
        (socket.gaierror(-2, "Name or service not known"), "host name not resolved"),
        (TimeoutError("timed out while waiting for handshake response"), "timed out opening the channel"),
        (InvalidMessage("did not receive a valid HTTP response"), "not a WebSocket handshake (InvalidMessage)"),
        (OSError(113, "No route to host"), "could not connect (OSError)"),
    ],
)
def test_channel_link_failure_is_named_in_plain_words_without_its_text(error: Any, reason: str) -> None:
    assert failure_reason(error) == reason
    assert "mfct_" not in reason and "elsewhere" not in reason
