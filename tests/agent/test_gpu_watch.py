"""``gpu_watch``: what each heartbeat reports of GPU health (only when it changed), what an answer's
drains, blocks and re-checks do to the GPUs that take work, and the work loop's slots per GPU; on
the scripted NVML fake (``nvml_simulation``)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from modelforge_node_agent.gpu_watch import GpuWatch, read_boot_id
from modelforge_node_agent.nvml_simulation import ScriptedProbe
from modelforge_protocol.schemas import FEATURE_GPU_HEALTH, HEARTBEAT

from tests.agent.test_nvml_simulation import UUIDS, four_gpus

FEATURES = frozenset({FEATURE_GPU_HEALTH})
BOOT = "0b0b0b0b-0000-4000-8000-000000000001"
T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)


class Scenario:
    def __init__(self, path: Path) -> None:
        self.path, self.document = path, four_gpus()
        self.write()

    def write(self) -> None:
        text = json.dumps(self.document)
        self.path.write_text(text)

    def change(self, edit: Any) -> None:
        document = copy.deepcopy(self.document)
        edit(document)
        self.document = document
        self.write()


@pytest.fixture()
def scenario(tmp_path: Path) -> Scenario:
    return Scenario(tmp_path / "scenario.json")


def _watch(scenario: Scenario) -> GpuWatch:
    probe = ScriptedProbe(scenario.path)
    probe.init()
    return GpuWatch(probe, probe.devices(), 5.0, boot_id=BOOT, wall=lambda: T0)


def _heartbeat_valid(part: dict[str, Any]) -> None:
    body = {"protocol_version": 1, "agent_version": "1.3.0", "health": {"status": "ok"}, "telemetry": {"gpus": []}}
    jsonschema.validate({**body, **part}, HEARTBEAT)


def test_nothing_goes_to_a_control_plane_that_does_not_list_gpu_health(scenario: Scenario) -> None:
    assert _watch(scenario).heartbeat_part(frozenset({"slots"})) == {}


def test_the_report_goes_first_then_only_when_it_changed(scenario: Scenario) -> None:
    watch = _watch(scenario)
    first = watch.heartbeat_part(FEATURES)
    _heartbeat_valid(first)
    assert first["boot_id"] == BOOT
    assert [gpu["uuid"] for gpu in first["gpu_health"]["gpus"]] == UUIDS
    assert {gpu["state"] for gpu in first["gpu_health"]["gpus"]} == {"healthy"}
    watch.answered({"status": "online"})
    assert watch.heartbeat_part(FEATURES) == {"boot_id": BOOT}  # unchanged: nothing more
    scenario.change(lambda doc: doc["gpus"][1]["fields"].update(remap_pending=True))
    changed = watch.heartbeat_part(FEATURES)
    states = {gpu["uuid"]: gpu["state"] for gpu in changed["gpu_health"]["gpus"]}
    assert states[UUIDS[1]] == "unschedulable" and states[UUIDS[0]] == "healthy"
    assert watch.usable_gpus() == [UUIDS[0], UUIDS[2], UUIDS[3]]


def test_a_report_whose_answer_never_came_is_sent_again(scenario: Scenario) -> None:
    watch = _watch(scenario)
    assert "gpu_health" in watch.heartbeat_part(FEATURES)
    assert "gpu_health" in watch.heartbeat_part(FEATURES)  # no answer in between: not accepted


def test_blocked_and_drained_gpus_take_no_work_and_say_that_it_changed(scenario: Scenario) -> None:
    watch = _watch(scenario)
    watch.heartbeat_part(FEATURES)
    assert watch.answered({"status": "online"}) is False
    assert watch.usable_gpus() == UUIDS and watch.slot_gpus() == UUIDS
    answer = {"drained": False, "blocked_gpus": [{"uuid": UUIDS[2], "reason": "latched"}]}
    assert watch.answered(answer) is True
    assert watch.usable_gpus() == [UUIDS[0], UUIDS[1], UUIDS[3]]
    assert watch.answered({"drained": True, "blocked_gpus": []}) is True
    assert watch.usable_gpus() == [] and watch.drained
    assert watch.answered({"status": "online"}) is True and watch.usable_gpus() == UUIDS


def test_an_xid_makes_the_gpu_faulted_at_once_and_a_recheck_after_repair_brings_it_back(scenario: Scenario) -> None:
    watch = _watch(scenario)
    watch.heartbeat_part(FEATURES)
    watch.answered({"status": "online"})
    watch._tracker.record_xid(UUIDS[0], 48, T0)  # what the event thread does
    assert watch.hard_faulted() == {UUIDS[0]}  # before any heartbeat grades it
    part = watch.heartbeat_part(FEATURES)
    graded = {gpu["uuid"]: gpu for gpu in part["gpu_health"]["gpus"]}
    assert graded[UUIDS[0]]["state"] == "unschedulable"
    assert graded[UUIDS[0]]["reasons"][0]["xid"] == 48
    assert UUIDS[0] not in watch.usable_gpus()
    watch.answered({"drained": False, "blocked_gpus": [{"uuid": UUIDS[0], "reason": "latched"}]})
    # the admin cleared it: the answer asks for a re-check, which reads the (repaired) GPU afresh
    assert watch.answered({"drained": False, "blocked_gpus": [], "recheck_gpus": [UUIDS[0]]}) is True
    assert watch.hard_faulted() == set() and UUIDS[0] in watch.usable_gpus()
    reported = watch.heartbeat_part(FEATURES)  # the re-check's result always goes
    assert {gpu["uuid"]: gpu["state"] for gpu in reported["gpu_health"]["gpus"]}[UUIDS[0]] == "healthy"


def test_a_recheck_of_a_gpu_that_is_still_broken_keeps_it_faulted(scenario: Scenario) -> None:
    watch = _watch(scenario)
    scenario.change(lambda doc: doc["gpus"][3]["fields"].update(remap_failure=True))
    watch.heartbeat_part(FEATURES)
    watch.answered({"drained": False, "blocked_gpus": [], "recheck_gpus": [UUIDS[3]]})
    assert UUIDS[3] not in watch.usable_gpus()


def test_a_cpu_node_reports_its_boot_id_only_and_honours_a_drain(tmp_path: Path) -> None:
    watch = GpuWatch(None, [], 5.0, boot_id=BOOT)
    assert watch.heartbeat_part(FEATURES) == {"boot_id": BOOT}
    watch.answered({"drained": True})
    assert watch.drained and watch.usable_gpus() == [] and not watch.has_gpus


def test_the_boot_id_is_read_and_never_invented(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text(BOOT + "\n")
    bad.write_text("not-a-boot-id\n")
    assert read_boot_id(good) == BOOT
    assert read_boot_id(bad) is None and read_boot_id(tmp_path / "absent") is None


# --- a GPU lost from the bus: the others serve ----------------------------------------------------


def test_a_gpu_lost_at_start_is_left_out_and_the_others_pass_the_preflight(scenario: Scenario) -> None:
    from modelforge_node_agent.preflight import run_preflight

    scenario.change(lambda doc: doc["gpus"][2].update(lost=True))
    result = run_preflight("nvidia", lambda: ScriptedProbe(scenario.path), timeout_seconds=5)
    assert [gpu.uuid for gpu in result.gpus] == [UUIDS[0], UUIDS[1], UUIDS[3]]
    assert len(result.telemetry) == 3


def test_a_gpu_lost_mid_run_is_failed_and_its_telemetry_left_out_while_the_others_report(scenario: Scenario) -> None:
    from modelforge_node_agent.preflight import read_all_telemetry

    probe = ScriptedProbe(scenario.path)
    probe.init()
    gpus = probe.devices()
    watch = GpuWatch(probe, gpus, 5.0, boot_id=BOOT, wall=lambda: T0)
    scenario.change(lambda doc: doc["gpus"][1].update(lost=True))
    assert [reading.index for reading in read_all_telemetry(probe, gpus)] == [0, 2, 3]
    graded = {gpu["uuid"]: gpu for gpu in watch.heartbeat_part(FEATURES)["gpu_health"]["gpus"]}
    assert (graded[UUIDS[1]]["state"], graded[UUIDS[1]]["reasons"][0]["action"]) == ("failed", "reboot")
    assert watch.usable_gpus() == [UUIDS[0], UUIDS[2], UUIDS[3]]


def test_no_gpu_yielding_telemetry_still_fails_the_preflight(scenario: Scenario) -> None:
    from modelforge_node_agent.preflight import TELEMETRY_UNAVAILABLE, PreflightFailed, read_all_telemetry

    probe = ScriptedProbe(scenario.path)
    probe.init()
    gpus = probe.devices()
    scenario.change(lambda doc: [gpu.update(lost=True) for gpu in doc["gpus"]])
    with pytest.raises(PreflightFailed) as failed:
        read_all_telemetry(probe, gpus)
    assert failed.value.code == TELEMETRY_UNAVAILABLE
