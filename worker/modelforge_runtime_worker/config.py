"""Worker configuration: read once from the environment and validated whole before anything runs.

Nothing is created, bound or loaded while reading it; every problem names its variable, and all
of them are reported at once (``ConfigurationInvalid``, exit 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from modelforge_protocol.addresses import is_loopback_host
from modelforge_protocol.environment import Reader
from modelforge_protocol.work import MAX_WORKER_SLOTS

from .errors import ConfigurationInvalid

LISTEN = "MODELFORGE_WORKER_LISTEN"
ARTIFACT_ROOT = "MODELFORGE_WORKER_ARTIFACT_ROOT"
QUARANTINE_ROOT = "MODELFORGE_WORKER_QUARANTINE_ROOT"
DEVICE = "MODELFORGE_WORKER_DEVICE"
JOB_TIMEOUT = "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS"
SLOTS = "MODELFORGE_WORKER_SLOTS"
DECODE_TIMEOUT = "MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS"
DECODE_MEMORY = "MODELFORGE_WORKER_DECODE_MEMORY_MB"
LOG_LEVEL = "MODELFORGE_WORKER_LOG_LEVEL"

#: Every variable the worker reads, with its default (README.md has the table).
DEFAULTS: dict[str, str] = {
    LISTEN: "unix:///var/lib/modelforge/worker/worker.sock",
    ARTIFACT_ROOT: "/var/lib/modelforge/artifacts",
    QUARANTINE_ROOT: "/var/lib/modelforge/quarantine",
    DEVICE: "auto",
    JOB_TIMEOUT: "120",
    SLOTS: "1",
    DECODE_TIMEOUT: "20",
    DECODE_MEMORY: "1024",
    LOG_LEVEL: "INFO",
}
DEVICES = ("auto", "cpu", "cuda")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
JOB_TIMEOUT_RANGE = (1.0, 3600.0)
DECODE_TIMEOUT_RANGE = (1.0, 600.0)
#: The decoder child's memory limit, in MiB: below 128 the interpreter itself may not start.
DECODE_MEMORY_RANGE = (128, 65_536)
#: sun_path holds 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107
_LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class Listen:
    """Where the worker listens: a unix socket ``path``, or ``host``:``port`` on loopback."""

    url: str
    path: Path | None = None
    host: str | None = None
    port: int | None = None

    @property
    def is_unix(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class WorkerConfig:
    listen: Listen
    artifact_root: Path
    quarantine_root: Path
    device: str
    job_timeout_seconds: float
    log_level: str
    #: jobs at once, each in its slot's own process (slots.py)
    slots: int = 1
    #: the image decoder's child process: its time cap and address-space limit (decoder.py)
    decode_timeout_seconds: float = 20.0
    decode_memory_bytes: int = 1024 * 1024 * 1024


def parse_listen(raw: str, problems: list[str]) -> Listen | None:
    """``unix:///absolute/path`` or ``http://<loopback>:<port>``; anything else is a problem."""
    parts = urlsplit(raw)
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/") or parts.query or parts.fragment:
            problems.append(f"{LISTEN} must be unix:///absolute/path/worker.sock (three slashes, an absolute path)")
            return None
        if parts.path.endswith("/"):
            problems.append(f"{LISTEN} must name a socket file, not a directory")
            return None
        if len(os.fsencode(parts.path)) > MAX_SOCKET_PATH_BYTES:
            problems.append(
                f"{LISTEN}: the socket path is longer than {MAX_SOCKET_PATH_BYTES} bytes (the unix socket limit)"
            )
            return None
        return Listen(url=raw, path=Path(parts.path))
    if parts.scheme == "http":
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            problems.append(f"{LISTEN} has an invalid port (expected http://127.0.0.1:PORT with PORT 0-65535)")
            return None
        if not host or not is_loopback_host(host):
            problems.append(
                f"{LISTEN} must be a loopback address (http://127.0.0.1:PORT, http://[::1]:PORT, "
                "http://localhost:PORT) or a unix socket (unix:///path): "
                "only the agent on this host may reach the worker"
            )
            return None
        if port is None:
            problems.append(f"{LISTEN} must name a port (http://127.0.0.1:PORT; 0 picks a free one)")
            return None
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
            problems.append(f"{LISTEN} must be http://host:port only (no path, query or user)")
            return None
        bind_host = "127.0.0.1" if host in _LOOPBACK_NAMES else host
        return Listen(url=raw, host=bind_host, port=port)
    problems.append(f"{LISTEN} must start with unix:/// or http:// (loopback only)")
    return None


def _absolute_dir(reader: Reader, name: str, problems: list[str]) -> Path | None:
    raw = reader.text(name, DEFAULTS[name])
    path = Path(raw)
    if not path.is_absolute():
        problems.append(f"{name} must be an absolute path")
        return None
    if path.exists() and not path.is_dir():
        problems.append(f"{name} exists and is not a directory")
        return None
    return Path(os.path.normpath(path))


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def load_config(env: Mapping[str, str]) -> WorkerConfig:
    """The validated configuration, or ``ConfigurationInvalid`` naming every bad variable."""
    reader = Reader(env)
    problems = reader.problems
    listen = parse_listen(reader.text(LISTEN, DEFAULTS[LISTEN]), problems)
    artifact_root = _absolute_dir(reader, ARTIFACT_ROOT, problems)
    quarantine_root = _absolute_dir(reader, QUARANTINE_ROOT, problems)
    if (
        artifact_root is not None
        and quarantine_root is not None
        and (_inside(artifact_root, quarantine_root) or _inside(quarantine_root, artifact_root))
    ):
        problems.append(f"{ARTIFACT_ROOT} and {QUARANTINE_ROOT} must be separate directories, neither inside the other")
    device = reader.choice(DEVICE, DEFAULTS[DEVICE], DEVICES)
    low, high = JOB_TIMEOUT_RANGE
    timeout = reader.number(JOB_TIMEOUT, float(DEFAULTS[JOB_TIMEOUT]), low, high, what="a number of seconds")
    level = reader.choice(LOG_LEVEL, DEFAULTS[LOG_LEVEL], LOG_LEVELS, normalise=str.upper)
    low, high = DECODE_TIMEOUT_RANGE
    decode_timeout = reader.number(DECODE_TIMEOUT, None, low, high, what="a number of seconds")
    if decode_timeout is None:  # unset: the default, within a shorter job timeout
        decode_timeout = min(float(DEFAULTS[DECODE_TIMEOUT]), timeout or float(DEFAULTS[JOB_TIMEOUT]))
    elif timeout is not None and low <= decode_timeout <= high and decode_timeout > timeout:
        problems.append(
            f"{DECODE_TIMEOUT} must not be longer than {JOB_TIMEOUT} ({timeout:g} s): decoding is part of the job"
        )
    decode_memory = reader.integer(DECODE_MEMORY, int(DEFAULTS[DECODE_MEMORY]), *DECODE_MEMORY_RANGE)
    slots = reader.integer(SLOTS, int(DEFAULTS[SLOTS]), 1, MAX_WORKER_SLOTS)
    if problems:
        raise ConfigurationInvalid(problems)
    assert listen is not None and artifact_root is not None and quarantine_root is not None and timeout is not None
    return WorkerConfig(
        listen=listen,
        artifact_root=artifact_root,
        quarantine_root=quarantine_root,
        device=device,
        job_timeout_seconds=timeout,
        log_level=level,
        decode_timeout_seconds=decode_timeout,
        decode_memory_bytes=decode_memory * 1024 * 1024,
        slots=slots,
    )
