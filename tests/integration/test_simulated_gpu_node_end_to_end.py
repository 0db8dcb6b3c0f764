"""A simulated 4-GPU node with real processes: `modelforge local up --allow-simulated-nodes`, the
runtime worker (CPU device, one slot process per GPU UUID), and an agent on the scripted NVML fake
(`MODELFORGE_AGENT_NVML_SIMULATION`). An Xid 48 injected into the scenario makes one GPU
unschedulable: the node then runs at most 3 jobs at once. `modelforge nodes clear-gpu` makes the
agent re-check the (repaired) GPU, and the node runs 4 again."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.admin_cli import modelforge
from tests.support.agent_process import start_work_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import start_local_up
from tests.worker.worker_support import start_worker, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

HOSTNAME = "simulated-4-gpu-node"
SLEEP_SECONDS = 4.0


def _scenario(path: Path) -> dict[str, Any]:
    shipped = resources.files("modelforge_node_agent").joinpath("simulations/four_gpus.json").read_text()
    document: dict[str, Any] = json.loads(shipped)
    path.write_text(json.dumps(document))
    return document


def _node(cp: ControlPlane) -> dict[str, Any] | None:
    found = [node for node in cp.all_nodes() if node["hostname"] == HOSTNAME]
    return cp.node(found[0]["node_id"]) if found else None


def _running(cp: ControlPlane, work_ids: list[str]) -> int:
    return sum(1 for work_id in work_ids if cp.work(work_id)["status"] == "leased")


def _most_at_once(cp: ControlPlane, jobs: int) -> int:
    """Submit ``jobs`` sleeps, watch how many run at once until all succeeded; the most seen."""
    work_ids = []
    for _ in range(jobs):
        submitted = cp.submit_work("diagnostic.sleep", {"seconds": SLEEP_SECONDS})
        assert submitted.status_code == 201, submitted.text
        work_ids.append(submitted.json()["work_id"])
    most = 0

    def finished() -> bool:
        nonlocal most
        most = max(most, _running(cp, work_ids))
        return all(cp.work(work_id)["status"] == "succeeded" for work_id in work_ids)

    wait_until(finished, 180, "every sleep to succeed", interval=0.2)
    return most


def test_one_unschedulable_gpu_leaves_three_slots_and_clearing_it_brings_back_four(tmp_path: Path) -> None:
    scenario_path = tmp_path / "scenario.json"
    scenario = _scenario(scenario_path)
    uuids = [gpu["uuid"] for gpu in scenario["gpus"]]
    with start_local_up(
        tmp_path / "local-up.log", "--allow-simulated-nodes", env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    ) as control_plane:
        cp = ControlPlane(control_plane.api_url, ADMIN_TOKEN)
        root = tmp_path / "worker"
        root.mkdir()
        wenv = worker_env(root, MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS="60")
        worker = start_worker(tmp_path / "worker.log", wenv, timeout=120)
        token = cp.mint(display_name="simulated node")["token"]
        agent = start_work_agent(
            tmp_path,
            control_plane.api_url,
            token,
            HOSTNAME,
            wenv["MODELFORGE_WORKER_LISTEN"],
            MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
            MODELFORGE_AGENT_NVML_SIMULATION=str(scenario_path),
            MODELFORGE_AGENT_ALLOW_SIMULATION="true",
        )
        try:
            wait_until(
                lambda: (
                    (node := _node(cp)) is not None
                    and "diagnostic.sleep" in (node.get("inventory") or {}).get("capabilities", [])
                    and [gpu["reported"] for gpu in node["gpu_health"]] == [True] * 4
                ),
                90,
                "the simulated node to serve and report its four GPUs",
                detail=agent.output,
            )
            node = _node(cp)
            assert node is not None and node["simulated"] is True and node["inventory"]["simulated"] is True
            assert node["slots"] == {"total": 4, "busy": 0, "schedulable": 4}

            # an Xid 48 on the third GPU: the agent's event thread sees it, the control plane latches it
            scenario["xid_events"] = [{"uuid": uuids[2], "xid": 48}]
            scenario_path.write_text(json.dumps(scenario))
            wait_until(
                lambda: {gpu["uuid"]: gpu for gpu in (_node(cp) or {})["gpu_health"]}[uuids[2]]["latched"],
                30,
                "the Xid 48 to be latched",
                detail=agent.output,
            )
            faulted = {gpu["uuid"]: gpu for gpu in (_node(cp) or {})["gpu_health"]}[uuids[2]]
            assert faulted["state"] == "unschedulable" and faulted["reasons"][0]["xid"] == 48
            wait_until(lambda: (_node(cp) or {})["slots"]["schedulable"] == 3, 15, "three schedulable slots")
            assert _most_at_once(cp, 8) == 3

            # repaired: the Xid is gone from the scenario (a real reset clears the condition)
            scenario["xid_events"] = []
            scenario_path.write_text(json.dumps(scenario))
            node_id = str((_node(cp) or {})["node_id"])
            cleared = modelforge(cp, "nodes", "clear-gpu", node_id, uuids[2])
            assert cleared.returncode == 0, cleared.stderr
            wait_until(
                lambda: (
                    (_node(cp) or {})["slots"]["schedulable"] == 4
                    and all(gpu["schedulable"] for gpu in (_node(cp) or {})["gpu_health"])
                ),
                30,
                "the re-checked GPU to take work again",
                detail=agent.output,
            )
            assert _most_at_once(cp, 8) == 4
            gpu_slots = worker.client().status().body["slots"]["gpus"]
            assert sorted(slot["uuid"] for slot in gpu_slots) == sorted(uuids)  # each job ran in its GPU's slot
        finally:
            agent.stop()
            worker.stop()
