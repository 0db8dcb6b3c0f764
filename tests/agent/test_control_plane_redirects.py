"""The agent never follows a redirect: a 3xx from the control plane would otherwise re-send the
enroll body (token, credential, idempotency key) or the bearer credential to another origin."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT, INVENTORY
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID, exit_for
from modelforge_node_agent.failures import RedirectRefused

from tests.agent.fake_control_plane import (
    TOKEN,
    FakeClock,
    RecordingStop,
    SilentListener,
    fake_server,
    json_reply,
    real_agent,
)


@pytest.fixture()
def elsewhere() -> Iterator[SilentListener]:
    listener = SilentListener()
    yield listener
    listener.close()


@pytest.mark.parametrize("path", [ENROLL, HEARTBEAT, INVENTORY])
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_agent_redirected_by_the_control_plane_sends_nothing_elsewhere_and_exits_2(
    tmp_path: Path, elsewhere: SilentListener, caplog: pytest.LogCaptureFixture, status: int, path: str
) -> None:
    location = f"{elsewhere.url}/stolen{path}?from=modelforge"
    redirect = json_reply(status, {"moved": True}, {"Location": location})
    clock = FakeClock()
    with fake_server({path: redirect}) as plane:
        # Each wait moves the clock an hour on, so the inventory refresh falls due after one heartbeat.
        agent, state = real_agent(
            tmp_path,
            plane.url,
            RecordingStop(limit=5, clock=clock),
            clock,
            MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS="1",
            MODELFORGE_AGENT_INVENTORY_REFRESH_SECONDS="3600",
            MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS="3600",
        )
        with caplog.at_level(logging.DEBUG, logger="modelforge"), pytest.raises(RedirectRefused) as stopped:
            agent.run()
        assert plane.paths()[-1] == path  # the agent reached the redirected call ...
    assert elsewhere.connections_waiting() == 0  # ... and nothing reached the other origin
    assert exit_for(stopped.value).code == CONFIGURATION_INVALID
    message = stopped.value.message
    assert message.startswith(f"HTTP {status} redirect on POST {path}: the agent never follows redirects")
    assert "MODELFORGE_AGENT_CONTROL_PLANE_URL" in message
    for text in (message, caplog.text):
        assert elsewhere.url not in text and "stolen" not in text and "moved" not in text
        assert TOKEN not in text
    identity = state.load()
    assert identity is not None and identity.credential not in message + caplog.text
