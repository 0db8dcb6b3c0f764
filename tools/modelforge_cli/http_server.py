"""Serve the Chalice app over HTTP(S) on one machine, the way API Gateway would call it.

chalice local's server has a listen queue of 5 (60 concurrent clients get resets) and
answers keep-alive clients slowly (Nagle + delayed ACK). This server reuses chalice's
API Gateway emulation (``LocalGateway``) with a deep listen queue, TCP_NODELAY, a bounded
request body, and optional TLS with the handshake done on the connection's own thread.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import ssl
import sys
import threading
from http.server import HTTPServer
from pathlib import Path
from socketserver import ThreadingMixIn
from types import ModuleType
from typing import Any

from chalice.config import Config
from chalice.local import ChaliceRequestHandler, CustomLocalChalice, LocalChalice

FUNCTIONS_DIR = Path(__file__).resolve().parents[2] / "functions"
#: API Gateway's own payload limit; the app refuses anything over its much smaller limit.
MAX_REQUEST_BYTES = 10 * 1024 * 1024


def load_app(functions_dir: Path = FUNCTIONS_DIR) -> ModuleType:
    """Import functions/app.py as Chalice would package it (with chalicelib importable)."""
    if str(functions_dir) not in sys.path:
        sys.path.insert(0, str(functions_dir))
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


class _Handler(ChaliceRequestHandler):
    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _generic_handle(self) -> None:
        length = self.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_REQUEST_BYTES:
            body = json.dumps(
                {"error": {"code": "payload_too_large", "message": "request body is too large"}}
            ).encode()
            self.send_response(413)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        super()._generic_handle()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _generic_handle

    def log_message(self, format: str, *args: Any) -> None:
        """Access lines come from the app's structured log, not from http.server."""


class ApiServer(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, host: str, port: int, app: Any, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        handler = lambda *args: _Handler(*args, app_object=app, config=Config(chalice_stage="dev"))  # noqa: E731
        super().__init__((host, port), handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(30)
        try:
            secure = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # the client's TLS error is the client's to report
        secure.settimeout(None)
        try:
            super().finish_request(secure, client_address)
        finally:
            secure.close()


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
