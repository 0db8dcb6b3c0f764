"""The one place that maps agent failures to exit codes and messages.

0 clean stop, 1 unexpected, 2 configuration invalid, 3 preflight failed,
4 identity or credential refused, 5 protocol incompatible.
"""

from __future__ import annotations

OK = 0
UNEXPECTED = 1
CONFIGURATION_INVALID = 2
PREFLIGHT_FAILED = 3
IDENTITY_REFUSED = 4
PROTOCOL_INCOMPATIBLE = 5


class AgentExit(Exception):
    """Stop the agent with this exit code; ``message`` says what to do (never a secret)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConfigurationInvalid(AgentExit):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(CONFIGURATION_INVALID, "invalid agent configuration: " + "; ".join(problems))


class IdentityRefused(AgentExit):
    def __init__(self, message: str) -> None:
        super().__init__(IDENTITY_REFUSED, message)


class ProtocolIncompatible(AgentExit):
    def __init__(self, verdict: str, next_step: str) -> None:
        self.verdict = verdict
        super().__init__(PROTOCOL_INCOMPATIBLE, f"control plane refused this agent's protocol: {verdict}. {next_step}")


class PreflightExit(AgentExit):
    def __init__(self, code_name: str, cause: str) -> None:
        self.code_name = code_name
        super().__init__(PREFLIGHT_FAILED, f"{code_name}: {cause}")


class RedirectRefused(AgentExit):
    """The control plane answered 3xx. Never followed: it could carry the credential elsewhere.
    Neither the Location header nor the body is ever shown."""

    def __init__(self, status: int, method: str, path: str) -> None:
        self.status = status
        super().__init__(
            CONFIGURATION_INVALID,
            f"HTTP {status} redirect on {method} {path}: the agent never follows redirects (they could carry "
            "its credential to another origin); set MODELFORGE_AGENT_CONTROL_PLANE_URL to the address that "
            "serves the API itself",
        )
