"""The API Gateway management API of the local push channel (``@connections``), on the channel's port.

What the control plane's channel store calls through boto3's ``apigatewaymanagementapi`` client
(endpoint ``MODELFORGE_CHANNEL_MANAGEMENT_URL``), answered as API Gateway answers it:

- ``POST /@connections/{id}``: the body (UTF-8, at most 128 KB) goes to the connection as one
  text message: 200 with no body; 410 ``GoneException`` when no such connection is open;
- ``DELETE /@connections/{id}``: closes it (code 1000): 204; 410 when unknown;
- ``GET /@connections/{id}``: ``connectedAt``, ``identity``, ``lastActiveAt``; 410 when unknown.

Errors are AWS's rest-json shape (``x-amzn-ErrorType`` and ``{"message": ...}``), so boto3 raises
the named exception (``client.exceptions.GoneException``). An unsigned request is refused 403
``ForbiddenException`` as API Gateway refuses it (the signature itself is not checked: the port is
on 127.0.0.1 and a message is only a hint). Each request is bounded like the API server's: one
``Content-Length`` framing, a deadline for reading it and for the idle keep-alive wait.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from modelforge_protocol.http_server import BodyRefused, Framing, request_body_length

if TYPE_CHECKING:
    from .channel_server import ChannelServer

CONNECTIONS_PREFIX = "/@connections/"
_FRAMING = Framing(max_digits=9, repeated_identical_lengths=False)
#: API Gateway's management calls are SigV4-signed; an unsigned one gets this answer.
_SIGNED = "AWS4-HMAC-SHA256 "


def aws_error(status: HTTPStatus, kind: str, message: str) -> tuple[HTTPStatus, dict[str, str], bytes]:
    body = json.dumps({"message": message}).encode()
    return status, {"x-amzn-ErrorType": kind, "Content-Type": "application/json"}, body


def gone(connection_id: str) -> tuple[HTTPStatus, dict[str, str], bytes]:
    return aws_error(HTTPStatus.GONE, "GoneException", f"no open connection {connection_id}")


class ManagementHandler(BaseHTTPRequestHandler):
    """One management request (keep-alive: more may follow on the same connection)."""

    server: ChannelServer
    protocol_version = "HTTP/1.1"
    server_version = "modelforge-local-channel"
    sys_version = ""

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_GET(self) -> None:
        self._serve("GET")

    def _serve(self, method: str) -> None:
        try:
            length = request_body_length(self.headers, self.server.limits.message_bytes, _FRAMING)
        except BodyRefused as refused:
            kind = "PayloadTooLargeException" if refused.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE else "BadRequest"
            self._answer(*aws_error(refused.status, kind, f"request refused: {refused.kind}"), close=True)
            return
        body = self.rfile.read(length) if length else b""
        if len(body) < length or not self.server.pause_deadline():
            self.close_connection = True  # the client went away or ran out of time
            return
        self._answer(*self._route(method, body))
        self.server.arm_deadline("idle")

    def _route(self, method: str, body: bytes) -> tuple[HTTPStatus, dict[str, str], bytes]:
        path = urlsplit(self.path).path
        if not path.startswith(CONNECTIONS_PREFIX) or "/" in path[len(CONNECTIONS_PREFIX) :]:
            return aws_error(HTTPStatus.NOT_FOUND, "NotFoundException", "no such route: /@connections/{id} only")
        if not (self.headers.get("Authorization") or "").startswith(_SIGNED):
            return aws_error(HTTPStatus.FORBIDDEN, "ForbiddenException", "Missing Authentication Token")
        connection_id = unquote(path[len(CONNECTIONS_PREFIX) :])
        if method == "POST":
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                return aws_error(HTTPStatus.BAD_REQUEST, "BadRequestException", "the message must be UTF-8 text")
            if not self.server.send(connection_id, text):
                return gone(connection_id)
            return HTTPStatus.OK, {}, b""
        if method == "DELETE":
            if not self.server.close_connection_id(connection_id):
                return gone(connection_id)
            return HTTPStatus.NO_CONTENT, {}, b""
        described = self.server.describe(connection_id)
        if described is None:
            return gone(connection_id)
        return HTTPStatus.OK, {"Content-Type": "application/json"}, json.dumps(described).encode()

    def _answer(self, status: HTTPStatus, headers: dict[str, str], body: bytes, *, close: bool = False) -> None:
        self.server.arm_deadline("responding")
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if status != HTTPStatus.NO_CONTENT:
            self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body:
            self.wfile.write(body)
        self.wfile.flush()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, a method it has no handler for...), in AWS's shape."""
        status = HTTPStatus(code)
        kind = "NotFoundException" if status == HTTPStatus.NOT_IMPLEMENTED else "BadRequestException"
        if status == HTTPStatus.NOT_IMPLEMENTED:
            status = HTTPStatus.NOT_FOUND  # API Gateway: a method a route lacks is no route
        self._answer(*aws_error(status, kind, message or status.phrase), close=True)

    def log_message(self, format: str, *args: Any) -> None:
        """No access lines: the channel server logs what matters as JSON lines."""
