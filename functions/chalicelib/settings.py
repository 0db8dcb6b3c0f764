"""Control-plane settings: read once from the environment, validated whole.

Every problem is reported by variable name in one error; values are never echoed, since
some of them are secrets.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Mapping


class SettingsError(Exception):
    """The environment does not describe a valid configuration."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid control-plane configuration: " + "; ".join(problems))


@dataclass(frozen=True)
class Settings:
    admin_token_sha256: str = field(repr=False)
    enrollments_table: str
    nodes_table: str
    inventories_table: str
    outbox_table: str
    state_log_bucket: str
    heartbeat_interval_seconds: int
    stale_after_seconds: int
    offline_after_seconds: int
    outbox_retention_seconds: int


DEFAULT_NAMES = {
    "MODELFORGE_ENROLLMENTS_TABLE": "modelforge-enrollments",
    "MODELFORGE_NODES_TABLE": "modelforge-nodes",
    "MODELFORGE_INVENTORIES_TABLE": "modelforge-inventories",
    "MODELFORGE_OUTBOX_TABLE": "modelforge-outbox",
    "MODELFORGE_STATE_LOG_BUCKET": "modelforge-state-log",
}

_INTEGERS = {
    # name: (default, minimum, maximum)
    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": (15, 1, 3600),
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": (60, 1, 86400),
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": (300, 1, 7 * 86400),
    "MODELFORGE_OUTBOX_RETENTION_SECONDS": (7 * 86400, 3600, 365 * 86400),
}
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{3,255}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _read_int(env: Mapping[str, str], name: str, problems: list[str]) -> int:
    default, low, high = _INTEGERS[name]
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        problems.append(f"{name} must be an integer")
        return default
    if not low <= value <= high:
        problems.append(f"{name} must be between {low} and {high} (got {value})")
    return value


def _admin_token_sha256(env: Mapping[str, str], problems: list[str]) -> str:
    digest = env.get("MODELFORGE_ADMIN_TOKEN_SHA256", "").strip().lower()
    token = env.get("MODELFORGE_ADMIN_TOKEN", "")
    if digest and token:
        problems.append("set only one of MODELFORGE_ADMIN_TOKEN and MODELFORGE_ADMIN_TOKEN_SHA256")
    elif digest:
        if not _SHA256_RE.fullmatch(digest):
            problems.append("MODELFORGE_ADMIN_TOKEN_SHA256 must be 64 hexadecimal characters")
        return digest
    elif token:
        if len(token) < 32:
            problems.append("MODELFORGE_ADMIN_TOKEN must be at least 32 characters")
        return hashlib.sha256(token.encode("utf-8")).hexdigest()
    else:
        problems.append("MODELFORGE_ADMIN_TOKEN or MODELFORGE_ADMIN_TOKEN_SHA256 is required")
    return ""


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    problems: list[str] = []
    names = {}
    for var, default in DEFAULT_NAMES.items():
        value = env.get(var) or default
        if not _NAME_RE.fullmatch(value):
            problems.append(f"{var} must be 3-255 characters of letters, digits, '.', '_' or '-'")
        names[var] = value
    admin = _admin_token_sha256(env, problems)
    interval = _read_int(env, "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS", problems)
    stale = _read_int(env, "MODELFORGE_NODE_STALE_AFTER_SECONDS", problems)
    offline = _read_int(env, "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", problems)
    retention = _read_int(env, "MODELFORGE_OUTBOX_RETENTION_SECONDS", problems)
    if offline <= stale:
        problems.append(
            "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS must exceed MODELFORGE_NODE_STALE_AFTER_SECONDS "
            f"(got offline={offline}, stale={stale})"
        )
    if stale <= interval:
        problems.append(
            "MODELFORGE_NODE_STALE_AFTER_SECONDS must exceed MODELFORGE_HEARTBEAT_INTERVAL_SECONDS "
            f"(got stale={stale}, interval={interval})"
        )
    if problems:
        raise SettingsError(problems)
    return Settings(
        admin_token_sha256=admin,
        enrollments_table=names["MODELFORGE_ENROLLMENTS_TABLE"],
        nodes_table=names["MODELFORGE_NODES_TABLE"],
        inventories_table=names["MODELFORGE_INVENTORIES_TABLE"],
        outbox_table=names["MODELFORGE_OUTBOX_TABLE"],
        state_log_bucket=names["MODELFORGE_STATE_LOG_BUCKET"],
        heartbeat_interval_seconds=interval,
        stale_after_seconds=stale,
        offline_after_seconds=offline,
        outbox_retention_seconds=retention,
    )
