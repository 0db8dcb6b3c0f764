"""Agent configuration: read once from the environment and validated whole before anything runs.

Every problem is named by variable, never by value (the enrollment token is a secret). "No
enrollment token and no identity in the state volume" is one of them: it is found by looking for
the identity file, which creates nothing (the state volume is prepared after validation).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from modelforge_protocol.addresses import is_loopback_host
from modelforge_protocol.credentials import ENROLLMENT_TOKEN_RE
from modelforge_protocol.environment import Reader
from modelforge_protocol.schemas import ACCELERATOR_MODES

from .failures import ConfigurationInvalid
from .identity import StateVolume

PLACEHOLDER_HOST = "modelforge.example.internal"
INSECURE_SWITCH = "MODELFORGE_AGENT_INSECURE_SKIP_TLS_VERIFY_FOR_DEVELOPMENT"
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_LOG_LEVELS = ("DEBUG", "ERROR", "INFO", "WARNING")
LOG_FORMAT = "MODELFORGE_AGENT_LOG_FORMAT"
#: ``json`` (the default: one object per line, for log collectors) or ``text`` (for a person).
LOG_FORMATS = ("json", "text")
PUSH_CHANNEL = "MODELFORGE_AGENT_PUSH_CHANNEL"
#: ``on`` (the default: keep the push channel when the control plane offers one) or ``off`` (the
#: heartbeat's hint only: for proxies that block WebSockets, and for tests).
PUSH_CHANNEL_SETTINGS = ("on", "off")
NO_IDENTITY_NO_TOKEN = (
    "MODELFORGE_AGENT_ENROLLMENT_TOKEN is required: this node has no identity yet (ask an admin for a token)"
)


@dataclass(frozen=True)
class AgentConfig:
    control_plane_url: str
    enrollment_token: str | None = field(repr=False)
    hostname: str
    accelerator_mode: str
    tls_verify: bool
    state_volume: Path
    identity_mode: str
    ca_cert_path: Path | None
    control_plane_host_address: str | None
    heartbeat_interval_override: float | None
    inventory_refresh_seconds: float
    preflight_timeout_seconds: float
    request_timeout_seconds: float
    log_level: str
    #: the runtime worker's API (``unix:///path`` or ``http://<loopback>:<port>``); None: no work
    worker_url: str | None = None
    #: ``json`` or ``text`` (``MODELFORGE_AGENT_LOG_FORMAT``)
    log_format: str = "json"
    #: ``on`` or ``off`` (``MODELFORGE_AGENT_PUSH_CHANNEL``)
    push_channel: str = "on"
    #: a scripted NVML fake's scenario (MODELFORGE_AGENT_NVML_SIMULATION, honoured only with
    #: MODELFORGE_AGENT_ALLOW_SIMULATION=true): the node's GPUs are simulated and it says so
    nvml_simulation: Path | None = None
    #: ``MODELFORGE_AGENT_HTTPS_PROXY``: the only proxy the agent uses, for every https:// and
    #: wss:// connection (None: direct). May carry credentials: never logged, never in repr.
    https_proxy: str | None = field(default=None, repr=False)

    @property
    def url_host(self) -> str:
        return urlsplit(self.control_plane_url).hostname or ""


def scheme_problem(url: str, secure: str, plain: str) -> str | None:
    """The agent's one rule for a URL it dials: ``secure`` (https, wss), or ``plain`` (http, ws)
    only to a loopback address; None when the URL keeps it. Used for the control plane's URL and
    for the push channel's (which the control plane names in its answers)."""
    parts = urlsplit(url)
    if parts.scheme not in (secure, plain) or not parts.hostname:
        return f"must be a {secure}:// URL"
    if parts.scheme == plain and not is_loopback_host(parts.hostname):
        return f"must use {secure}:// (plain {plain}:// is allowed only for loopback addresses)"
    return None


def _url(reader: Reader, problems: list[str]) -> str:
    name = "MODELFORGE_AGENT_CONTROL_PLANE_URL"
    raw = reader.text(name).rstrip("/")
    if not raw:
        problems.append(f"{name} is required")
        return raw
    parts = urlsplit(raw)
    if parts.hostname == PLACEHOLDER_HOST:
        problem: str | None = (
            f"is the example placeholder ({PLACEHOLDER_HOST}); set the real address of your control plane"
        )
    else:
        problem = scheme_problem(raw, "https", "http")
    if problem is None and (parts.path not in ("", "/") or parts.query or parts.fragment or parts.username):
        problem = "must be scheme://host[:port] only"
    if problem is not None:
        problems.append(f"{name} {problem}")
    return raw


WORKER_URL = "MODELFORGE_AGENT_WORKER_URL"
#: sun_path holds 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107


def _worker_url(reader: Reader, problems: list[str]) -> str | None:
    """``unix:///absolute/path`` or ``http://<loopback address or localhost>:<port>``, else a problem."""
    raw = reader.text(WORKER_URL)
    if not raw:
        return None
    shape = f"{WORKER_URL} must be unix:///absolute/path/worker.sock or http://127.0.0.1:PORT (a loopback address)"
    parts = urlsplit(raw)
    if parts.scheme == "unix":
        path = parts.path
        if parts.netloc or not path.startswith("/") or path.endswith("/") or parts.query or parts.fragment:
            problems.append(shape)
        elif len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
            problems.append(f"{WORKER_URL}: the socket path is longer than {MAX_SOCKET_PATH_BYTES} bytes")
        return raw
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme != "http"
        or not is_loopback_host(parts.hostname or "")
        or port is None
        or not 1 <= port <= 65535
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        problems.append(shape)
    return raw.rstrip("/")


def _token(reader: Reader, problems: list[str]) -> str | None:
    token = reader.optional("MODELFORGE_AGENT_ENROLLMENT_TOKEN")
    if token is not None and not ENROLLMENT_TOKEN_RE.fullmatch(token):
        problems.append("MODELFORGE_AGENT_ENROLLMENT_TOKEN is not an enrollment token (expected mfe.<id>.<secret>)")
    return token


def _tls(reader: Reader, problems: list[str]) -> tuple[bool, Path | None, str | None]:
    verify = reader.flag("MODELFORGE_AGENT_TLS_VERIFY", True)
    if not verify and not reader.flag(INSECURE_SWITCH, False):
        problems.append(
            "MODELFORGE_AGENT_TLS_VERIFY=false is refused: configure MODELFORGE_AGENT_CA_CERT_PATH for a private CA "
            f"(only for development, {INSECURE_SWITCH}=true also allows it)"
        )
    ca_raw = reader.text("MODELFORGE_AGENT_CA_CERT_PATH")
    ca = Path(ca_raw) if ca_raw else None
    if ca is not None:
        try:
            if "BEGIN CERTIFICATE" not in ca.read_text(errors="replace"):
                problems.append("MODELFORGE_AGENT_CA_CERT_PATH is not a PEM certificate file")
        except OSError:
            problems.append("MODELFORGE_AGENT_CA_CERT_PATH is not a readable file")
    address = reader.optional("MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS")
    if address is not None and not _HOSTNAME_RE.fullmatch(address.strip("[]")) and ":" not in address:
        problems.append("MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS must be an IP address or host name")
    return verify, ca, address


HTTPS_PROXY = "MODELFORGE_AGENT_HTTPS_PROXY"


def _https_proxy(reader: Reader, problems: list[str]) -> str | None:
    """``http(s)://[user:password@]host[:port]``, else a problem named by variable, never by value
    (the URL may carry the proxy's credentials). Nothing else (``HTTPS_PROXY``, ``~/.netrc``) is read."""
    raw = reader.optional(HTTPS_PROXY)
    if raw is None:
        return None
    parts = urlsplit(raw)
    try:
        port_ok = parts.port is None or 1 <= parts.port <= 65535
    except ValueError:
        port_ok = False
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or not port_ok
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or (parts.username is not None and not parts.password)
    ):
        problems.append(
            f"{HTTPS_PROXY} must be http://host:port or https://host:port (credentials, if any, as user:password@)"
        )
    return raw.rstrip("/")


SIMULATION = "MODELFORGE_AGENT_NVML_SIMULATION"
ALLOW_SIMULATION = "MODELFORGE_AGENT_ALLOW_SIMULATION"


def _simulation(reader: Reader, mode: str, problems: list[str]) -> Path | None:
    """The scenario file, when simulation is asked for and allowed; never a silent fallback to real
    NVML (nor from it): asking without allowing is a configuration error."""
    raw = reader.text(SIMULATION)
    allowed = reader.flag(ALLOW_SIMULATION, False)
    if not raw:
        return None
    if not allowed:
        problems.append(
            f"{SIMULATION} is set but {ALLOW_SIMULATION} is not true: a simulated node reports GPUs that do not "
            f"exist; set {ALLOW_SIMULATION}=true for a demo or a test, or unset {SIMULATION}"
        )
        return None
    if mode == "cpu":
        problems.append(f"{SIMULATION} simulates NVIDIA GPUs: MODELFORGE_AGENT_ACCELERATOR_MODE must be nvidia or auto")
    path = Path(raw)
    if not path.is_file():
        problems.append(f"{SIMULATION} is not a readable file: {raw}")
    return path


def load_config(env: Mapping[str, str]) -> AgentConfig:
    reader = Reader(env)
    problems = reader.problems
    url = _url(reader, problems)
    token = _token(reader, problems)
    hostname = reader.text("MODELFORGE_AGENT_HOSTNAME") or socket.gethostname()
    if not _HOSTNAME_RE.fullmatch(hostname):
        problems.append("MODELFORGE_AGENT_HOSTNAME must be 1-253 letters, digits, '.', '_' or '-'")
    mode = reader.choice("MODELFORGE_AGENT_ACCELERATOR_MODE", "nvidia", ACCELERATOR_MODES, blank_is_unset=False)
    verify, ca, address = _tls(reader, problems)
    state_raw = reader.text("MODELFORGE_AGENT_STATE_VOLUME")
    if not state_raw:
        problems.append("MODELFORGE_AGENT_STATE_VOLUME is required (a durable directory for the node's identity)")
    elif token is None and not StateVolume(Path(state_raw)).has_identity():
        problems.append(NO_IDENTITY_NO_TOKEN)
    identity_mode = env.get("MODELFORGE_AGENT_IDENTITY_MODE", "persisted").strip().lower()  # blank: refused
    if identity_mode != "persisted":
        problems.append("MODELFORGE_AGENT_IDENTITY_MODE must be persisted")
    interval = reader.number("MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS", None, 0.1, 3600)
    refresh = reader.number("MODELFORGE_AGENT_INVENTORY_REFRESH_SECONDS", 3600.0, 10, 86400)
    preflight_timeout = reader.number("MODELFORGE_AGENT_PREFLIGHT_TIMEOUT_SECONDS", 10.0, 0.1, 300)
    request_timeout = reader.number("MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS", 10.0, 0.5, 120)
    level = reader.choice("MODELFORGE_AGENT_LOG_LEVEL", "INFO", _LOG_LEVELS, normalise=str.upper, blank_is_unset=False)
    log_format = log_format_of(env)
    if log_format is None:
        problems.append(f"{LOG_FORMAT} must be {' or '.join(LOG_FORMATS)}")
    worker_url = _worker_url(reader, problems)
    push_channel = reader.choice(PUSH_CHANNEL, "on", PUSH_CHANNEL_SETTINGS)
    simulation = _simulation(reader, mode, problems)
    https_proxy = _https_proxy(reader, problems)
    if problems:
        raise ConfigurationInvalid(problems)
    return AgentConfig(
        control_plane_url=url,
        enrollment_token=token,
        hostname=hostname,
        accelerator_mode=mode,
        tls_verify=verify,
        state_volume=Path(state_raw),
        identity_mode=identity_mode,
        ca_cert_path=ca,
        control_plane_host_address=address,
        heartbeat_interval_override=interval,
        inventory_refresh_seconds=float(refresh or 3600.0),
        preflight_timeout_seconds=float(preflight_timeout or 10.0),
        request_timeout_seconds=float(request_timeout or 10.0),
        log_level=level,
        worker_url=worker_url,
        log_format=log_format or "json",
        push_channel=push_channel,
        nvml_simulation=simulation,
        https_proxy=https_proxy,
    )


def log_format_of(env: Mapping[str, str]) -> str | None:
    """``MODELFORGE_AGENT_LOG_FORMAT`` (``json`` when unset), or None when it is neither format."""
    raw = Reader(env).text(LOG_FORMAT, "json").lower()
    return raw if raw in LOG_FORMATS else None


def load_preflight_config(env: Mapping[str, str]) -> tuple[str, float]:
    """`--preflight` needs only the mode and the time bound, never the network or state."""
    reader = Reader(env)
    mode = reader.choice("MODELFORGE_AGENT_ACCELERATOR_MODE", "nvidia", ACCELERATOR_MODES, blank_is_unset=False)
    timeout = reader.number("MODELFORGE_AGENT_PREFLIGHT_TIMEOUT_SECONDS", 10.0, 0.1, 300)
    if reader.problems:
        raise ConfigurationInvalid(reader.problems)
    return mode, float(timeout or 10.0)
