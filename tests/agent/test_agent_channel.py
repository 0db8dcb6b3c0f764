"""The agent's side of the push channel, over real HTTP to a fake control plane: tickets read from
the enroll and heartbeat answers, the heartbeat's ``push_channel`` report only when the control
plane advertises it, ``MODELFORGE_AGENT_PUSH_CHANNEL``, and the channel's hints reaching the
work loop. An old control plane (no ``features``) gets exactly today's heartbeat."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from modelforge_node_agent.agent import Agent
from modelforge_node_agent.channel import Channel
from modelforge_node_agent.channel_link import LinkFailed, WebSocketOpener, tls_context
from modelforge_node_agent.config import load_config
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT, ControlPlaneClient
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID
from modelforge_node_agent.gpu_source import NoGpus
from modelforge_node_agent.identity import StateVolume
from modelforge_node_agent.main import start
from modelforge_node_agent.transport import base_url, build_session
from modelforge_protocol import schemas

from tests.agent.channel_server import ChannelServer, poll
from tests.agent.channel_support import CLOSED, WALL_AT_ZERO, WORK_ID, ChannelHarness, channel_block, ticket_secret
from tests.agent.fake_control_plane import (
    ENROLLED,
    ONLINE,
    TOKEN,
    FakeClock,
    RecordingStop,
    enrolled_before,
    fake_server,
    json_reply,
)

TODAYS_HEARTBEAT = {"protocol_version", "agent_version", "health", "telemetry"}
FEATURES = {"features": ["push_channel"]}


def _agent(
    tmp_path: Path, url: str, stop: Any, channel: Channel | None, work: Any = None, **env: str
) -> tuple[Agent, StateVolume]:
    config = load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": url,
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
            "MODELFORGE_AGENT_HOSTNAME": "fake_node",
            **env,
        }
    )
    state = StateVolume(config.state_volume)
    state.prepare()
    client = ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    agent = Agent(
        config, client, state, NoGpus(), stop=stop, clock=FakeClock(), jitter=lambda: 1.0, work=work, channel=channel
    )
    return agent, state


def _ticketed(answer: dict[str, Any], number: int, url: str = "ws://127.0.0.1:9/api/v1/agent/channel") -> Any:
    return json_reply(200, {**answer, **FEATURES, "channel": channel_block(ticket_secret(number), 0.0, url=url)})


def test_agent_against_an_old_control_plane_sends_todays_heartbeat_and_never_connects(tmp_path: Path) -> None:
    h = ChannelHarness()
    with fake_server() as server:
        agent, _ = _agent(tmp_path, server.url, RecordingStop(limit=3), h.channel)
        agent.run()
    bodies = server.bodies(HEARTBEAT)
    assert len(bodies) == 3 and all(set(body) == TODAYS_HEARTBEAT for body in bodies)
    assert h.opener.calls == []
    with pytest.raises(AssertionError, match="starts its loop once"):
        h.run()  # the channel's loop never started: no ticket ever came


def test_agent_enroll_ticket_starts_the_channel_and_heartbeats_report_it(tmp_path: Path) -> None:
    h = ChannelHarness()
    replies = {
        ENROLL: _ticketed(ENROLLED, 1),
        HEARTBEAT: json_reply(200, {**ONLINE, **FEATURES}),
    }
    with fake_server(replies) as server:
        agent, _ = _agent(tmp_path, server.url, RecordingStop(limit=2), h.channel)
        agent.run()
    assert [body["push_channel"] for body in server.bodies(HEARTBEAT)] == [
        {"state": "connecting", "need_ticket": False}
    ] * 2
    assert h.started  # the connection's loop (its use of the ticket: test_channel_websocket.py, and below)


def test_agent_restarted_asks_for_a_ticket_at_once_when_the_control_plane_serves_the_channel(
    tmp_path: Path,
) -> None:
    h = ChannelHarness()
    stop = RecordingStop(limit=3)
    replies = {HEARTBEAT: [json_reply(200, {**ONLINE, **FEATURES}), _ticketed(ONLINE, 2)]}
    with fake_server(replies) as server:
        agent, state = _agent(tmp_path, server.url, stop, h.channel)
        enrolled_before(state, server.url)
        agent.run()
    first, second, third = server.bodies(HEARTBEAT)
    assert set(first) == TODAYS_HEARTBEAT  # not yet known to serve the channel: today's body
    assert second["push_channel"] == {"state": "connecting", "need_ticket": True}
    assert third["push_channel"] == {"state": "connecting", "need_ticket": False}  # the ticket came
    assert stop.waits == [0.0, 15, 15]  # the second heartbeat did not wait an interval


def test_agent_with_push_channel_off_reports_off_and_never_connects(tmp_path: Path) -> None:
    h = ChannelHarness(enabled=False)
    replies = {ENROLL: _ticketed(ENROLLED, 1), HEARTBEAT: _ticketed(ONLINE, 2)}
    with fake_server(replies) as server:
        agent, _ = _agent(tmp_path, server.url, RecordingStop(limit=2), h.channel, MODELFORGE_AGENT_PUSH_CHANNEL="off")
        agent.run()
    assert [body["push_channel"] for body in server.bodies(HEARTBEAT)] == [{"state": "off", "need_ticket": False}] * 2
    with pytest.raises(AssertionError, match="starts its loop once"):
        h.run()


def test_agent_with_push_channel_off_never_dials_a_real_channel_it_is_offered(tmp_path: Path) -> None:
    plane = ChannelServer()
    channel = Channel(WebSocketOpener(tls_context(None), open_seconds=5.0), enabled=False, wall=lambda: WALL_AT_ZERO)
    replies = {ENROLL: _ticketed(ENROLLED, 1, url=plane.url), HEARTBEAT: _ticketed(ONLINE, 2, url=plane.url)}
    try:
        with fake_server(replies) as server:
            agent, _ = _agent(
                tmp_path, server.url, RecordingStop(limit=3), channel, MODELFORGE_AGENT_PUSH_CHANNEL="off"
            )
            agent.run()
        assert channel._thread is None  # no connection loop was ever started
        assert plane.handshakes == [] and plane.connections == []
    finally:
        plane.close()


def test_agent_heartbeat_without_features_stops_reporting_the_channel(tmp_path: Path) -> None:
    """A control plane rolled back to one without the channel refuses the unknown field: once an
    answer lists no ``features``, the heartbeat is today's again."""
    h = ChannelHarness()
    replies = {ENROLL: _ticketed(ENROLLED, 1), HEARTBEAT: [json_reply(200, ONLINE)]}
    with fake_server(replies) as server:
        agent, _ = _agent(tmp_path, server.url, RecordingStop(limit=3), h.channel)
        agent.run()
    first, *later = server.bodies(HEARTBEAT)
    assert "push_channel" in first and all(set(body) == TODAYS_HEARTBEAT for body in later)


def test_agent_ticket_is_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    h = ChannelHarness()
    replies = {ENROLL: _ticketed(ENROLLED, 1), HEARTBEAT: _ticketed(ONLINE, 2)}
    with fake_server(replies) as server:
        agent, state = _agent(tmp_path, server.url, RecordingStop(limit=2), h.channel)
        agent.run()
    assert "mfct_" not in caplog.text
    assert all("mfct_" not in path.read_text() for path in state.path.rglob("*") if path.is_file())


class StubWork:
    """The work loop as the publishing thread sees it, recording hints and renewals."""

    view = None
    fatal = None

    def __init__(self) -> None:
        self.hints = 0
        self.renewed: list[str] = []

    def observe(self) -> None:
        return None

    def advertised(self, features: frozenset[str]) -> None:
        self.features = features

    def slot_report(self) -> dict[str, int]:
        return {"total": 1, "busy": 0, "schedulable": 1}

    def start(self, identity: Any, wake: Any = None) -> None:
        return None

    def close(self) -> None:
        return None

    def hint(self) -> None:
        self.hints += 1

    def renew_now(self, work_id: str) -> None:
        self.renewed.append(work_id)


def test_agent_channel_wake_hints_a_claim_and_cancel_renews_that_work(tmp_path: Path) -> None:
    """End to end on 127.0.0.1: the enroll answer names a real WebSocket server; its ``wake``
    reaches the work loop's ``hint``, its ``cancel`` the work loop's ``renew_now``."""
    plane = ChannelServer()
    work = StubWork()
    channel = Channel(WebSocketOpener(tls_context(None), open_seconds=5.0), wall=lambda: WALL_AT_ZERO)
    stop = threading.Event()
    # the node stays stale: coming online while connected would hint a claim of its own, before or
    # after the connection opened (test_a_connected_node_that_comes_online_claims_once_so_that_it_parks)
    stale = json_reply(200, {**ONLINE, **FEATURES, "status": "stale"})
    replies = {ENROLL: _ticketed(ENROLLED, 1, url=plane.url), HEARTBEAT: stale}
    try:
        with fake_server(replies) as server:
            agent, _ = _agent(tmp_path, server.url, stop, channel, work=work)
            publisher = threading.Thread(target=agent.run, daemon=True)
            publisher.start()
            poll(lambda: plane.connections)
            assert plane.handshakes[0]["Authorization"] == f"Bearer {ticket_secret(1)}"
            plane.send('{"v": 1, "type": "wake"}')
            plane.send(json.dumps({"v": 1, "type": "cancel", "work_id": WORK_ID}))
            poll(lambda: work.hints == 2 and work.renewed == [WORK_ID])  # the connection hinted once too
            stop.set()
            publisher.join(5)
            assert not publisher.is_alive()
    finally:
        plane.close()


def test_a_connected_node_that_comes_online_claims_once_so_that_it_parks(tmp_path: Path) -> None:
    """The connection's own claim can reach the control plane before the first heartbeat made the
    node online (refused node_not_online): the node never parks, and no wake would reach it. The
    heartbeat that brings it online while connected hints one claim."""
    plane = ChannelServer()
    work = StubWork()
    channel = Channel(WebSocketOpener(tls_context(None), open_seconds=5.0), wall=lambda: WALL_AT_ZERO)
    stop = threading.Event()
    not_yet = json_reply(200, {**ONLINE, **FEATURES, "status": "stale"})
    online = json_reply(200, {**ONLINE, **FEATURES})
    replies = {ENROLL: _ticketed(ENROLLED, 1, url=plane.url), HEARTBEAT: [not_yet] * 30 + [online] * 200}
    try:
        with fake_server(replies) as server:
            agent, _ = _agent(
                tmp_path, server.url, stop, channel, work=work, MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS="0.1"
            )
            publisher = threading.Thread(target=agent.run, daemon=True)
            publisher.start()
            poll(lambda: plane.connections)
            poll(lambda: len(server.bodies(HEARTBEAT)) >= 40)  # online for a while now
            assert work.hints == 2  # the connection's claim, and one when it came online: not one per beat
            stop.set()
            publisher.join(5)
            assert not publisher.is_alive()
    finally:
        plane.close()


def test_start_with_a_bad_push_channel_setting_exits_2_naming_the_variable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
        "MODELFORGE_AGENT_PUSH_CHANNEL": "sometimes",
    }
    assert start(env) == CONFIGURATION_INVALID
    assert "MODELFORGE_AGENT_PUSH_CHANNEL must be one of on, off" in caplog.text
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("value, expected", [(None, "on"), ("on", "on"), ("OFF", "off"), (" off ", "off")])
def test_config_push_channel_is_on_unless_set_off(tmp_path: Path, value: str | None, expected: str) -> None:
    env = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:9",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
    }
    if value is not None:
        env["MODELFORGE_AGENT_PUSH_CHANNEL"] = value
    assert load_config(env).push_channel == expected


def test_agent_push_channel_reports_match_the_heartbeat_schema(tmp_path: Path) -> None:
    """Every report the agent sends (each state, with and without a reason) is a valid heartbeat
    field, as the control plane's request schema (closed: unknown fields refused) defines it."""
    if "push_channel" not in schemas.HEARTBEAT["properties"]:
        pytest.skip("the control plane's heartbeat schema does not define push_channel on this branch yet")
    validator = Draft202012Validator(schemas.HEARTBEAT)
    reports = [ChannelHarness(enabled=False).channel.report()]
    h = ChannelHarness()
    reports.append(h.channel.report())
    h.opener.outcomes = [LinkFailed("x" * 500), h.link(CLOSED)]
    h.start()
    h.offer()
    h.run()
    reports += h.reports
    assert {report["state"] for report in reports} >= {"off", "connecting", "fallback"}
    base = {"protocol_version": 1, "agent_version": "1.0.0", "health": {"status": "ok"}, "telemetry": {"gpus": []}}
    for report in reports:
        validator.validate({**base, "push_channel": report})
