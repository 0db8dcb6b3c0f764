"""Serve the Chalice app over HTTP(S) on one machine, the way API Gateway would call it.

chalice local's server has a listen queue of 5 (60 concurrent clients get resets) and
answers keep-alive clients slowly (Nagle + delayed ACK). This server reuses chalice's
API Gateway emulation (``LocalGateway``) with a deep listen queue and TCP_NODELAY, and it
is hardened against hostile clients (the deadlines, the cap and the framing rules come from the
bottom layer's ``modelforge_protocol.http_server``, which the runtime worker's server shares):

- every connection has a deadline (TLS handshake, idle keep-alive wait, request line,
  headers and body all count; the app's own work does not). The serve loop shuts down
  connections past their deadline, so a client that trickles bytes is cut off as surely as
  an idle one, without a timer thread per request;
- at most ``max_connections`` connections are served at once; beyond that a connection is
  answered 503 ``server_busy`` (plain HTTP) or closed (TLS) by the accept loop itself,
  and no handler thread starts;
- the app runs for at most ``max_invocations`` requests at once, the others waiting their turn in
  arrival order once their body is read (``invocation_gate``); one that waited too long is answered
  503 ``server_busy``;
- the request body is framed by one valid Content-Length of at most
  ``modelforge_protocol.schemas.MAX_BODY_BYTES``, checked before the body is read;
  Transfer-Encoding is refused (no chunked bodies, so no request smuggling);
- the caller's secret is checked from the headers before the body is read, by the app's own checks
  (``chalicelib.services.auth``) for the route's declared security: an admin route without the
  admin token, or a node route without a well-formed credential, gets the app's 401/403 answer
  and a closed connection, and its body is never buffered (the app checks the credential itself);
- HEAD answers carry headers only, and every refusal uses the API's JSON error shape (an unknown
  path: 404 ``not_found``; a method the path lacks, whatever the method: 405
  ``method_not_allowed`` with ``Allow``); a refusal of a ``/console`` path carries the console's
  security headers, as every console answer does;
- a connection error is one JSON log line (``connection_error``), never a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import socket
import ssl
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from chalice.config import Config
from chalice.local import (
    ChaliceRequestHandler,
    CustomLocalChalice,
    ForbiddenError,
    LocalChalice,
    LocalGatewayException,
    RouteMatcher,
)
from chalicelib import instance  # importable once .catalogue put functions/ on the path
from chalicelib.api import console
from chalicelib.api.error_answers import http_status
from chalicelib.api.operation import ADMIN, NODE, Operation, declared
from chalicelib.config.settings import SettingsError
from chalicelib.domain.errors import DomainError
from chalicelib.services.auth import require_admin, require_node
from modelforge_protocol import http_server as hardened
from modelforge_protocol.http_server import BodyRefused, Framing, HardenedServer, request_body_length
from modelforge_protocol.schemas import MAX_BODY_BYTES
from modelforge_protocol.work import MAX_SUBMIT_BODY_BYTES

from .catalogue import FUNCTIONS_DIR
from .connection_limits import DEFAULT_CONNECTION_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS
from .invocation_gate import DEFAULT_MAX_INVOCATIONS, MAX_WAIT_SECONDS, InvocationGate

#: The largest body the server reads: what the API accepts, no more.
MAX_REQUEST_BYTES = MAX_BODY_BYTES
#: Routes that accept more (work submission: as much as API Gateway and Lambda take).
LARGER_BODIES = {("POST", "/api/v1/admin/work"): MAX_SUBMIT_BODY_BYTES}
#: After a refusal the server discards at most this much of what the client still sends, for
#: at most this long, so that the client can read the answer before the socket closes.
LINGER_BYTES = 1024 * 1024
LINGER_SECONDS = 2.0
#: Content-Length: at most 9 digits; the same value repeated in several fields is one length.
_FRAMING = Framing(max_digits=9, repeated_identical_lengths=True)
#: The answer to each framing refusal: status, code, message (a too-large body names its limit).
_REFUSALS = {
    hardened.TRANSFER_ENCODING_MALFORMED: (
        HTTPStatus.BAD_REQUEST,
        "invalid_transfer_encoding",
        "Transfer-Encoding names no coding",
    ),
    hardened.CHUNKED: (HTTPStatus.LENGTH_REQUIRED, "length_required", "send the body with a Content-Length"),
    hardened.TRANSFER_ENCODING: (HTTPStatus.NOT_IMPLEMENTED, "not_implemented", "Transfer-Encoding is not supported"),
    hardened.CONTENT_LENGTH_INVALID: (
        HTTPStatus.BAD_REQUEST,
        "invalid_content_length",
        "Content-Length must be one decimal number",
    ),
    hardened.TOO_LARGE: (
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        "payload_too_large",
        "request body exceeds {limit} bytes",
    ),
}

log = logging.getLogger("modelforge.local.http")


def load_app(functions_dir: Path = FUNCTIONS_DIR) -> ModuleType:
    """Import functions/app.py as Chalice would package it (chalicelib is installed: functions/pyproject.toml)."""
    existing = sys.modules.get("modelforge_functions_app")
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location("modelforge_functions_app", functions_dir / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    # one request per thread: give current_request thread-local storage, as chalice local does
    app = module.app
    if not isinstance(app, LocalChalice):
        CustomLocalChalice.__bases__ = (LocalChalice, app.__class__)
        app.__class__ = CustomLocalChalice
    return module


#: The answer for a path the API does not have (the deployed gateway answers the same, and answers
#: it for a method a path does not have too: see docs/DEPLOY.md, "Unknown paths and methods").
NOT_FOUND = "not_found"
GATEWAY_ROUTE_NOT_FOUND = "no such route: check the path and the method (and MODELFORGE_AGENT_CONTROL_PLANE_URL)"
#: The answer for a method a path does not have, with an ``Allow`` header naming those it has.
METHOD_NOT_ALLOWED = "method_not_allowed"


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


_BUSY_BODY = error_body("server_busy", "too many connections; retry later")
_WAITED_TOO_LONG = error_body(
    "server_busy", f"the app was busy for {MAX_WAIT_SECONDS:g} s with other requests; retry later"
)
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n".encode()
    + _BUSY_BODY
)


class _Refusal(Exception):
    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Handler(ChaliceRequestHandler):
    server: ApiServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_expect_100(self) -> bool:
        """No "100 Continue" for a request that will be refused: refuse it before its body."""
        try:
            self._content_length()
            self._authenticate()
        except _Refusal:
            return True
        return bool(super().handle_expect_100())

    def _generic_handle(self) -> None:
        """chalice's handler, with the body framed and bounded, the caller authenticated from the
        headers before the body is read, and the deadline paused for the app."""
        try:
            length = self._content_length()
            self._authenticate()
        except _Refusal as refusal:
            self._refuse(refusal.status, refusal.code, refusal.message)
            return
        body = self.rfile.read(length) if length else None
        if (body is not None and len(body) < length) or not self.server.pause_deadline():
            self.close_connection = True  # the client went away or ran out of time: nothing to answer
            return
        if self.command == "OPTIONS":
            self.server.arm_deadline("responding")
            self._send_options_refusal()
            self.server.arm_deadline("idle")
            return
        with self.server.invocations.turn() as admitted:
            if not admitted:
                self.server.arm_deadline("responding")
                self._refuse_with(
                    HTTPStatus.SERVICE_UNAVAILABLE, _WAITED_TOO_LONG, {**self._console_headers(), "Retry-After": "1"}
                )
                return
            try:
                response = self.local_gateway.handle_request(
                    method=self.command, path=self.path, headers=dict(self.headers), body=body
                )
            except LocalGatewayException as error:
                self.server.arm_deadline("responding")
                self._send_gateway_refusal(error)
                return
        self.server.arm_deadline("responding")
        headers = {**response["headers"], **response["multiValueHeaders"]}
        response = self._handle_binary(response)
        self._send_http_response(response["statusCode"], headers, response["body"])
        self.wfile.flush()
        self.server.arm_deadline("idle")  # until the next request on this connection is read

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _generic_handle

    def _console_headers(self) -> dict[str, str]:
        """The console's security headers when the request is for a ``/console`` path, else none:
        the server's own refusals of console paths carry them, as the app's answers do."""
        target = getattr(self, "path", "") or ""
        try:
            path = urlsplit(target).path
        except ValueError:
            return {}
        return dict(console.SECURITY_HEADERS) if console.is_console_path(path) else {}

    def _send_gateway_refusal(self, error: LocalGatewayException) -> None:
        """The gateway's own refusals in the API's error shape, as the deployed stack's gateway
        responses give them (infra.py). chalice's body would echo an Authorization header, and
        with it a node credential: it is never sent."""
        if isinstance(error, ForbiddenError):  # API Gateway's answer for a route that does not exist
            status, code, message = HTTPStatus.NOT_FOUND, NOT_FOUND, GATEWAY_ROUTE_NOT_FOUND
        else:
            status, code, message = HTTPStatus(error.CODE), "request_refused", "the API gateway refused the request"
        body = error_body(code, message)
        self._send_http_response(status, {**self._console_headers(), "Content-Type": "application/json"}, body)

    def _method_refusal(self) -> tuple[HTTPStatus, bytes, dict[str, str]]:
        """A method no route of this path has: 405 with ``Allow``, or 404 when the path is unknown."""
        allowed = self.server.allowed_methods(self.path)
        if allowed is None:
            return HTTPStatus.NOT_FOUND, error_body(NOT_FOUND, GATEWAY_ROUTE_NOT_FOUND), self._console_headers()
        message = f"{self.command} is not a method of this path; it has {', '.join(allowed)}"
        headers = {**self._console_headers(), "Allow": ", ".join(allowed)}
        return HTTPStatus.METHOD_NOT_ALLOWED, error_body(METHOD_NOT_ALLOWED, message), headers

    def _send_options_refusal(self) -> None:
        """No route has OPTIONS (the API sets no CORS): refused like any method a path lacks.
        chalice local would answer an automatic 200."""
        status, body, headers = self._method_refusal()
        self._send_http_response(status, {"Content-Type": "application/json", **headers}, body)
        self.wfile.flush()

    def _content_length(self) -> int:
        """The body's length, from exactly one valid Content-Length, or the refusal to send."""
        limit = LARGER_BODIES.get((self.command, urlsplit(self.path).path), MAX_REQUEST_BYTES)
        try:
            return request_body_length(self.headers, limit, _FRAMING)
        except BodyRefused as refused:
            status, code, message = _REFUSALS[refused.kind]
            raise _Refusal(status, code, message.format(limit=limit)) from None

    def _authenticate(self) -> None:
        """Refuse, from the headers alone, a caller the app would refuse before reading the body:
        an admin route without the admin token, a node route without a well-formed credential.
        The checks are the app's own (``chalicelib.services.auth``) for the route's declared
        security, so the answer is the app's; a route that is not found, a public route or an
        unreadable configuration is left to the app."""
        operation = self.server.operation(self.command, self.path)
        if operation is None or operation.security not in (ADMIN, NODE):
            return
        headers = dict(self.headers)  # what the app is given: the first of repeated fields
        try:
            if operation.security == NODE:
                require_node(headers)
            else:
                require_admin(headers, instance.get().settings.admin_token_sha256)
        except DomainError as error:
            log.info(
                "refused before the body",
                extra={
                    "event": "refused_before_body",
                    "method": self.command,
                    "path": operation.path,
                    "code": error.code,
                },
            )
            raise _Refusal(HTTPStatus(http_status(error)), error.code, error.message) from None
        except SettingsError:
            return  # the app answers configuration_invalid

    def _refuse(self, status: HTTPStatus, code: str, message: str) -> None:
        """Answer in the API's error shape, unread body and all, then close the connection."""
        self._refuse_with(status, error_body(code, message), self._console_headers())

    def _refuse_with(self, status: HTTPStatus, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True
        self._linger()

    def _linger(self) -> None:
        """Discard (never parse) a bounded amount of what the client still sends, so the close
        does not reset the connection before the client has read the refusal."""
        try:
            self.wfile.flush()
            if not isinstance(self.connection, ssl.SSLSocket):
                self.connection.shutdown(socket.SHUT_WR)
            drained, until = 0, time.monotonic() + LINGER_SECONDS
            while drained < LINGER_BYTES and (left := until - time.monotonic()) > 0:
                self.connection.settimeout(left)
                chunk = self.connection.recv(64 * 1024)
                if not chunk:
                    return
                drained += len(chunk)
        except OSError:
            return

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, headers too long...), in the API's shape.
        A method this server has no handler for (TRACE, CONNECT, any other token) is refused as
        every method a path lacks is, not as 501."""
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command and not hasattr(self, "do_" + self.command):
            self._refuse_with(*self._method_refusal())
            return
        status = HTTPStatus(code)
        self._refuse(status, status.phrase.lower().replace(" ", "_").replace("-", "_"), message or status.phrase)

    def _send_http_response_with_body(self, code: int, headers: dict[str, Any], body: str | bytes) -> None:
        if self.command != "HEAD":
            super()._send_http_response_with_body(code, headers, body)
            return
        encoded = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Length", str(len(encoded)))
        self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        self._send_headers(headers)  # headers only: a HEAD answer has no body

    def log_message(self, format: str, *args: Any) -> None:
        """Access lines come from the app's structured log, not from http.server."""


class ApiServer(HardenedServer, HTTPServer):
    log = log
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(
        self,
        host: str,
        port: int,
        app: Any,
        tls: ssl.SSLContext | None = None,
        *,
        connection_timeout_seconds: float = DEFAULT_CONNECTION_TIMEOUT_SECONDS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_invocations: int = DEFAULT_MAX_INVOCATIONS,
    ) -> None:
        #: the app runs for at most ``max_invocations`` requests at once, the others in line
        self.invocations = InvocationGate(max_invocations)
        self.init_hardening(max_connections=max_connections, connection_timeout_seconds=connection_timeout_seconds)
        self.tls = tls
        self.busy_response = None if tls else _BUSY_RESPONSE  # TLS: closed, a plain-text answer would not be read
        self._routes: dict[str, dict[str, Any]] = app.routes
        self._route_matcher = RouteMatcher(list(app.routes))

        def handler(request: Any, client_address: Any, server: ApiServer) -> _Handler:
            return _Handler(request, client_address, server, app_object=app, config=Config(chalice_stage="dev"))

        super().__init__((host, port), handler)

    def operation(self, method: str, target: str) -> Operation | None:
        """The declared operation of the route ``method`` and ``target`` (a request target) reach,
        or None: no such route."""
        try:
            matched = self._route_matcher.match_route(target)
        except ValueError:
            return None
        entry = self._routes[matched.route].get(method)
        return None if entry is None else declared(entry.view_function)

    def allowed_methods(self, target: str) -> list[str] | None:
        """The methods of the route ``target`` (a request target) matches, or None: no such path."""
        try:
            matched = self._route_matcher.match_route(target)
        except ValueError:
            return None
        return list(self._routes[matched.route])

    def first_phase(self) -> str:
        return "handshake" if self.tls else "request"

    # --- TLS and errors -----------------------------------------------------------------

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        record = self.current_connection
        secure = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        if record is not None:  # the reaper must see the socket that now owns the file descriptor
            self.replace_socket(record, secure)
        try:
            try:
                secure.do_handshake()  # under the connection's deadline
            except (ssl.SSLError, OSError) as error:
                self._log_connection_error(client_address, error, "handshake")
                return
            self.arm_deadline("request")
            super().finish_request(secure, client_address)
        finally:
            self.forget(request)
            secure.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One JSON line per failed connection: no traceback, no headers, no body."""
        self._log_connection_error(client_address, sys.exc_info()[1], "request")

    @staticmethod
    def _log_connection_error(client_address: Any, error: BaseException | None, phase: str) -> None:
        fields: dict[str, Any] = {
            "event": "connection_error",
            "client": str(client_address[0]) if client_address else None,
            "phase": phase,
            "error": type(error).__name__,
        }
        if isinstance(error, OSError):
            fields["errno"] = error.errno
            log.info("connection error", extra=fields)
            return
        if error is not None and error.__traceback__ is not None:  # a bug: say where, not what it held
            frame = traceback.extract_tb(error.__traceback__)[-1]
            fields["at"] = f"{Path(frame.filename).name}:{frame.lineno}"
        log.error("connection failed", extra=fields)


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    return context


class ServerThread:
    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self._thread = threading.Thread(target=server.serve_forever, name="api-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
