"""Liveness derived from the server-side last heartbeat time.

online while the last heartbeat is younger than stale_after; stale from stale_after until
offline_after; offline from offline_after on. A node that never sent a heartbeat is pending.
"""

from __future__ import annotations

PENDING = "pending"
ONLINE = "online"
STALE = "stale"
OFFLINE = "offline"


def derive(last_heartbeat_at: float | None, now: float, stale_after: int, offline_after: int) -> str:
    if last_heartbeat_at is None:
        return PENDING
    age = now - last_heartbeat_at
    if age < stale_after:
        return ONLINE
    if age < offline_after:
        return STALE
    return OFFLINE
