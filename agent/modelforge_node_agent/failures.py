"""What stops the agent, said in words an operator can act on; never a secret.

These carry no exit code: ``exit_codes.exit_for`` is the one place that maps them, and the
failures raised elsewhere (``preflight.PreflightFailed``, ``control_plane.Refused``), to codes.
"""

from __future__ import annotations


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
        self.status = status
        super().__init__(
            f"HTTP {status} redirect on {method} {path}: the agent never follows redirects (they could carry "
            "its credential to another origin); set MODELFORGE_AGENT_CONTROL_PLANE_URL to the address that "
            "serves the API itself",
        )
