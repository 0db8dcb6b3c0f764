"""The environment: every ``MODELFORGE_*`` variable the project reads, one reader for them, and
the warning for a variable no component knows.

``VARIABLES`` lists each name with the part of the project that reads it (a test scans the
source to keep it complete). An entry point warns once per ``MODELFORGE_*`` variable in its
environment that is not listed, suggesting a close known name, and then starts normally.

``Reader`` reads one setting at a time into a list of problems, so a configuration is validated
whole and every problem is named by variable, never by value (some values are secrets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

PREFIX = "MODELFORGE_"

AGENT = "node agent"
WORKER = "runtime worker"
CONTROL_PLANE = "control plane"
CLI = "modelforge command"
LOCAL_STACK = "local stack"
DEPLOYMENT = "compose files and scripts"

_BY_READER: dict[str, tuple[str, ...]] = {
    AGENT: (
        "MODELFORGE_AGENT_ACCELERATOR_MODE",
        "MODELFORGE_AGENT_ALLOW_SIMULATION",
        "MODELFORGE_AGENT_CA_CERT_PATH",
        "MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS",
        "MODELFORGE_AGENT_CONTROL_PLANE_URL",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN",
        "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS",
        "MODELFORGE_AGENT_HOSTNAME",
        "MODELFORGE_AGENT_HTTPS_PROXY",
        "MODELFORGE_AGENT_IDENTITY_MODE",
        "MODELFORGE_AGENT_INSECURE_SKIP_TLS_VERIFY_FOR_DEVELOPMENT",
        "MODELFORGE_AGENT_INVENTORY_REFRESH_SECONDS",
        "MODELFORGE_AGENT_LOG_FORMAT",
        "MODELFORGE_AGENT_LOG_LEVEL",
        "MODELFORGE_AGENT_NVML_SIMULATION",
        "MODELFORGE_AGENT_PREFLIGHT_TIMEOUT_SECONDS",
        "MODELFORGE_AGENT_PUSH_CHANNEL",
        "MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS",
        "MODELFORGE_AGENT_STATE_VOLUME",
        "MODELFORGE_AGENT_TLS_VERIFY",
        "MODELFORGE_AGENT_WORKER_URL",
    ),
    WORKER: (
        "MODELFORGE_WORKER_ARTIFACT_ROOT",
        "MODELFORGE_WORKER_DECODE_MEMORY_MB",
        "MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS",
        "MODELFORGE_WORKER_DEVICE",
        "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS",
        "MODELFORGE_WORKER_LISTEN",
        "MODELFORGE_WORKER_LOG_LEVEL",
        "MODELFORGE_WORKER_QUARANTINE_ROOT",
        "MODELFORGE_WORKER_SLOTS",
    ),
    CONTROL_PLANE: (
        "MODELFORGE_ADMIN_TOKEN_SHA256",
        "MODELFORGE_ALLOW_SIMULATED_NODES",
        "MODELFORGE_CHANNEL_MANAGEMENT_URL",
        "MODELFORGE_CHANNEL_URL",
        "MODELFORGE_CONTROL_TABLE",
        "MODELFORGE_ENROLLMENTS_TABLE",
        "MODELFORGE_GPU_CLAIMS_TABLE",
        "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS",
        "MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS",
        "MODELFORGE_INVENTORIES_TABLE",
        "MODELFORGE_INVENTORY_RATE_LIMIT",
        "MODELFORGE_LOG_LEVEL",
        "MODELFORGE_NODES_TABLE",
        "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS",
        "MODELFORGE_NODE_RETENTION_DAYS",
        "MODELFORGE_NODE_STALE_AFTER_SECONDS",
        "MODELFORGE_OUTBOX_RETENTION_SECONDS",
        "MODELFORGE_OUTBOX_TABLE",
        "MODELFORGE_READINESS_INVENTORY_MAX_AGE_SECONDS",
        "MODELFORGE_STATE_LOG_BUCKET",
        "MODELFORGE_SWEEP_MASS_STALE_FRACTION",
        "MODELFORGE_WORK_TABLE",
    ),
    CLI: (
        "MODELFORGE_ADMIN_TOKEN",
        "MODELFORGE_API_AWS_SIGV4",
        "MODELFORGE_API_URL",
        "MODELFORGE_CA_CERT_PATH",
        "MODELFORGE_NODE_URL",
    ),
    LOCAL_STACK: (
        "MODELFORGE_LOCALSTACK_ENDPOINT_URL",
        "MODELFORGE_LOCALSTACK_REPO",
        "MODELFORGE_LOCAL_AWS_ENDPOINT_URL",
        "MODELFORGE_SWEEP_INTERVAL_SECONDS",
        "MODELFORGE_TEST_AWS_ENDPOINT_URL",
    ),
    DEPLOYMENT: (
        "MODELFORGE_AGENT_ENV_FILE",
        "MODELFORGE_EXTRAS",
        "MODELFORGE_NODE_AGENT_COMMAND",
        "MODELFORGE_NODE_AGENT_IMAGE",
        "MODELFORGE_RUNTIME_WORKER_IMAGE",
        "MODELFORGE_SKIP_SYSTEM_PACKAGES",
        "MODELFORGE_VENV",
        "MODELFORGE_WORKER_ARTIFACT_VOLUME",
        "MODELFORGE_WORKER_QUARANTINE_VOLUME",
    ),
}

#: Every variable the project reads: name -> the part that reads it.
VARIABLES: dict[str, str] = {name: reader for reader, names in _BY_READER.items() for name in names}

_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


# --- unknown variables ---------------------------------------------------------------------------


def closest(name: str, known: Iterable[str] = VARIABLES) -> str | None:
    """The known name ``name`` most likely misspells, or None when none is close."""
    import difflib  # only a misspelled variable pays for it, not every cold start

    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    return matches[0] if matches else None


def unknown_variables(env: Mapping[str, str], known: Iterable[str] = VARIABLES) -> list[str]:
    """The ``MODELFORGE_*`` names in ``env`` that no part of the project reads, sorted."""
    names = set(known)
    return sorted(name for name in env if name.startswith(PREFIX) and name not in names)


def unknown_variable_warning(name: str, known: Iterable[str] = VARIABLES) -> str:
    """The one line an entry point says about ``name``: never its value (it may be a secret)."""
    suggestion = closest(name, known)
    hint = f" (did you mean {suggestion}?)" if suggestion else ""
    return f"{name} is not a ModelForge setting and is ignored{hint}"


def unknown_variable_warnings(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(name, warning line) for each unknown ``MODELFORGE_*`` variable in ``env``."""
    return [(name, unknown_variable_warning(name)) for name in unknown_variables(env)]


# --- reading settings ----------------------------------------------------------------------------


class Reader:
    """Reads settings from ``env`` (values stripped, empty means unset), collecting every problem
    in ``problems`` by variable name. Each reader returns a usable value even on a problem."""

    def __init__(self, env: Mapping[str, str], problems: list[str] | None = None) -> None:
        """``problems``: a list to add to (a new one when None)."""
        self.env = env
        self.problems: list[str] = [] if problems is None else problems

    def text(self, name: str, default: str = "") -> str:
        """The stripped value, or ``default`` when unset or blank."""
        return self.env.get(name, "").strip() or default

    def optional(self, name: str) -> str | None:
        """The stripped value, or None when unset or blank."""
        return self.text(name) or None

    def flag(self, name: str, default: bool) -> bool:
        """true/false (also 1/0, yes/no, on/off, any case)."""
        raw = self.text(name).lower()
        if not raw:
            return default
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        self.problems.append(f"{name} must be true or false")
        return default

    def number(
        self, name: str, default: float | None, low: float, high: float, *, what: str = "a number"
    ) -> float | None:
        """A number between ``low`` and ``high`` (NaN and infinities are out of range)."""
        raw = self.text(name)
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            self.problems.append(f"{name} must be {what}")
            return default
        if not low <= value <= high:
            self.problems.append(f"{name} must be between {low:g} and {high:g}")
        return value

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        """A whole number between ``low`` and ``high``; the problem shows the number given. Only an
        unset or empty variable takes ``default``: one of blanks is not a number."""
        raw = self.env.get(name, "")
        if raw == "":
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            self.problems.append(f"{name} must be an integer")
            return default
        if not low <= value <= high:
            self.problems.append(f"{name} must be between {low} and {high} (got {value})")
        return value

    def choice(
        self,
        name: str,
        default: str,
        choices: Sequence[str],
        *,
        normalise: Callable[[str], str] = str.lower,
        blank_is_unset: bool = True,
    ) -> str:
        """One of ``choices`` (compared after ``normalise``); the problem lists them in order.
        ``blank_is_unset`` False: only an unset variable takes ``default``, a blank one is refused."""
        raw = self.env.get(name, default) if not blank_is_unset else self.text(name, default)
        value = normalise(raw.strip())
        if value not in choices:
            self.problems.append(f"{name} must be one of {', '.join(choices)}")
        return value
