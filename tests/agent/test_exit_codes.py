"""The one mapping from what stops the agent to its exit code and message (``exit_codes.exit_for``)."""

from __future__ import annotations

import logging

import pytest
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT
from modelforge_node_agent.exit_codes import exit_for, report
from modelforge_node_agent.failures import ConfigurationInvalid, IdentityRefused, RedirectRefused, Refused
from modelforge_node_agent.identity import StateVolumeError
from modelforge_node_agent.preflight import DEVICE_NOT_FOUND, NVML_UNAVAILABLE, TELEMETRY_UNAVAILABLE, PreflightFailed


def _refused(
    status: int, code: str, path: str = HEARTBEAT, verdict: str | None = None, next_step: str | None = None
) -> Refused:
    return Refused(status, code, "POST", path, verdict, next_step)


TABLE = [
    (
        "configuration",
        ConfigurationInvalid(["MODELFORGE_AGENT_CONTROL_PLANE_URL is required"]),
        2,
        "invalid agent configuration: MODELFORGE_AGENT_CONTROL_PLANE_URL",
    ),
    ("redirect", RedirectRefused(307, "POST", HEARTBEAT), 2, "HTTP 307 redirect on POST /api/v1/agent/heartbeat"),
    (
        "preflight, no NVML",
        PreflightFailed(NVML_UNAVAILABLE, "libnvidia-ml.so.1 missing"),
        3,
        "NVIDIA_NVML_UNAVAILABLE: libnvidia-ml.so.1 missing",
    ),
    ("preflight, no GPU", PreflightFailed(DEVICE_NOT_FOUND, "none"), 3, "NVIDIA_DEVICE_NOT_FOUND: none"),
    ("telemetry", PreflightFailed(TELEMETRY_UNAVAILABLE, "GPU 1"), 3, "NVIDIA_TELEMETRY_UNAVAILABLE: GPU 1"),
    ("identity", IdentityRefused("identity file x is corrupt"), 4, "identity file x is corrupt"),
    ("state volume", StateVolumeError("state volume x is not writable"), 4, "not writable"),
    (
        "credential revoked",
        _refused(401, "credential_revoked"),
        4,
        "an admin revoked this node's credential, so it must be enrolled again",
    ),
    (
        "credential unknown",
        _refused(401, "credential_invalid"),
        4,
        "does not know this node's credential: check that MODELFORGE_AGENT_CONTROL_PLANE_URL",
    ),
    (
        "credential missing",
        _refused(401, "credential_missing"),
        4,
        "refused this node's credential; to enroll it again, move identity.json",
    ),
    (
        "credential forbidden",
        _refused(403, "credential_invalid"),
        4,
        "HTTP 403 credential_invalid on POST /api/v1/agent/heartbeat",
    ),
    (
        "token unknown",
        _refused(404, "enrollment_token_unknown", ENROLL),
        4,
        "not known to this control plane; ask an admin for a new token",
    ),
    ("token expired", _refused(409, "enrollment_token_expired", ENROLL), 4, "has expired"),
    ("token revoked", _refused(409, "enrollment_token_revoked", ENROLL), 4, "was revoked"),
    ("token consumed", _refused(409, "enrollment_token_consumed", ENROLL), 4, "already used by another node"),
    (
        "protocol",
        _refused(400, "protocol_incompatible", verdict="TOO_OLD", next_step="Upgrade the node agent."),
        5,
        "protocol: TOO_OLD. Upgrade the node agent.",
    ),
    ("protocol, no verdict", _refused(400, "protocol_incompatible"), 5, "protocol: UNKNOWN. see docs/COMPATIBILITY.md"),
    ("other refusal", _refused(404, "not_found"), 1, "HTTP 404 not_found on POST /api/v1/agent/heartbeat"),
    ("crash", KeyError("boom"), 1, "unexpected error (KeyError)"),
]


@pytest.mark.parametrize(("case", "error", "code", "words"), TABLE, ids=[row[0] for row in TABLE])
def test_exit_for_each_failure_gives_its_documented_code_and_message(
    case: str, error: BaseException, code: int, words: str
) -> None:
    stops = exit_for(error)
    assert (stops.code, stops.crashed) == (code, case == "crash")
    assert words in stops.message


def test_report_logs_a_failure_as_agent_exit_and_a_crash_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="modelforge.agent"):
        assert report(IdentityRefused("refused")) == 4
        try:
            raise KeyError("boom")
        except KeyError as crash:
            assert report(crash) == 1
    failure, crashed = caplog.records
    assert (failure.event, failure.exit_code, failure.getMessage()) == ("agent_exit", 4, "refused")  # type: ignore[attr-defined]
    assert crashed.event == "agent_crashed" and crashed.exc_info is not None  # type: ignore[attr-defined]
