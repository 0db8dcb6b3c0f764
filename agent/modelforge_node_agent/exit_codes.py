"""The one place that maps every failure that stops the agent to its exit code and message.

0 clean stop, 1 unexpected, 2 configuration invalid (or a redirect), 3 preflight failed,
4 identity or credential refused, 5 protocol incompatible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .failures import ConfigurationInvalid, IdentityRefused, RedirectRefused, Refused
from .preflight import PreflightFailed

log = logging.getLogger("modelforge.agent")

OK = 0
UNEXPECTED = 1
CONFIGURATION_INVALID = 2
PREFLIGHT_FAILED = 3
IDENTITY_REFUSED = 4
PROTOCOL_INCOMPATIBLE = 5


@dataclass(frozen=True)
class Exit:
    """How the agent stops: ``crashed`` marks an error nobody foresaw (logged with its traceback)."""

    code: int
    message: str
    crashed: bool = False


_TOKEN_REFUSALS = {
    "enrollment_token_unknown": "the enrollment token is not known to this control plane",
    "enrollment_token_expired": "the enrollment token has expired",
    "enrollment_token_revoked": "the enrollment token was revoked",
    "enrollment_token_consumed": "the enrollment token was already used by another node",
}


_ENROLL_AGAIN = "move identity.json out of the state volume and start with a new MODELFORGE_AGENT_ENROLLMENT_TOKEN"
#: A refused node credential: what each refusal means, and the next step.
_CREDENTIAL_REFUSALS = {
    "credential_revoked": ("an admin revoked this node's credential, so it must be enrolled again: " + _ENROLL_AGAIN),
    "credential_invalid": (
        "the control plane does not know this node's credential: check that MODELFORGE_AGENT_CONTROL_PLANE_URL "
        "is the control plane this node enrolled with; if that control plane's data was reset, this node "
        "must be enrolled again: " + _ENROLL_AGAIN
    ),
}
_CREDENTIAL_REFUSED = "the control plane refused this node's credential; to enroll it again, " + _ENROLL_AGAIN


def exit_for(error: BaseException) -> Exit:
    """The exit code and message for ``error``; anything not foreseen here is exit 1."""
    if isinstance(error, (ConfigurationInvalid, RedirectRefused)):
        return Exit(CONFIGURATION_INVALID, error.message)
    if isinstance(error, PreflightFailed):
        return Exit(PREFLIGHT_FAILED, f"{error.code}: {error.cause}")
    if isinstance(error, IdentityRefused):
        return Exit(IDENTITY_REFUSED, error.message)
    if isinstance(error, Refused):
        return _refusal(error)
    return Exit(UNEXPECTED, f"unexpected error ({type(error).__name__})", crashed=True)


def _refusal(refusal: Refused) -> Exit:
    """A 4xx answer from the control plane: which of them the operator can fix, and how."""
    if refusal.code == "protocol_incompatible":
        verdict, next_step = refusal.verdict or "UNKNOWN", refusal.next_step or "see docs/COMPATIBILITY.md"
        return Exit(PROTOCOL_INCOMPATIBLE, f"control plane refused this agent's protocol: {verdict}. {next_step}")
    if refusal.code in _TOKEN_REFUSALS:
        return Exit(
            IDENTITY_REFUSED,
            f"enrollment refused: {_TOKEN_REFUSALS[refusal.code]}; ask an admin for a new token "
            "and set MODELFORGE_AGENT_ENROLLMENT_TOKEN",
        )
    if refusal.code == "simulated_node_refused":
        return Exit(
            IDENTITY_REFUSED,
            "the control plane refuses simulated nodes: unset MODELFORGE_AGENT_NVML_SIMULATION to report the host's "
            "real GPUs, or use a development control plane started with MODELFORGE_ALLOW_SIMULATED_NODES=true "
            f"(HTTP {refusal.status} {refusal.code} on {refusal.method} {refusal.path})",
        )
    if refusal.status in (401, 403):
        refused = f"HTTP {refusal.status} {refusal.code} on {refusal.method} {refusal.path}"
        return Exit(IDENTITY_REFUSED, f"{_CREDENTIAL_REFUSALS.get(refusal.code, _CREDENTIAL_REFUSED)} ({refused})")
    return Exit(UNEXPECTED, f"HTTP {refusal.status} {refusal.code} on {refusal.method} {refusal.path}")


def report(error: BaseException) -> int:
    """Log why the agent stops (one ``agent_exit`` line, or ``agent_crashed`` with the traceback)."""
    stop = exit_for(error)
    if stop.crashed:
        log.error("unexpected error", exc_info=error, extra={"event": "agent_crashed"})
    else:
        log.error(stop.message, extra={"event": "agent_exit", "exit_code": stop.code})
    return stop.code
