"""What stops the agent, said in words an operator can act on; never a secret; and the one place
that sorts the control plane's failures (``classify``).

These carry no exit code: ``exit_codes.exit_for`` is the one place that maps them, and the
failures raised elsewhere (``preflight.PreflightFailed``), to codes.

A call to the control plane (``control_plane.ControlPlaneClient``) raises one of three:

- ``TransientFailure``: no connection, TLS, a timeout, the deadline, 429, 5xx, a malformed answer;
  worth retrying.
- ``Refused``: any other 4xx, carrying only the status and the answer's error code.
- ``RedirectRefused``: a 3xx, never followed.

``classify`` says what each means to a caller: retry it (``TRANSIENT``), stop the agent with it
(``FATAL``: a redirect, or a refused credential, 401 or 403), or take the refusal as this call's
answer (``REFUSED``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Fatal(Exception):
    """A failure the agent stops on; ``message`` says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigurationInvalid(Fatal):
    """Every problem with the configuration, each naming its variable (never its value)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid agent configuration: " + "; ".join(problems))


class IdentityRefused(Fatal):
    """The persisted identity or the state volume cannot be used."""


class RedirectRefused(Fatal):
    """The control plane answered 3xx. Never followed: it could carry the credential elsewhere.
    Neither the Location header nor the body is ever shown."""

    def __init__(self, status: int, method: str, path: str) -> None:
        self.status, self.method, self.path = status, method, path
        super().__init__(
            f"HTTP {status} redirect on {method} {path}: the agent never follows redirects (they could carry "
            "its credential to another origin); set MODELFORGE_AGENT_CONTROL_PLANE_URL to the address that "
            "serves the API itself",
        )


class TransientFailure(Exception):
    """Worth retrying: ``label`` names the error class or HTTP status (never a body).

    ``retry_after`` is the 429's Retry-After in seconds, clamped to 1..3600, when it gave one."""

    def __init__(
        self,
        label: str,
        method: str,
        path: str,
        detail: str = "",
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{label} on {method} {path}")
        self.label, self.method, self.path, self.detail = label, method, path, detail
        self.status, self.retry_after = status, retry_after


class Refused(Exception):
    """The control plane answered 4xx: do not retry blindly."""

    def __init__(
        self, status: int, code: str, method: str, path: str, verdict: str | None, next_step: str | None
    ) -> None:
        super().__init__(f"HTTP {status} {code} on {method} {path}")
        self.status, self.code, self.method, self.path = status, code, method, path
        self.verdict, self.next_step = verdict, next_step


#: Everything a call to the control plane raises when it gets no usable answer.
CONTROL_PLANE_FAILURES = (TransientFailure, Refused, RedirectRefused)
#: The statuses that refuse the node's credential: the agent stops, as it would on a heartbeat.
CREDENTIAL_REFUSED = frozenset({401, 403})
#: The code a refused redirect goes by where a refusal's code is expected.
REDIRECT = "redirect"


class Kind(enum.Enum):
    TRANSIENT = "transient"
    """Retry it (with backoff, or at the next chance)."""
    REFUSED = "refused"
    """This call's answer: the caller decides (a 409 on a lease means the lease is lost)."""
    FATAL = "fatal"
    """Stop the agent with it (``exit_codes.exit_for`` says with what)."""


@dataclass(frozen=True)
class Classified:
    """One control-plane failure, sorted: ``code`` is the transient failure's label, the refusal's
    error code, or ``redirect``; ``status`` the HTTP status when there was one."""

    kind: Kind
    code: str
    status: int | None
    error: Exception
    path: str


def classify(error: Exception) -> Classified:
    """What a control-plane failure means to the caller; ``TypeError`` for anything else (a bug)."""
    if isinstance(error, RedirectRefused):
        return Classified(Kind.FATAL, REDIRECT, error.status, error, error.path)
    if isinstance(error, Refused):
        kind = Kind.FATAL if error.status in CREDENTIAL_REFUSED else Kind.REFUSED
        return Classified(kind, error.code, error.status, error, error.path)
    if isinstance(error, TransientFailure):
        return Classified(Kind.TRANSIENT, error.label, error.status, error, error.path)
    raise TypeError(f"not a control-plane failure: {type(error).__name__}")
