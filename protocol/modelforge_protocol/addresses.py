"""Which hosts count as this machine's own: the rule behind "plain http only to loopback" (the
agent's control-plane and presigned URLs, what the CLI warns about) and "loopback only" (where the
runtime worker listens)."""

from __future__ import annotations

import ipaddress

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
