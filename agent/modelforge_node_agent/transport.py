"""The agent's HTTPS session: verification always on, an optional private CA added to the
system trust store, and an optional address override that connects to
MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS while verifying the certificate against the URL's
host name (SNI and hostname check both use the URL's name).

Redirects are never followed (the session finds no redirect target in any answer, and every
call also passes ``allow_redirects=False``): a redirect could carry the credential, the
enrollment token and the Host override to another origin, or downgrade https to http. Answers
are asked for uncompressed, so the size cap on answers is a cap on what is read. Every
connection enlists under the running request's whole-request deadline (``deadline.POOL_CLASSES``).

Nothing comes from the environment (``trust_env`` off): no ``~/.netrc`` or ``$NETRC`` credential
(which would replace the node's bearer credential, or reach the object host), no ``HTTPS_PROXY``,
``REQUESTS_CA_BUNDLE`` or ``NO_PROXY``. The one proxy is ``MODELFORGE_AGENT_HTTPS_PROXY``: every
https:// request tunnels through it (CONNECT), with the same verification of the far end; the
plain http:// allowed only to loopback addresses stays direct.

Also how a failed exchange on these sessions is named (``network_label``: the error class, never a
URL or a body) and how an answer is read under a cap (``read_capped``)."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3
from modelforge_protocol import capped_read
from requests.adapters import HTTPAdapter

from .config import AgentConfig
from .deadline import POOL_CLASSES

#: What a request or the reading of its answer can raise when the network or the server fails.
NETWORK_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, OSError)
#: The label of an exchange cut by its whole-request deadline.
DEADLINE_EXCEEDED = "DeadlineExceeded"
#: What OpenSSL says when an https:// URL reaches a server that answers in plain HTTP.
_PLAIN_HTTP_SIGNS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG")


def _tls_hint(error: requests.exceptions.SSLError) -> str:
    reason = str(error)
    if "match" in reason and "hostname" in reason.lower():
        return "certificate does not match the host name"
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        return "certificate verify failed"
    if any(sign in reason.upper() for sign in _PLAIN_HTTP_SIGNS):
        return (
            "TLS handshake failed: the server answered in plain HTTP, not HTTPS. Check that the server serves "
            "HTTPS on this port, or use http:// (allowed for loopback addresses only)"
        )
    return "TLS handshake failed: check that the server serves HTTPS on this address and port"


def network_label(error: BaseException) -> tuple[str, str]:
    """The label of one of ``NETWORK_ERRORS`` (its class, in words an operator knows) and, for TLS,
    a hint at the cause; never a URL or a body."""
    if isinstance(error, requests.exceptions.SSLError):
        return "TLSError", _tls_hint(error)
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return "ConnectTimeout", ""
    if isinstance(error, requests.exceptions.ConnectionError):
        return "ConnectError", ""
    if isinstance(error, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)):
        return "ReadTimeout", ""
    return type(error).__name__, ""


def read_capped(response: requests.Response, max_bytes: int) -> bytes:
    """The whole raw body of a streamed answer, or ``capped_read.Compressed`` / ``TooLarge`` as soon
    as it is known to be compressed or to exceed ``max_bytes`` (``modelforge_protocol.capped_read``)."""
    return capped_read.read_capped(
        lambda size: response.raw.read(size, decode_content=False), response.headers, max_bytes
    )


class _AgentAdapter(HTTPAdapter):
    def __init__(self, ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        if self._ssl_context is not None:
            kwargs["ssl_context"] = self._ssl_context
        if self._server_hostname is not None:
            kwargs["server_hostname"] = self._server_hostname
            kwargs["assert_hostname"] = self._server_hostname
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = POOL_CLASSES

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        if self._ssl_context is not None:  # the far end (and an https:// proxy) verified as without one
            proxy_kwargs.setdefault("ssl_context", self._ssl_context)
            if proxy.lower().startswith("https:"):
                proxy_kwargs.setdefault("proxy_ssl_context", self._ssl_context)
        if self._server_hostname is not None:
            proxy_kwargs.setdefault("server_hostname", self._server_hostname)
            proxy_kwargs.setdefault("assert_hostname", self._server_hostname)
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools have their own connection classes
            manager.pool_classes_by_scheme = POOL_CLASSES
        return manager


class _NoRedirectSession(requests.Session):
    """A session that sees no redirect in any answer, so it can never follow one, whatever a
    caller passes. (``max_redirects = 0`` would not do: with ``allow_redirects=False``, requests
    still looks for the next hop, reads the 3xx body and raises TooManyRedirects.)"""

    def get_redirect_target(self, resp: requests.Response) -> None:
        return None


def _ssl_context(config: AgentConfig) -> ssl.SSLContext | None:
    if config.ca_cert_path is None:
        return None
    context = ssl.create_default_context()  # the system's trust store ...
    context.load_verify_locations(cafile=str(config.ca_cert_path))  # ... plus the private CA
    return context


def base_url(config: AgentConfig) -> str:
    """The URL requests go to: the configured one, or its host replaced by the override address."""
    if config.control_plane_host_address is None:
        return config.control_plane_url
    parts = urlsplit(config.control_plane_url)
    address = config.control_plane_host_address
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"  # IPv6 literal
    netloc = f"{address}:{parts.port}" if parts.port else address
    return urlunsplit((parts.scheme, netloc, "", "", ""))


def _session(config: AgentConfig) -> requests.Session:
    """A session that reads nothing from the environment and proxies only as configured."""
    session = _NoRedirectSession()
    session.trust_env = False
    if config.https_proxy is not None:
        session.proxies = {"https": config.https_proxy}
    return session


def build_session(config: AgentConfig) -> requests.Session:
    session = _session(config)
    session.verify = config.tls_verify
    override = config.control_plane_host_address is not None
    adapter = _AgentAdapter(_ssl_context(config), config.url_host if override else None)
    session.mount("https://", adapter)
    session.mount("http://", _AgentAdapter())
    if override:
        parts = urlsplit(config.control_plane_url)
        session.headers["Host"] = parts.netloc
    session.headers["User-Agent"] = "modelforge-node-agent"
    session.headers["Accept-Encoding"] = "identity"
    return session


def build_object_session(config: AgentConfig) -> requests.Session:
    """The session for presigned object URLs (work input and result): the same trust (private CA
    added to the system's, verification as configured) and the same refusal of redirects, but
    neither the host-address override nor any header of the control plane's (the URL's signature
    is the only credential; the node's never goes there)."""
    session = _session(config)
    session.verify = config.tls_verify
    session.mount("https://", _AgentAdapter(_ssl_context(config)))
    session.mount("http://", _AgentAdapter())
    session.headers["User-Agent"] = "modelforge-node-agent"
    session.headers["Accept-Encoding"] = "identity"
    return session
