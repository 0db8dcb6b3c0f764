"""How a node's push channel reads in views and readiness: ``connected`` or ``fallback`` and why."""

from __future__ import annotations

from chalicelib.domain.records import Node

CONNECTED, FALLBACK = "connected", "fallback"
NO_CONNECTION = "no channel connection"
NOT_CONFIGURED = "this control plane has no push channel (MODELFORGE_CHANNEL_URL is not set)"
TURNED_OFF = "the agent's push channel is turned off by its settings"


def channel_of(node: Node, configured: bool) -> tuple[str, str | None]:
    """``connected`` (no reason) while the control plane holds a live connection for the node; else
    ``fallback`` (the heartbeat's work hint) with the agent's last reported reason."""
    if not configured:
        return FALLBACK, NOT_CONFIGURED
    if node.channel_connection_id:
        return CONNECTED, None
    if node.channel_reason:
        return FALLBACK, node.channel_reason
    return FALLBACK, TURNED_OFF if node.channel_state == "off" else NO_CONNECTION
