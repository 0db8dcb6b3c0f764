from __future__ import annotations

import pytest
from modelforge_protocol.versions import (
    AGENT_PROTOCOL_VERSION,
    Component,
    Verdict,
    next_step,
    parse_query_protocol_version,
    verdict,
)


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        (1, Verdict.COMPATIBLE),
        (0, Verdict.UNKNOWN),
        (-1, Verdict.UNKNOWN),
        (2, Verdict.TOO_NEW),
        (None, Verdict.UNKNOWN),
        ("1", Verdict.UNKNOWN),
        (1.0, Verdict.UNKNOWN),
        (True, Verdict.UNKNOWN),
        ([1], Verdict.UNKNOWN),
    ],
)
def test_verdict_for_agent_protocol(reported: object, expected: Verdict) -> None:
    assert verdict(Component.AGENT, reported) is expected


def test_control_plane_speaks_agent_protocol_1() -> None:
    assert AGENT_PROTOCOL_VERSION == 1


def test_too_old_is_reported_below_the_oldest_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    from modelforge_protocol import versions

    monkeypatch.setitem(versions.ACCEPTED, Component.AGENT, versions.AcceptedRange(oldest=2, newest=3))
    assert verdict(Component.AGENT, 1) is Verdict.TOO_OLD
    assert verdict(Component.AGENT, 3) is Verdict.COMPATIBLE
    assert verdict(Component.AGENT, 4) is Verdict.TOO_NEW


@pytest.mark.parametrize("judged", list(Verdict))
def test_every_verdict_has_a_next_step_naming_no_other_verdict(judged: Verdict) -> None:
    step = next_step(Component.WORKER, judged)
    assert step
    assert not any(other.value in step for other in Verdict)


@pytest.mark.parametrize(
    ("raw", "parsed"), [("1", 1), ("12", 12), ("", None), ("-1", None), ("1.0", None), (None, None), ("9" * 12, None)]
)
def test_query_protocol_version_parsing(raw: str | None, parsed: int | None) -> None:
    assert parse_query_protocol_version(raw) == parsed
