"""Opening one push-channel connection (a WebSocket, ``websockets``' sync client), and naming why
one could not be opened.

The rules, each the HTTP path's too:

- the URL is ``wss://``, or ``ws://`` only to a loopback address (``config.scheme_problem``), and is
  refused before anything is dialled;
- TLS is always verified: the system's trust store plus ``MODELFORGE_AGENT_CA_CERT_PATH`` when set.
  ``MODELFORGE_AGENT_TLS_VERIFY=false`` (development only) does not reach the channel;
- no proxy from the environment (``HTTPS_PROXY`` and the like are never read): the agent dials the
  TCP connection itself and hands the socket to ``websockets`` (which then neither looks for a proxy
  nor can follow a redirect: it never reuses a given socket for another request). ``proxy=None``
  says so once more. The one exception is ``MODELFORGE_AGENT_HTTPS_PROXY``: a wss:// channel then
  tunnels through that proxy (``websockets`` sends the CONNECT; TLS to the far end is verified as
  without a proxy); a ws:// channel (loopback only) stays direct;
- a 3xx answer to the handshake is refused, its Location never read or shown;
- the handshake runs under one deadline (``open_seconds``), the closing one under ``close_seconds``;
  a message larger than ``MAX_MESSAGE_BYTES`` (API Gateway's 128 KB) closes the connection;
  compression is off (messages are tiny; nothing to inflate);
- the handshake carries ``X-ModelForge-Node-Id`` and ``Authorization: Bearer <ticket>``, and nothing
  else of the node's: never its credential.

A dead peer is found by TCP keep-alive on that socket; the channel's own ``ping`` message keeps API
Gateway's idle timer from closing it (``channel``).

Failures become ``LinkFailed`` with a reason in a few plain words (never a URL, a header or a
ticket) and whether the ticket was refused (401/403: the agent needs a new one).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from modelforge_protocol.credentials import NODE_ID_HEADER
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidProxyStatus,
    InvalidStatus,
    InvalidURI,
    ProxyError,
)
from websockets.sync.client import ClientConnection, connect

from .config import scheme_problem

#: API Gateway's largest message; the library closes the connection on a bigger one.
MAX_MESSAGE_BYTES = 128 * 1024
#: TCP keep-alive on the channel's socket: a peer gone silent is noticed within about two minutes.
KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_PROBES = 60, 20, 3
USER_AGENT = "modelforge-node-agent"
#: The library's own log lines can name the URL; the agent says what matters itself.
_QUIET = logging.getLogger("modelforge.agent.channel.websockets")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class LinkFailed(Exception):
    """The channel could not be opened (or broke): ``reason`` is safe to log and to report."""

    def __init__(self, reason: str, *, ticket_refused: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ticket_refused = ticket_refused


class Link(Protocol):
    """One open connection, as the channel uses it."""

    def recv(self, timeout: float) -> str | bytes | None:
        """The next message, or None when ``timeout`` seconds passed; ``LinkFailed`` once closed."""

    def send(self, text: str) -> None:
        """Send a text message; ``LinkFailed`` once closed."""


#: Opens one connection: ``opener(url, node_id, ticket)`` is a context manager that yields a
#: ``Link`` and closes it on exit, or raises ``LinkFailed``.
Opener = Callable[[str, str, str], contextlib.AbstractContextManager[Link]]


def url_problem(url: str) -> str | None:
    """Why the agent refuses this channel URL, or None (checked before anything is dialled)."""
    problem = scheme_problem(url, "wss", "ws")
    if problem is not None:
        return f"channel URL refused: it {problem}"
    parts = urlsplit(url)
    if parts.username or parts.password or parts.fragment:
        return "channel URL refused: it must not carry user information or a fragment"
    try:
        parts.port  # noqa: B018 - a port out of range or not a number raises
    except ValueError:
        return "channel URL refused: its port is not a port number"
    return None


def tls_context(ca_cert_path: Path | None) -> ssl.SSLContext:
    """Verification on, always: the system's trust store plus the private CA when configured."""
    context = ssl.create_default_context()
    if ca_cert_path is not None:
        context.load_verify_locations(cafile=str(ca_cert_path))
    return context


class _WebSocketLink:
    def __init__(self, connection: ClientConnection) -> None:
        self._connection = connection

    def recv(self, timeout: float) -> str | bytes | None:
        try:
            return self._connection.recv(timeout=max(0.0, timeout))
        except TimeoutError:
            return None
        except ConnectionClosed as closed:
            raise LinkFailed(_closed_reason(closed)) from None
        except OSError as error:
            raise LinkFailed(f"connection lost ({type(error).__name__})") from None

    def send(self, text: str) -> None:
        try:
            self._connection.send(text)
        except ConnectionClosed as closed:
            raise LinkFailed(_closed_reason(closed)) from None
        except OSError as error:
            raise LinkFailed(f"connection lost ({type(error).__name__})") from None


def _closed_reason(closed: ConnectionClosed) -> str:
    code = closed.rcvd.code if closed.rcvd is not None else None
    return f"closed by the server (code {code})" if code is not None else "connection lost"


class WebSocketOpener:
    """The real ``Opener``: one verified, redirect-refusing connection at a time, direct or through
    the configured proxy only."""

    def __init__(
        self,
        tls: ssl.SSLContext,
        *,
        open_seconds: float,
        close_seconds: float = 1.0,
        dial: Callable[[tuple[str, int], float], socket.socket] = socket.create_connection,
        proxy: str | None = None,
    ) -> None:
        """``proxy``: ``MODELFORGE_AGENT_HTTPS_PROXY`` (wss:// only), or None: dialled directly."""
        self._tls = tls
        self._proxy = proxy
        self._open_seconds = open_seconds
        self._close_seconds = close_seconds
        self._dial = dial

    @contextlib.contextmanager
    def __call__(self, url: str, node_id: str, ticket: str) -> Iterator[Link]:
        problem = url_problem(url)
        if problem is not None:
            raise LinkFailed(problem)
        connection = self._handshake(url, node_id, ticket)
        with connection:  # closes (close frame, then the socket) on the way out
            yield _WebSocketLink(connection)

    def _handshake(self, url: str, node_id: str, ticket: str) -> ClientConnection:
        parts = urlsplit(url)
        secure = parts.scheme == "wss"
        address = (parts.hostname or "", parts.port or (443 if secure else 80))
        tunnelled = secure and self._proxy is not None
        sock: socket.socket | None = None
        if not tunnelled:
            try:
                sock = self._dial(address, self._open_seconds)
            except OSError as error:
                raise LinkFailed(failure_reason(error)) from None
            _keep_alive(sock)
        https_proxy = tunnelled and str(self._proxy).lower().startswith("https:")
        try:
            connection = connect(
                url,
                sock=sock,
                ssl=self._tls if secure else None,
                proxy=self._proxy if tunnelled else None,
                proxy_ssl=self._tls if https_proxy else None,
                compression=None,
                additional_headers={NODE_ID_HEADER: node_id, "Authorization": f"Bearer {ticket}"},
                user_agent_header=USER_AGENT,
                open_timeout=self._open_seconds,
                close_timeout=self._close_seconds,
                ping_interval=None,
                max_size=MAX_MESSAGE_BYTES,
                max_queue=4,
                logger=_QUIET,
            )
        except (OSError, InvalidHandshake, InvalidURI, ValueError) as error:
            if sock is not None:
                sock.close()
            status = _status(error)
            raise LinkFailed(failure_reason(error), ticket_refused=status in (401, 403)) from None
        if tunnelled:
            _keep_alive(connection.socket)
        with contextlib.suppress(OSError):  # a socket already closed: the first recv says so
            connection.socket.settimeout(None)  # the dial's timeout was for opening (TLS clears it itself)
        return connection


def _keep_alive(sock: socket.socket) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not every platform names every option
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECONDS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


def _status(error: BaseException | None) -> int | None:
    """The handshake answer's HTTP status, found on the error or the one it was raised from (a
    redirect the library declined to follow is raised from the ``InvalidStatus``)."""
    seen = 0
    while error is not None and seen < 4:
        if isinstance(error, InvalidStatus):
            return int(error.response.status_code)
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _proxy_reason(error: ProxyError) -> str:
    """MODELFORGE_AGENT_HTTPS_PROXY did not open the tunnel (never its address: it may carry credentials)."""
    if isinstance(error, InvalidProxyStatus):
        return f"the proxy refused the tunnel (HTTP {error.response.status_code})"
    return "the proxy did not open a tunnel"


def failure_reason(error: BaseException) -> str:
    """A few plain words for why opening failed: the class of failure, never its text (which can
    name the URL, a redirect's Location or a header)."""
    if isinstance(error, ProxyError):
        return _proxy_reason(error)
    status = _status(error)
    if status is not None:
        if 300 <= status < 400:
            return f"redirect refused (HTTP {status})"
        if status in (401, 403):
            return f"handshake refused (HTTP {status}): the ticket was not accepted"
        return f"handshake refused (HTTP {status})"
    if isinstance(error, ssl.SSLCertVerificationError):
        if "match" in str(error) and "hostname" in str(error).lower():
            return "TLS: certificate does not match the host name"
        return "TLS: certificate verify failed"
    if isinstance(error, ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "host name not resolved"
    if isinstance(error, TimeoutError):
        return "timed out opening the channel"
    if isinstance(error, (InvalidHandshake, InvalidURI)):
        return f"not a WebSocket handshake ({type(error).__name__})"
    return f"could not connect ({type(error).__name__})"
