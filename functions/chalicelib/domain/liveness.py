"""Liveness derived from the server-side last heartbeat time, and the keys the sweep reads by.

online while the last heartbeat is younger than stale_after; stale from stale_after until
offline_after; offline from offline_after on. A node that never sent a heartbeat is pending.
"""

from __future__ import annotations

PENDING = "pending"
ONLINE = "online"
STALE = "stale"
OFFLINE = "offline"

#: Partitions of the sweep's index per liveness state, so heartbeats of a large fleet do not all
#: write to one index partition.
SHARDS = 4


def derive(last_heartbeat_at: float | None, now: float, stale_after: int, offline_after: int) -> str:
    if last_heartbeat_at is None:
        return PENDING
    age = now - last_heartbeat_at
    if age < stale_after:
        return ONLINE
    if age < offline_after:
        return STALE
    return OFFLINE


def shard_of(node_id: str) -> int:
    return int(node_id[-8:], 16) % SHARDS


def index_partition(liveness: str, node_id: str) -> str | None:
    """The sweep index partition of a node in this state; None (not indexed) unless online or stale."""
    if liveness not in (ONLINE, STALE):
        return None
    return f"{liveness}#{shard_of(node_id)}"


def bucket(timestamp: float, width_seconds: int) -> int:
    """Start of the bucket holding ``timestamp`` (buckets are ``width_seconds`` wide)."""
    return int(timestamp // width_seconds) * width_seconds
