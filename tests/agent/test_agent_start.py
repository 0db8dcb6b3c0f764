"""What a start does before anything runs: the whole configuration is checked, including "no
identity and no enrollment token", before the state volume is created or the preflight runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID
from modelforge_node_agent.gpu import GpuProbe
from modelforge_node_agent.main import start


class NeverOpened:
    """A probe factory that records whether the preflight asked for NVML."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> GpuProbe:
        self.calls += 1
        raise AssertionError("the preflight must not run before the configuration is valid")


def _env(state: Path, **extra: str) -> dict[str, str]:
    return {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state),
        **extra,
    }


@pytest.mark.parametrize("volume", ["missing", "empty"])
def test_start_without_token_or_identity_exits_2_before_the_preflight_and_creates_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, volume: str
) -> None:
    state = tmp_path / "nested" / "state"
    if volume == "empty":
        state.mkdir(parents=True, mode=0o755)
    probe = NeverOpened()
    assert start(_env(state), probe_factory=probe) == CONFIGURATION_INVALID
    assert probe.calls == 0
    if volume == "missing":
        assert not (tmp_path / "nested").exists()
    else:
        assert list(state.iterdir()) == [] and state.stat().st_mode & 0o777 == 0o755  # not even tightened
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN is required" in caplog.text
    assert not any(getattr(record, "event", "") == "preflight_passed" for record in caplog.records)


def test_start_without_token_lists_every_other_problem_in_the_same_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = _env(tmp_path / "state", MODELFORGE_AGENT_ACCELERATOR_MODE="gpu")
    assert start(env, probe_factory=NeverOpened()) == CONFIGURATION_INVALID
    (exit_line,) = [record.getMessage() for record in caplog.records if getattr(record, "event", "") == "agent_exit"]
    assert "MODELFORGE_AGENT_ACCELERATOR_MODE" in exit_line and "MODELFORGE_AGENT_ENROLLMENT_TOKEN" in exit_line


def test_start_unknown_and_misspelled_variables_warn_one_line_each_then_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A misspelled token variable: the warning names the right one, then the start goes on (here
    to the configuration check, which misses the token)."""
    env = _env(tmp_path / "state", MODELFORGE_AGENT_BANANA="1", MODELFORGE_AGENT_ENROLMENT_TOKEN="mfe.not.shown")
    assert start(env, probe_factory=NeverOpened()) == CONFIGURATION_INVALID
    warned = {
        record.variable: record.getMessage()
        for record in caplog.records
        if record.__dict__.get("event") == "unknown_setting"
    }
    assert warned == {
        "MODELFORGE_AGENT_BANANA": "MODELFORGE_AGENT_BANANA is not a ModelForge setting and is ignored",
        "MODELFORGE_AGENT_ENROLMENT_TOKEN": "MODELFORGE_AGENT_ENROLMENT_TOKEN is not a ModelForge setting and is "
        "ignored (did you mean MODELFORGE_AGENT_ENROLLMENT_TOKEN?)",
    }
    assert "mfe.not.shown" not in caplog.text
    assert [record.levelname for record in caplog.records if record.__dict__.get("event") == "unknown_setting"] == [
        "WARNING",
        "WARNING",
    ]
