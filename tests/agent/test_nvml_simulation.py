"""``nvml_simulation``: strict scenario files, the scripted probe, and the issue's scenarios graded
end to end through ``HealthTracker`` (Xid 13, Xid 48, GpuIsLost, row remapping, NOT_SUPPORTED
everywhere, a vanished UUID, recovery actions, recheck after clear)."""

from __future__ import annotations

import copy
import json
import os
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from modelforge_node_agent.gpu import (
    UNSUPPORTED,
    ClockEvents,
    GpuLost,
    HealthFields,
    NvmlUnavailable,
    TelemetryUnavailable,
    XidEvent,
    XidEventsFailed,
    present_health_signals,
    read_health_signals,
)
from modelforge_node_agent.gpu_health import GpuHealth, HealthTracker, health_report
from modelforge_node_agent.nvml_simulation import MAX_SCENARIO_BYTES, ScenarioError, ScriptedProbe, load_scenario
from modelforge_protocol.schemas import GPU_HEALTH_REPORT

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
UUIDS = [f"GPU-5e1a0000-0000-4000-8000-00000000000{n}" for n in range(1, 5)]


def healthy_gpu(uuid: str) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_bytes": 85520809984,
        "telemetry": {
            "utilization_percent": 0,
            "memory_used_bytes": 4194304,
            "temperature_celsius": 31,
            "power_watts": 70,
        },
        "fields": {"ecc_uncorrected_volatile": 0, "remap_pending": False, "remap_failure": False, "recovery_action": 0},
        "clock_reasons": [],
        "nvlink": [True, True],
        "mig": False,
        "lost": False,
    }


def four_gpus() -> dict[str, Any]:
    return {"driver_version": "570.124.06", "cuda_version": "12.8", "gpus": [healthy_gpu(u) for u in UUIDS]}


class Node:
    """A scenario file, its scripted probe, and a tracker graded the way the agent's heartbeat does."""

    def __init__(self, path: Path, document: dict[str, Any]) -> None:
        self.path, self.document, self._edits = path, document, 0
        self._write()
        self.probe = ScriptedProbe(path)
        self.probe.init()
        self.inventory = self.probe.devices()
        self.tracker = HealthTracker(known_uuids=[gpu.uuid for gpu in self.inventory])
        self.now = T0

    def _write(self) -> None:
        self.path.write_text(json.dumps(self.document))
        self._edits += 1  # a distinct modification time for every edit, however fast the test
        stamp = 1_700_000_000_000_000_000 + self._edits * 1_000_000_000
        os.utime(self.path, ns=(stamp, stamp))

    def edit(self, gpu: int | None = None, **changes: Any) -> None:
        target = self.document if gpu is None else self.document["gpus"][gpu]
        target.update(changes)
        self._write()

    def set_field(self, gpu: int, name: str, value: Any) -> None:
        self.document["gpus"][gpu]["fields"][name] = value
        self._write()

    def heartbeat(self) -> dict[str, GpuHealth]:
        self.now += timedelta(seconds=30)
        present, signals = present_health_signals(self.probe, self.inventory)
        graded = self.tracker.grade(present, signals, self.now)
        jsonschema.validate(health_report(graded), GPU_HEALTH_REPORT)
        return {gpu.uuid: gpu for gpu in graded}

    def deliver_xids(self) -> None:
        while (event := self.probe.wait_xid(1)) is not None:
            self.tracker.record_xid(event.uuid, event.xid, self.now)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "scenario.json", four_gpus())


def states(graded: dict[str, GpuHealth]) -> list[str]:
    return [graded[uuid].state for uuid in sorted(graded)]


# --- load_scenario -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["four_gpus.json", "eight_gpus.json"])
def test_packaged_scenarios_are_valid_and_healthy(tmp_path: Path, name: str) -> None:
    source = resources.files("modelforge_node_agent").joinpath("simulations", name)
    document = json.loads(source.read_text())
    node = Node(tmp_path / name, document)
    assert len(node.inventory) == {"four_gpus.json": 4, "eight_gpus.json": 8}[name]
    graded = node.heartbeat()
    assert set(states(graded)) == {"healthy"}
    assert node.tracker.schedulable_uuids() == sorted(gpu.uuid for gpu in node.inventory)


def write(tmp_path: Path, document: Any) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(extra=1), "Additional properties"),
        (lambda d: d["gpus"][0].update(color="red"), "gpus/0"),
        (lambda d: d["gpus"][0].update(uuid="gpu-1"), "gpus/0/uuid"),
        (lambda d: d["gpus"][0]["fields"].update(remap_pending="yes"), "gpus/0/fields/remap_pending"),
        (lambda d: d["gpus"][0].update(clock_reasons=["too_hot"]), "gpus/0/clock_reasons"),
        (lambda d: d.update(xid_events=[{"uuid": UUIDS[0], "xid": -1}]), "xid_events/0/xid"),
        (lambda d: d.pop("driver_version"), "driver_version"),
    ],
)
def test_load_scenario_refuses_invalid_documents_naming_where(tmp_path: Path, change: Any, message: str) -> None:
    document = four_gpus()
    change(document)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(write(tmp_path, document))


def test_load_scenario_refuses_a_uuid_listed_twice(tmp_path: Path) -> None:
    document = four_gpus()
    document["gpus"][1]["uuid"] = UUIDS[0]
    with pytest.raises(ScenarioError, match="twice"):
        load_scenario(write(tmp_path, document))


def test_load_scenario_refuses_big_missing_and_non_json_files(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_SCENARIO_BYTES + 1))
    with pytest.raises(ScenarioError, match="larger than"):
        load_scenario(big)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ScenarioError, match="not JSON"):
        load_scenario(tmp_path / "bad.json")


def test_scripted_probe_init_on_invalid_file_raises_nvml_unavailable(tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable, match="invalid"):
        ScriptedProbe(write(tmp_path, {"gpus": []})).init()


def test_minimal_gpu_defaults_to_healthy_without_nvlink(tmp_path: Path) -> None:
    gpu = {k: v for k, v in healthy_gpu(UUIDS[0]).items() if k in ("uuid", "name", "memory_total_bytes", "telemetry")}
    probe = ScriptedProbe(write(tmp_path, {"driver_version": "570.1", "cuda_version": "12.8", "gpus": [gpu]}))
    probe.init()
    assert probe.health_fields(0) == HealthFields(0, False, False, 0)
    assert (probe.clock_events(0), probe.nvlink_states(0), probe.mig_enabled(0)) == (
        ClockEvents(False, False, False),
        UNSUPPORTED,
        False,
    )
    assert probe.telemetry(0).power_watts == 70.0


# --- the scripted probe ----------------------------------------------------------------------------


def test_edit_takes_effect_on_next_read_and_invalid_edit_keeps_last_valid(node: Node) -> None:
    node.set_field(1, "recovery_action", 3)
    assert node.probe.health_fields(1).recovery_action == 3
    node.path.write_text('{"gpus": "half-written')
    os.utime(node.path, ns=(1, 1))
    assert node.probe.health_fields(1).recovery_action == 3


def test_xid_events_are_delivered_once_each_by_position(node: Node) -> None:
    node.probe.register_xid_events()
    node.edit(xid_events=[{"uuid": UUIDS[0], "xid": 13}])
    assert node.probe.wait_xid(1) == XidEvent(UUIDS[0], 13)
    assert node.probe.wait_xid(1) is None
    node.edit(xid_events=[{"uuid": UUIDS[0], "xid": 13}, {"uuid": UUIDS[2], "xid": 48}])
    assert node.probe.wait_xid(1) == XidEvent(UUIDS[2], 48)
    assert node.probe.wait_xid(1) is None


def test_xid_wait_fails_raises_and_lost_gpu_raises_gpu_lost_on_every_call(node: Node) -> None:
    node.probe.register_xid_events()
    node.edit(xid_wait_fails=True)
    with pytest.raises(XidEventsFailed):
        node.probe.wait_xid(1)
    node.edit(2, lost=True)
    for call in (node.probe.telemetry, node.probe.health_fields, node.probe.clock_events, node.probe.mig_enabled):
        with pytest.raises(GpuLost):
            call(2)
    assert node.probe.device_uuids() == [UUIDS[0], UUIDS[1], UUIDS[3]]


def test_removed_gpu_vanishes_and_the_others_keep_their_index(node: Node) -> None:
    node.document["gpus"].pop(1)
    node.edit()
    with pytest.raises(TelemetryUnavailable):
        node.probe.telemetry(1)
    assert [gpu.index for gpu in node.probe.devices()] == [0, 2, 3]
    assert read_health_signals(node.probe, 2).fields == HealthFields(0, False, False, 0)


# --- the scenarios, through HealthTracker ---------------------------------------------------


def test_scenario_xid_13_stays_healthy_with_the_reason_recorded(node: Node) -> None:
    node.probe.register_xid_events()
    node.edit(xid_events=[{"uuid": UUIDS[0], "xid": 13}])
    node.deliver_xids()
    graded = node.heartbeat()
    assert states(graded) == ["healthy"] * 4
    assert [(r.code, r.xid, r.action) for r in graded[UUIDS[0]].reasons] == [("xid", 13, "restart_app")]
    assert len(node.tracker.schedulable_uuids()) == 4


def test_scenario_xid_48_makes_the_gpu_unschedulable_with_reset_gpu(node: Node) -> None:
    node.probe.register_xid_events()
    node.edit(xid_events=[{"uuid": UUIDS[1], "xid": 48}])
    node.deliver_xids()
    graded = node.heartbeat()
    assert states(graded) == ["healthy", "unschedulable", "healthy", "healthy"]
    assert graded[UUIDS[1]].reasons[0].action == "reset_gpu"
    assert node.tracker.schedulable_uuids() == [UUIDS[0], UUIDS[2], UUIDS[3]]


def test_scenario_gpu_is_lost_makes_it_failed_with_reboot(node: Node) -> None:
    node.edit(3, lost=True)
    graded = node.heartbeat()
    assert states(graded) == ["healthy", "healthy", "healthy", "failed"]
    assert [(r.code, r.action) for r in graded[UUIDS[3]].reasons] == [("gpu_lost", "reboot")]


def test_scenario_remap_pending_and_remap_failure(node: Node) -> None:
    node.set_field(0, "remap_pending", True)
    node.set_field(1, "remap_failure", True)
    graded = node.heartbeat()
    assert states(graded) == ["unschedulable", "failed", "healthy", "healthy"]
    assert (graded[UUIDS[0]].reasons[0].action, graded[UUIDS[1]].reasons[0].action) == ("reset_gpu", "rma")


def test_scenario_not_supported_everywhere_is_unknown_and_still_schedulable(node: Node) -> None:
    for index in range(4):
        gpu = node.document["gpus"][index]
        gpu["fields"] = dict.fromkeys(gpu["fields"], "not_supported")
        gpu["clock_reasons"] = gpu["nvlink"] = "not_supported"
    node.edit()
    graded = node.heartbeat()
    assert states(graded) == ["unknown"] * 4
    assert {r.code for gpu in graded.values() for r in gpu.reasons} == {"health_signals_not_supported"}
    assert len(node.tracker.schedulable_uuids()) == 4


def test_scenario_vanished_uuid_is_failed_missing(node: Node) -> None:
    node.heartbeat()
    node.document["gpus"].pop(2)
    node.edit()
    graded = node.heartbeat()
    assert states(graded) == ["healthy", "healthy", "failed", "healthy"]
    assert [(r.code, r.action) for r in graded[UUIDS[2]].reasons] == [("missing", "reboot")]


@pytest.mark.parametrize(
    ("value", "state", "action"),
    [
        (0, "healthy", None),
        (1, "unschedulable", "reset_gpu"),
        (2, "failed", "reboot"),
        (3, "degraded", "drain_p2p"),
        (4, "unschedulable", "drain_and_reset"),
        (7, "degraded", "unknown"),
    ],
)
def test_scenario_recovery_action(node: Node, value: int, state: str, action: str | None) -> None:
    node.set_field(0, "recovery_action", value)
    gpu = node.heartbeat()[UUIDS[0]]
    assert gpu.state == state
    assert [(r.action, r.value) for r in gpu.reasons] == ([] if action is None else [(action, value)])


def test_scenario_recheck_after_clear_brings_a_repaired_gpu_back_and_keeps_a_broken_one(node: Node) -> None:
    node.probe.register_xid_events()
    node.edit(xid_events=[{"uuid": UUIDS[0], "xid": 48}, {"uuid": UUIDS[1], "xid": 48}])
    node.deliver_xids()
    node.set_field(1, "remap_pending", True)  # GPU 1 also still needs its reset
    assert states(node.heartbeat()) == ["unschedulable", "unschedulable", "healthy", "healthy"]
    for index in (0, 1):  # the control plane cleared both after "repair"
        node.tracker.recheck(UUIDS[index], read_health_signals(node.probe, index), node.now)
    assert states(node.heartbeat()) == ["healthy", "unschedulable", "healthy", "healthy"]
    assert node.tracker.schedulable_uuids() == [UUIDS[0], UUIDS[2], UUIDS[3]]


def test_scenario_one_unschedulable_gpu_of_four_leaves_three_slots_and_clearing_gives_four(node: Node) -> None:
    node.set_field(2, "recovery_action", 1)
    node.heartbeat()
    assert len(node.tracker.schedulable_uuids()) == 3
    document = copy.deepcopy(node.document)
    document["gpus"][2]["fields"]["recovery_action"] = 0
    node.document = document
    node.edit()
    node.heartbeat()
    assert len(node.tracker.schedulable_uuids()) == 4
