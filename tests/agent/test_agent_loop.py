"""The agent's life cycle with a fake control plane, a fake clock and a fake stop signal:
no real time passes in these tests."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from modelforge_node_agent.agent import Agent
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT, INVENTORY
from modelforge_node_agent.exit_codes import CONFIGURATION_INVALID, IDENTITY_REFUSED, PROTOCOL_INCOMPATIBLE, exit_for
from modelforge_node_agent.failures import ConfigurationInvalid, IdentityRefused, Refused, TransientFailure
from modelforge_node_agent.gpu import GpuInfo, GpuTelemetry
from modelforge_node_agent.identity import StateVolume
from modelforge_protocol.schemas import AGENT_INSTANCE_ID_PATTERN

from tests.agent.fake_control_plane import FakeClock, RecordingStop, in_process_agent

TOKEN = "mfe.enr_" + "0" * 32 + "." + "A" * 43
NODE_ID = "node_" + "b" * 32


class FakeControlPlane:
    """Answers by path from a script of results (dicts) or exceptions; records every call."""

    def __init__(self, script: dict[str, list[Any]], on_call: Callable[[str], None] | None = None) -> None:
        self.script = script
        self.calls: list[tuple[str, dict[str, Any], Any]] = []
        self.on_call = on_call

    def post(self, path: str, body: dict[str, Any], identity: Any = None) -> dict[str, Any]:
        self.calls.append((path, body, identity))
        if self.on_call:
            self.on_call(path)
        queue = self.script.get(path, [])
        outcome = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else {})
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def paths(self) -> list[str]:
        return [call[0] for call in self.calls]


class TwoGpus:
    def devices(self) -> list[GpuInfo]:
        return [GpuInfo(i, f"GPU-0000000{i}-aaaa", "NVIDIA H200", 141 * 2**30, "570.1", "12.8") for i in range(2)]

    def telemetry(self) -> list[GpuTelemetry]:
        return [GpuTelemetry(i, 50.0, 2**30, 141 * 2**30, 60.0, 300.0) for i in range(2)]


ENROLLED = {"node_id": NODE_ID, "heartbeat_interval_seconds": 15, "replayed": False}
ONLINE = {"node_id": NODE_ID, "status": "online", "heartbeat_interval_seconds": 15, "work_waiting": False}


def _agent(
    tmp_path: Path, client: FakeControlPlane, stop: RecordingStop, jitter: float = 1.0, **env: str
) -> tuple[Agent, StateVolume]:
    settings = {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:8000",
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": TOKEN,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia",
        "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
        "MODELFORGE_AGENT_HOSTNAME": "gpu_node",
        **env,
    }
    return in_process_agent(settings, stop=stop, client=client, gpus=TwoGpus(), jitter=jitter)


def test_agent_persists_its_credential_before_it_enrolls(tmp_path: Path) -> None:
    seen_on_disk = []
    state_file = tmp_path / "state" / "identity.json"
    client = FakeControlPlane(
        {ENROLL: [ENROLLED], HEARTBEAT: [ONLINE]}, on_call=lambda path: seen_on_disk.append((path, state_file.exists()))
    )
    agent, state = _agent(tmp_path, client, RecordingStop(limit=1))
    agent.run()
    assert seen_on_disk[0] == (ENROLL, True)
    identity = state.load()
    assert identity is not None and identity.node_id == NODE_ID
    assert client.calls[0][1]["credential"] == identity.credential


def test_agent_retrying_a_lost_enroll_answer_sends_the_same_credential_and_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost = TransientFailure("ReadTimeout", "POST", ENROLL)
    client = FakeControlPlane({ENROLL: [lost, {**ENROLLED, "replayed": True}], HEARTBEAT: [ONLINE]})
    agent, _ = _agent(tmp_path, client, RecordingStop(limit=2))
    with caplog.at_level(logging.WARNING, logger="modelforge.agent"):
        agent.run()
    first, second = (call[1] for call in client.calls if call[0] == ENROLL)
    assert first["idempotency_key"] == second["idempotency_key"] and first["credential"] == second["credential"]
    assert "ReadTimeout on POST /api/v1/agent/enroll (backoff 1s…16s)" in caplog.text


def test_agent_with_an_identity_never_enrolls_and_says_the_token_can_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _ = _agent(tmp_path, FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [ONLINE]}), RecordingStop(limit=1))
    agent.run()
    client = FakeControlPlane({HEARTBEAT: [ONLINE]})
    restarted, _ = _agent(tmp_path, client, RecordingStop(limit=1))
    with caplog.at_level(logging.INFO, logger="modelforge.agent"):
        restarted.run()
    assert client.paths() == [INVENTORY, HEARTBEAT]
    assert "enrollment token is ignored and can be removed" in caplog.text


def test_agent_backs_off_one_two_four_then_resets_after_success(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = TransientFailure("ConnectError", "POST", HEARTBEAT)
    client = FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [down, down, down, ONLINE, down, ONLINE]})
    stop = RecordingStop(limit=7)
    agent, _ = _agent(tmp_path, client, stop, MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS="5")
    with caplog.at_level(logging.WARNING, logger="modelforge.agent"):
        agent.run()
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("ConnectError")]
    assert lines == [
        "ConnectError on POST /api/v1/agent/heartbeat (backoff 1s…16s)",
        "ConnectError on POST /api/v1/agent/heartbeat (backoff 2s…16s)",
        "ConnectError on POST /api/v1/agent/heartbeat (backoff 4s…16s)",
        "ConnectError on POST /api/v1/agent/heartbeat (backoff 1s…16s)",
    ]
    assert stop.waits == [1, 2, 4, 5, 1, 5, 5]


@pytest.mark.parametrize(
    ("jitter", "waits"),
    [
        (1.0, [1, 2, 4, 8, 16, 16, 16]),  # no jitter: the nominal steps, then the 16 s cap
        (0.5, [0.9, 1.8, 3.6, 7.2, 14.4, 14.4, 14.4]),  # jitter 0.5 is 90% of each step (80% + 20% * 0.5)
        (0.0, [0.8, 1.6, 3.2, 6.4, 12.8, 12.8, 12.8]),  # the lowest jitter is 80% of each step
    ],
)
def test_agent_backoff_waits_are_the_steps_up_to_the_cap_scaled_by_jitter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, jitter: float, waits: list[float]
) -> None:
    down = TransientFailure("ConnectError", "POST", HEARTBEAT)
    client = FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [down] * 7 + [ONLINE]})
    stop = RecordingStop(limit=8)
    agent, _ = _agent(tmp_path, client, stop, jitter, MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS="5")
    with caplog.at_level(logging.WARNING, logger="modelforge.agent"):
        agent.run()
    assert stop.waits == pytest.approx([*waits, 5])
    logged = [record.backoff_seconds for record in caplog.records if getattr(record, "event", "") == "publish_failed"]
    assert logged == [1, 2, 4, 8, 16, 16, 16]  # the log names the nominal step, whatever the jitter


def test_agent_heartbeats_carry_telemetry_for_every_gpu_at_the_interval_it_was_given(tmp_path: Path) -> None:
    client = FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [{**ONLINE, "heartbeat_interval_seconds": 30}]})
    stop = RecordingStop(limit=3)
    agent, _ = _agent(tmp_path, client, stop)
    agent.run()
    beats = [call[1] for call in client.calls if call[0] == HEARTBEAT]
    assert len(beats) == 3 and all(len(beat["telemetry"]["gpus"]) == 2 for beat in beats)
    assert stop.waits == [30, 30, 30]


@pytest.mark.parametrize(
    ("refusal", "exit_code", "words"),
    [
        (Refused(401, "credential_revoked", "POST", HEARTBEAT, None, None), IDENTITY_REFUSED, "enrolled again"),
        (
            Refused(400, "protocol_incompatible", "POST", HEARTBEAT, "TOO_OLD", "Upgrade the node agent."),
            PROTOCOL_INCOMPATIBLE,
            "TOO_OLD",
        ),
    ],
)
def test_agent_stops_with_the_documented_code_on_a_fatal_heartbeat_answer(
    tmp_path: Path, refusal: Refused, exit_code: int, words: str
) -> None:
    agent, _ = _agent(tmp_path, FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [refusal]}), RecordingStop(limit=5))
    with pytest.raises(Refused) as stopped:
        agent.run()
    stops = exit_for(stopped.value)
    assert stops.code == exit_code and words in stops.message


@pytest.mark.parametrize(
    "code",
    ["enrollment_token_unknown", "enrollment_token_expired", "enrollment_token_revoked", "enrollment_token_consumed"],
)
def test_agent_refused_token_exits_4_and_asks_for_a_new_one(tmp_path: Path, code: str) -> None:
    refusal = Refused(409, code, "POST", ENROLL, None, None)
    agent, _ = _agent(tmp_path, FakeControlPlane({ENROLL: [refusal]}), RecordingStop(limit=5))
    with pytest.raises(Refused) as stopped:
        agent.run()
    stops = exit_for(stopped.value)
    assert stops.code == IDENTITY_REFUSED and "new token" in stops.message
    assert TOKEN not in stops.message


def test_agent_whose_identity_vanished_after_validation_without_token_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "identity.json").write_text("{}")  # validation sees an identity ...
    agent, _ = _agent(tmp_path, FakeControlPlane({}), RecordingStop(limit=1), MODELFORGE_AGENT_ENROLLMENT_TOKEN="")
    (tmp_path / "state" / "identity.json").unlink()  # ... which is gone when the agent starts
    with pytest.raises(ConfigurationInvalid) as stopped:
        agent.run()
    stops = exit_for(stopped.value)
    assert stops.code == CONFIGURATION_INVALID and "MODELFORGE_AGENT_ENROLLMENT_TOKEN" in stops.message


def test_agent_identity_for_another_control_plane_is_refused(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path, FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [ONLINE]}), RecordingStop(limit=1))
    agent.run()
    moved, _ = _agent(
        tmp_path,
        FakeControlPlane({}),
        RecordingStop(limit=1),
        MODELFORGE_AGENT_CONTROL_PLANE_URL="https://other.internal",
    )
    with pytest.raises(IdentityRefused) as stopped:
        moved.run()
    assert exit_for(stopped.value).code == IDENTITY_REFUSED


def test_agent_resends_inventory_when_the_refresh_interval_passes(tmp_path: Path) -> None:
    client = FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [ONLINE]})
    clock = FakeClock()
    stop = RecordingStop(limit=3)
    agent, _ = _agent(tmp_path, client, stop, MODELFORGE_AGENT_INVENTORY_REFRESH_SECONDS="100")
    agent._clock = clock  # type: ignore[attr-defined]

    original = stop.wait

    def advancing_wait(seconds: float) -> bool:
        clock.now += 60
        return original(seconds)

    stop.wait = advancing_wait  # type: ignore[method-assign]
    agent.run()
    assert client.paths() == [ENROLL, HEARTBEAT, HEARTBEAT, INVENTORY, HEARTBEAT]


def test_agent_heartbeats_carry_its_instance_id_only_where_the_feature_is_listed(tmp_path: Path) -> None:
    listed = {**ONLINE, "features": ["agent_instance"]}
    client = FakeControlPlane({ENROLL: [ENROLLED], HEARTBEAT: [listed, ONLINE, ONLINE]})
    agent, _ = _agent(tmp_path, client, RecordingStop(limit=3))
    agent.run()
    beats = [body for path, body, _ in client.calls if path == HEARTBEAT]
    # the first knows no features yet; the second follows an answer listing it; the third one that does not
    assert ["agent_instance_id" in body for body in beats] == [False, True, False]
    assert re.fullmatch(AGENT_INSTANCE_ID_PATTERN, beats[1]["agent_instance_id"])
    restarted, _ = _agent(tmp_path, FakeControlPlane({HEARTBEAT: [listed]}), RecordingStop(limit=1))
    assert restarted.instance_id != agent.instance_id  # random per process start
