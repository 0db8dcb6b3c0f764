"""The release check of bench/disconnect_check.py, run for a few seconds: a real `modelforge local up`
(stale=3 s, offline=6 s, sweep 1 s) and a real CPU agent frozen with SIGSTOP for 8 s."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.support import bench_scripts


def _load_check() -> ModuleType:
    return bench_scripts.load("disconnect_check")


@pytest.mark.slow
def test_frozen_agent_heartbeat_stops_and_the_node_goes_stale_then_offline_then_returns(tmp_path: Path) -> None:
    check = _load_check()
    lines: list[str] = []
    result = check.run_check(seconds=8, stale_after=3, offline_after=6, interval=1, log_dir=tmp_path, echo=lines.append)
    report = "\n".join(lines)
    assert result.passed, report
    assert result.heartbeat_advanced_while_disconnected is False, report
    assert result.heartbeat_before_freeze is not None and result.heartbeat_values_while_disconnected == [], report
    assert "stale" in result.statuses_seen and "offline" in result.statuses_seen, report
    assert result.statuses_seen == ["online", "stale", "offline"], report
    assert result.stale_expected and result.offline_expected, report
    assert result.agent_requests_while_disconnected == 0, report
    assert result.resumed and result.status_after_resume == "online", report
    assert result.heartbeat_after_resume not in (None, result.heartbeat_before_freeze), report
    assert result.stopped["agent"].startswith("exited with code 0"), report
    assert "VERDICT: PASS" in report
