"""Which hosts count as this machine's own: the rule behind "plain http only to loopback" (the
agent's control-plane and presigned URLs, what the CLI warns about) and "loopback only" (where the
runtime worker listens)."""

from __future__ import annotations

import ipaddress
import re

_LOOPBACK_NAMES = ("localhost",)


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback IP address (127.0.0.0/8, ``::1``); a URL's bracketed IPv6 host
    is passed without its brackets, as ``urlsplit().hostname`` gives it."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: One DNS label: letters, digits and inner hyphens, 1 to 63 characters.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_IPV4 = r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#: ``scheme://host[:port]``, an optional ``/`` after it, and nothing else: the host a DNS name, an
#: IPv4 address or a bracketed IPv6 address (checked further below); no userinfo, path, query,
#: fragment, whitespace or control character. ``scripts/_node_agent_compose.sh`` applies the same
#: shape to a node's ``.env``.
_ORIGIN = re.compile(
    rf"(?P<scheme>https?)://(?P<host>{_IPV4}|\[[0-9A-Fa-f:.]{{2,45}}\]|{_LABEL}(?:\.{_LABEL})*\.?)"
    r"(?::(?P<port>[0-9]{1,5}))?/?"
)
ORIGIN_SHAPE = (
    "an origin, https://host[:port] (http:// only for a loopback address): the host a DNS name, an IPv4 address "
    "or a bracketed IPv6 address; no path, user, query, space, quote or control character"
)


def origin_problem(raw: str) -> str | None:
    """Why ``raw`` is not an origin a node may be given as its control plane's address (None when
    it is one): exactly ``ORIGIN_SHAPE``, the whole string, nothing stripped or dropped."""
    match = _ORIGIN.fullmatch(raw)
    if match is None or len(raw) > 2048:
        return f"must be {ORIGIN_SHAPE}"
    host = match["host"]
    if not re.fullmatch(_IPV4, host) and host.rstrip(".").rsplit(".", 1)[-1].isdigit():
        return f"must be {ORIGIN_SHAPE} ({host} is neither an IPv4 address nor a DNS name)"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"must be {ORIGIN_SHAPE} ({host} is not an IPv6 address)"
    port = match["port"]
    if port is not None and not 1 <= int(port) <= 65535:
        return "must have a port from 1 to 65535"
    if match["scheme"] == "http" and not is_loopback_host(host.strip("[]")):
        return "must use https:// (plain http:// is allowed only for a loopback address)"
    return None
