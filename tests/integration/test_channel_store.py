"""The channel store (stores/channel_store.py) against a management API on 127.0.0.1 shaped as API
Gateway's: ``POST /@connections/{id}`` (the message bytes; 410 when the connection is gone) and
``DELETE /@connections/{id}`` (204; 410 when gone). Sends are signed boto3 requests, made by a client
created on first use."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote

import pytest
from chalicelib.stores.channel_store import ApiGatewayChannelStore

LIVE = "L0SM9cOFvHcCIhw="
LIVE_PATH = f"/@connections/{quote(LIVE, safe='')}"


class _Management(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes, str]] = []
    open_connections: set[str] = set()

    def _answer(self) -> None:
        connection = unquote(self.path.rsplit("/", 1)[-1])  # botocore sends "=" as %3D
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append((self.command, self.path, body, self.headers.get("Authorization", "")))
        known = connection in self.open_connections
        if self.command == "DELETE" and known:
            self.open_connections.discard(connection)
        status = (200 if self.command == "POST" else 204) if known else 410
        payload = b"" if status == 204 else json.dumps({"message": "gone"} if status == 410 else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status == 410:
            self.send_header("x-amzn-ErrorType", "GoneException")
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self._answer()

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer()

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture()
def management(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "local")
    _Management.received, _Management.open_connections = [], {LIVE}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Management)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_channel_store_send_posts_the_message_to_the_connection(management: str) -> None:
    store = ApiGatewayChannelStore(management)
    assert store.send(LIVE, {"v": 1, "type": "wake"}) is True
    [(method, path, body, authorization)] = _Management.received
    assert (method, path) == ("POST", LIVE_PATH)
    assert json.loads(body) == {"v": 1, "type": "wake"}
    assert authorization.startswith("AWS4-HMAC-SHA256 ")  # signed as API Gateway requires


def test_channel_store_send_to_a_gone_connection_is_false(management: str) -> None:
    assert ApiGatewayChannelStore(management).send("gone=", {"v": 1, "type": "wake"}) is False
    assert len(_Management.received) == 1  # tried once, no retry


def test_channel_store_close_deletes_the_connection_and_a_gone_one_quietly(management: str) -> None:
    store = ApiGatewayChannelStore(management)
    store.close(LIVE)
    store.close(LIVE)  # gone by now: 410, nothing raised
    assert [(method, path) for method, path, _, _ in _Management.received] == [("DELETE", LIVE_PATH)] * 2


def test_channel_store_refuses_a_message_over_1_kib(management: str) -> None:
    with pytest.raises(ValueError):
        ApiGatewayChannelStore(management).send(LIVE, {"v": 1, "type": "wake", "pad": "x" * 1024})
    assert _Management.received == []


def test_channel_store_without_a_management_url_fails_loudly() -> None:
    with pytest.raises(RuntimeError):
        ApiGatewayChannelStore(None).send(LIVE, {"v": 1, "type": "wake"})
