"""``gpu_report``: every per-GPU signal with each NVML call's latency, and its grade (gpu-check.sh
prints it on a real GPU); here on the scripted NVML fake."""

from __future__ import annotations

import json
from pathlib import Path

from modelforge_node_agent import gpu_report
from modelforge_node_agent.nvml_simulation import ScriptedProbe

from tests.agent.test_gpu_watch import T0
from tests.agent.test_nvml_simulation import UUIDS, four_gpus


def test_each_gpu_gets_every_signal_timed_and_graded(tmp_path: Path) -> None:
    scenario = four_gpus()
    scenario["gpus"][1]["fields"]["remap_pending"] = True
    scenario["gpus"][2]["fields"] = {key: "not_supported" for key in scenario["gpus"][2]["fields"]}
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    probe = ScriptedProbe(path)
    probe.init()
    found = gpu_report.report(probe, probe.devices(), T0)
    assert [gpu["uuid"] for gpu in found["gpus"]] == UUIDS
    for gpu in found["gpus"]:
        assert set(gpu["calls"]) == {"telemetry", "health_fields", "clock_events", "nvlink_states", "mig_enabled"}
        assert all(call["ms"] >= 0 and "value" in call for call in gpu["calls"].values())
    states = [gpu["grade"]["state"] for gpu in found["gpus"]]
    assert states == ["healthy", "unschedulable", "healthy", "healthy"]
    assert found["gpus"][2]["calls"]["health_fields"]["value"]["ecc_uncorrected_volatile"] == "unsupported"
    assert "value" in found["xid_events"]["register_xid_events"]
    text = gpu_report.as_text(found)
    assert f"GPU 1 {UUIDS[1]}" in text and "unschedulable" in text and " ms " in text
    json.dumps(found)  # JSON-ready


def test_without_nvml_it_exits_3_like_the_preflight(capsys) -> None:  # type: ignore[no-untyped-def]
    assert gpu_report.main([]) == 3
    assert "NVIDIA_NVML_UNAVAILABLE" in capsys.readouterr().err
