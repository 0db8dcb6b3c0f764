"""429 handling over real HTTP with an injected clock: the agent waits at least the answer's
Retry-After (clamped to 1..3600 s), and a rate-limited inventory never holds up heartbeats."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT, INVENTORY

from tests.agent.fake_control_plane import (
    ONLINE,
    FakeClock,
    RecordingStop,
    Reply,
    enrolled_before,
    fake_server,
    json_reply,
    real_agent,
)


def _rate_limited(seconds: str, code: str = "inventory_rate_limited") -> Reply:
    body = {
        "error": {"code": code, "message": "slow down", "retry_after_seconds": int(seconds) if seconds.isdigit() else 0}
    }
    return json_reply(429, body, {"Retry-After": seconds})


def test_agent_rate_limited_inventory_keeps_heartbeating_and_retries_after_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    stop = RecordingStop(limit=10, clock=clock)
    with fake_server({INVENTORY: [_rate_limited("120"), json_reply(200, {"inventory": {}})]}) as plane:
        agent, state = real_agent(tmp_path, plane.url, stop, clock)
        enrolled_before(state, plane.url)  # a restart: the first thing it publishes is its inventory
        with caplog.at_level(logging.INFO, logger="modelforge"):
            agent.run()
    # t=0: inventory refused for 120 s; heartbeats every 15 s meanwhile; t=120: inventory again.
    assert plane.paths() == [INVENTORY] + [HEARTBEAT] * 8 + [INVENTORY, HEARTBEAT, HEARTBEAT]
    assert stop.waits == [15] * 10  # no backoff wait: heartbeats were never held up
    assert "HTTP 429 on POST /api/v1/agent/inventory (retry after 120s); heartbeats continue meanwhile" in caplog.text
    deferred = [record for record in caplog.records if getattr(record, "event", "") == "inventory_deferred"]
    assert len(deferred) == 1 and deferred[0].retry_after_seconds == 120  # type: ignore[attr-defined]
    assert [getattr(record, "event", "") for record in caplog.records].count("inventory_published") == 1


@pytest.mark.parametrize(
    ("retry_after", "first_wait"),
    [("30", 30), ("999999", 3600), ("0", 1), ("soon", 1), ("Wed, 21 Oct 2015 07:28:00 GMT", 1)],
)
def test_agent_rate_limited_heartbeat_waits_the_longer_of_backoff_and_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, retry_after: str, first_wait: float
) -> None:
    stop = RecordingStop(limit=2)
    with fake_server({HEARTBEAT: [_rate_limited(retry_after, "rate_limited"), json_reply(200, ONLINE)]}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, stop)
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()
    assert plane.paths() == [ENROLL, HEARTBEAT, HEARTBEAT]
    assert stop.waits == [first_wait, 15]
    assert caplog.records[0].getMessage().startswith("HTTP 429 on POST /api/v1/agent/heartbeat (backoff 1s…16s)")


def test_agent_rate_limited_enroll_waits_retry_after_then_enrolls(tmp_path: Path) -> None:
    stop = RecordingStop(limit=2)
    with fake_server(
        {ENROLL: [_rate_limited("45", "rate_limited"), json_reply(201, {"node_id": "node_" + "c" * 32})]}
    ) as plane:
        agent, state = real_agent(tmp_path, plane.url, stop)
        agent.run()
    assert plane.paths() == [ENROLL, ENROLL, HEARTBEAT] and stop.waits == [45, 15]
    identity = state.load()
    assert identity is not None and identity.enrolled
