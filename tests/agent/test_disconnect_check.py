"""The release check of bench/disconnect_check.py, run for a few seconds in its own process: a real
`modelforge local up` (stale=3 s, offline=6 s, sweep 1 s) and a real CPU agent frozen with SIGSTOP
for 8 s. The check's printed report carries every figure asserted here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import bench_scripts

#: one reading of the disconnected window: `  +1.5 s  stale     last_heartbeat_at ...`
_READING = re.compile(r"^\s+\+[0-9.]+ s\s+(\S+)\s+last_heartbeat_at ", re.MULTILINE)


def _observed_from(report: str, status: str) -> float:
    found = re.search(rf"^  {status}: observed from \+([0-9.]+) s after SIGSTOP", report, re.MULTILINE)
    assert found, report
    return float(found[1])


@pytest.mark.slow
def test_frozen_agent_heartbeat_stops_and_the_node_goes_stale_then_offline_then_returns(tmp_path: Path) -> None:
    ran = bench_scripts.run(
        "disconnect_check",
        *("--seconds", "8", "--stale-after", "3", "--offline-after", "6", "--interval", "1"),
        *("--log-dir", str(tmp_path)),
    )
    report = ran.stdout
    assert ran.returncode == 0, report + ran.stderr
    assert "VERDICT: PASS" in report and "  problem: " not in report, report
    assert "  last_heartbeat_at while disconnected: never advanced (" in report, report
    assert " (ADVANCED, " not in report, report
    # the statuses read while frozen, in their order of first appearance
    assert list(dict.fromkeys(_READING.findall(report))) == ["online", "stale", "offline"], report
    assert _observed_from(report, "stale") < _observed_from(report, "offline")
    assert "  agent requests logged by the control plane while frozen: 0\n" in report, report
    assert "  resumed: heartbeat advancing and online again," in report, report
    assert re.search(r"agent \(PID \d+\) stopped: exited with code 0", report), report
