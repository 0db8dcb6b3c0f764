"""Control-plane settings: read once from the environment, validated whole.

Every problem is reported by variable name in one error; values are never echoed, since
some of them are secrets.
"""

from __future__ import annotations

import collections
import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from modelforge_protocol.addresses import is_loopback_host
from modelforge_protocol.environment import Reader

from chalicelib.config import resources


class SettingsError(Exception):
    """The environment does not describe a valid configuration."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid control-plane configuration: " + "; ".join(problems))


@dataclass(frozen=True)
class Settings:
    """The control plane's configuration, read once per function instance from its environment."""

    admin_token_sha256: str = field(repr=False)
    #: physical name of each resource, by its logical name in the catalogue (resources.py)
    names: dict[str, str]
    heartbeat_interval_seconds: int
    stale_after_seconds: int
    offline_after_seconds: int
    outbox_retention_seconds: int
    mass_stale_fraction: float
    readiness_inventory_max_age_seconds: int
    #: inventory replacements one node may make per INVENTORY_RATE_WINDOW_SECONDS
    inventory_rate_limit: int
    #: the push channel's URL agents open (wss://, ws:// to loopback only); None: no channel, every
    #: agent in fallback (the heartbeat's work hint)
    channel_url: str | None = None
    #: the API Gateway management API that sends on the channel's connections (https://, http:// to
    #: loopback only); set exactly when channel_url is
    channel_management_url: str | None = None
    #: the interval answered to a node without a live channel connection: its work hint is its only
    #: dispatch, so it keeps the shorter interval agents had before the channel (never above
    #: heartbeat_interval_seconds)
    fallback_heartbeat_interval_seconds: int = 15
    #: accept nodes whose inventory says ``simulated`` (an agent on a scripted NVML fake): a
    #: development control plane's choice, never the deployed stack's default
    allow_simulated_nodes: bool = False
    #: the sweep removes nodes offline for longer than this many days (services/node_removal.py);
    #: None (``MODELFORGE_NODE_RETENTION_DAYS`` unset, the default): none is removed automatically
    node_retention_days: int | None = None

    @property
    def features(self) -> list[str]:
        """What the answers advertise beyond protocol 1's base: ``node_fault``, ``slots``,
        ``gpu_health``, ``agent_instance``, and ``push_channel`` with a channel."""
        base = ["node_fault", "slots", "gpu_health", "agent_instance"]
        return [*base, "push_channel"] if self.channel_url else base

    def answer_interval(self, channel_connected: bool) -> int:
        """The heartbeat interval to answer a node: the channel's wake makes a connected node's
        dispatch independent of its heartbeats, so it gets the cheaper interval; any other node
        (no channel configured, connecting, fallback, off, an older agent) keeps the shorter one."""
        if channel_connected and self.channel_url:
            return self.heartbeat_interval_seconds
        return min(self.fallback_heartbeat_interval_seconds, self.heartbeat_interval_seconds)

    @property
    def state_log_bucket(self) -> str:
        return self.names[resources.STATE_LOG_BUCKET.name]

    @property
    def sweep_bucket_seconds(self) -> int:
        """Width of the buckets the sweep's index sorts by: stale - interval.

        The index entry is written when a node enters online or stale, with the start of that
        moment's bucket, never by a steady heartbeat: the bucket starts at or before every
        heartbeat since, so the width never delays a transition, and the sweep reads the last
        heartbeat of the nodes the index names to keep the late ones (stores/node_store.py).
        """
        return max(1, self.stale_after_seconds - self.heartbeat_interval_seconds)


_INTEGERS = {
    # name: (default, minimum, maximum)
    # a heartbeat every 45 s: under $0.20 a node-month with the push channel, and a silent node
    # stale within 90 s (bench/README.md, "cost.py"); dispatch does not wait for heartbeats
    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": (45, 1, 3600),
    # nodes without a live channel connection: the work hint every 15 s, as before the channel
    "MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS": (15, 1, 3600),
    "MODELFORGE_READINESS_INVENTORY_MAX_AGE_SECONDS": (7200, 10, 7 * 86400),
    "MODELFORGE_OUTBOX_RETENTION_SECONDS": (7 * 86400, 3600, 365 * 86400),
    "MODELFORGE_INVENTORY_RATE_LIMIT": (10, 1, 1000),
}
#: The window of MODELFORGE_INVENTORY_RATE_LIMIT (replacements per node per window).
INVENTORY_RATE_WINDOW_SECONDS = 600
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{3,255}\Z")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _read_int(reader: Reader, name: str) -> int:
    default, low, high = _INTEGERS[name]
    value: int = reader.integer(name, default, low, high)
    return value


STALE_VAR = "MODELFORGE_NODE_STALE_AFTER_SECONDS"
OFFLINE_VAR = "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS"


def _positive_int(raw: str | None) -> int | None:
    text = (raw or "").strip()
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) == 0:
        return None
    return int(text)


def _liveness_thresholds(env: Mapping[str, str], problems: list[str]) -> tuple[int, int]:
    """Both thresholds are required positive integers, and offline must exceed stale.

    Any violation gets one message naming both variables and both values as given, so an
    operator sees the pair that has to change together.
    """
    raw_stale, raw_offline = env.get(STALE_VAR), env.get(OFFLINE_VAR)
    stale, offline = _positive_int(raw_stale), _positive_int(raw_offline)
    if stale is None or offline is None or offline <= stale:
        shown = ", ".join(
            f"{name}={'<missing>' if raw is None else repr(raw)[:24]}"
            for name, raw in ((STALE_VAR, raw_stale), (OFFLINE_VAR, raw_offline))
        )
        problems.append(
            f"liveness thresholds are invalid ({shown}): both must be positive integers (seconds) "
            f"and {OFFLINE_VAR} must exceed {STALE_VAR}"
        )
        return 0, 0
    return stale, offline


def _read_fraction(reader: Reader, name: str, default: float) -> float:
    raw = reader.text(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        reader.problems.append(f"{name} must be a number greater than 0 and at most 1")
        return default
    return value


#: The admin token must carry at least this much estimated entropy (bits).
MIN_ADMIN_TOKEN_BITS = 128
MIN_ADMIN_TOKEN_LENGTH = 32


def admin_token_weakness(token: str) -> str | None:
    """Why ``token`` is too weak to guard the admin API, or None. Never says what it is.

    A heuristic, not a proof: at least 32 characters, not a repetition of a shorter string, and
    an estimated entropy (length × the Shannon entropy of its characters) of 128 bits or more.
    32 random bytes in base64 or hex (``modelforge admin-token new``, ``openssl rand -base64 32``)
    pass with a wide margin; ``"a" * 40`` or ``"abcd" * 10`` do not.
    """
    if len(token) < MIN_ADMIN_TOKEN_LENGTH:
        return f"must be at least {MIN_ADMIN_TOKEN_LENGTH} characters"
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text"
    if token != token.strip():
        return "must not start or end with whitespace"
    doubled = (token + token).find(token, 1)
    if doubled < len(token):
        return "must not be a repeated pattern"
    counts = collections.Counter(token)
    per_char = -sum(n / len(token) * math.log2(n / len(token)) for n in counts.values())
    if per_char * len(token) < MIN_ADMIN_TOKEN_BITS:
        return f"looks too predictable (under {MIN_ADMIN_TOKEN_BITS} bits of estimated entropy)"
    return None


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
        weakness = admin_token_weakness(token)
        if weakness:
            problems.append(f"MODELFORGE_ADMIN_TOKEN {weakness}; generate one with `modelforge admin-token new`")
            return ""
        return hashlib.sha256(token.encode("utf-8")).hexdigest()
    else:
        problems.append("MODELFORGE_ADMIN_TOKEN or MODELFORGE_ADMIN_TOKEN_SHA256 is required")
    return ""


def _resource_names(reader: Reader, problems: list[str]) -> dict[str, str]:
    """Every table and the bucket must be named: a missing name is a configuration error, never a
    silent default (the deployed stack sets them all; `modelforge local up` sets its own)."""
    names = {}
    for resource in resources.ALL:
        value = reader.text(resource.env_var)
        if not value:
            problems.append(
                f"{resource.env_var} is required (the physical name of the {resource.name} {resource.kind})"
            )
        elif not _NAME_RE.fullmatch(value):
            problems.append(f"{resource.env_var} must be 3-255 characters of letters, digits, '.', '_' or '-'")
        names[resource.name] = value
    return names


#: days a node may stay offline before the sweep removes it (unset: never)
NODE_RETENTION_DAYS_VAR = "MODELFORGE_NODE_RETENTION_DAYS"


def _node_retention_days(reader: Reader) -> int | None:
    """A whole number of days from 1 to 3650, or None when unset: then nothing is removed."""
    if not reader.text(NODE_RETENTION_DAYS_VAR):
        return None
    days: int = reader.integer(NODE_RETENTION_DAYS_VAR, 0, 1, 3650)
    return days


#: true: enroll and inventory accept a simulated node (false, the default: 403 simulated_node_refused)
ALLOW_SIMULATED_NODES_VAR = "MODELFORGE_ALLOW_SIMULATED_NODES"
CHANNEL_URL_VAR = "MODELFORGE_CHANNEL_URL"
CHANNEL_MANAGEMENT_URL_VAR = "MODELFORGE_CHANNEL_MANAGEMENT_URL"


def _url_problem(value: str, secure: str, plain: str) -> str | None:
    """Why ``value`` is not a ``secure``:// URL (or ``plain``:// to a loopback host), or None."""
    try:
        parts = urlsplit(value)
        host = parts.hostname or ""
        parts.port  # noqa: B018  (a bad port raises here)
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in (secure, plain) or not host:
        return f"must be a {secure}:// URL ({plain}:// only to a loopback host)"
    if parts.scheme == plain and not is_loopback_host(host):
        return f"may use {plain}:// only for a loopback host; use {secure}://"
    if parts.username or parts.password or parts.query or parts.fragment:
        return "must not carry user information, a query or a fragment"
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in value) or len(value) > 2048:
        return "must be at most 2048 characters without spaces or control characters"
    return None


def _channel(reader: Reader, problems: list[str]) -> tuple[str | None, str | None]:
    """The push channel: both URLs, or neither (no channel)."""
    url, management = reader.text(CHANNEL_URL_VAR) or None, reader.text(CHANNEL_MANAGEMENT_URL_VAR) or None
    if url is None:
        if management is not None:
            problems.append(f"{CHANNEL_MANAGEMENT_URL_VAR} is set but {CHANNEL_URL_VAR} is not: set both or neither")
        return None, None
    if management is None:
        problems.append(f"{CHANNEL_MANAGEMENT_URL_VAR} is required when {CHANNEL_URL_VAR} is set")
    for name, value, secure, plain in (
        (CHANNEL_URL_VAR, url, "wss", "ws"),
        (CHANNEL_MANAGEMENT_URL_VAR, management, "https", "http"),
    ):
        problem = _url_problem(value, secure, plain) if value is not None else None
        if problem:
            problems.append(f"{name} {problem}")
    return url, management


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    reader = Reader(env)
    problems = reader.problems
    names = _resource_names(reader, problems)
    admin = _admin_token_sha256(env, problems)
    interval = _read_int(reader, "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS")
    stale, offline = _liveness_thresholds(env, problems)
    retention = _read_int(reader, "MODELFORGE_OUTBOX_RETENTION_SECONDS")
    inventory_age = _read_int(reader, "MODELFORGE_READINESS_INVENTORY_MAX_AGE_SECONDS")
    fraction = _read_fraction(reader, "MODELFORGE_SWEEP_MASS_STALE_FRACTION", 0.5)
    inventory_rate = _read_int(reader, "MODELFORGE_INVENTORY_RATE_LIMIT")
    fallback_interval = _read_int(reader, "MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS")
    channel_url, channel_management_url = _channel(reader, problems)
    allow_simulated = reader.flag(ALLOW_SIMULATED_NODES_VAR, False)
    node_retention_days = _node_retention_days(reader)
    if stale and stale <= interval:
        problems.append(
            "MODELFORGE_NODE_STALE_AFTER_SECONDS must exceed MODELFORGE_HEARTBEAT_INTERVAL_SECONDS "
            f"(got stale={stale}, interval={interval})"
        )
    if problems:
        raise SettingsError(problems)
    return Settings(
        admin_token_sha256=admin,
        names=names,
        heartbeat_interval_seconds=interval,
        stale_after_seconds=stale,
        offline_after_seconds=offline,
        outbox_retention_seconds=retention,
        mass_stale_fraction=fraction,
        readiness_inventory_max_age_seconds=inventory_age,
        inventory_rate_limit=inventory_rate,
        channel_url=channel_url,
        channel_management_url=channel_management_url,
        fallback_heartbeat_interval_seconds=fallback_interval,
        allow_simulated_nodes=allow_simulated,
        node_retention_days=node_retention_days,
    )
