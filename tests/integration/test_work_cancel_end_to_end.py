"""Cancel reaches the job, with real processes: `modelforge local up`, the runtime worker and a
CPU-mode agent pointed at it (no push channel: the agent learns of the cancel at its next lease
renewal, a third of a 10 s lease). An admin submits `diagnostic.sleep` for 60 s and cancels it once
it is leased; the worker's job stops, and the worker is free, within 2 s of the renewal that was
answered 409 `work_cancelled`. Nothing is uploaded or failed, and the node runs the next item."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.agent_process import start_work_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import LoggedProcess, start_local_up
from tests.worker.worker_support import start_worker, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: The issue's bound: from the renewal's 409 to the worker's slot being free.
FREE_WITHIN_SECONDS = 2.0
LEASE_SECONDS = 10


def _events(process: LoggedProcess, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in process.output().splitlines() if f'"event": "{event}"' in line]


def _capabilities(cp: ControlPlane) -> set[str]:
    found = [node for node in cp.all_nodes() if node["hostname"] == "sleep-node"]
    return set((found[0].get("inventory") or {}).get("capabilities") or []) if found else set()


def test_cancelling_a_leased_sleep_stops_it_on_the_worker_within_2_s_of_the_renewal(tmp_path: Path) -> None:
    with start_local_up(tmp_path / "local-up.log", env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as control_plane:
        cp = ControlPlane(control_plane.api_url, ADMIN_TOKEN)
        root = tmp_path / "worker"
        root.mkdir()
        wenv = worker_env(root)
        worker = start_worker(tmp_path / "worker.log", wenv)
        token = cp.mint(display_name="sleep node")["token"]
        agent = start_work_agent(tmp_path, control_plane.api_url, token, "sleep-node", wenv["MODELFORGE_WORKER_LISTEN"])
        client = worker.client()
        try:
            wait_until(lambda: "diagnostic.sleep" in _capabilities(cp), 60, "the node to serve diagnostic.sleep")
            submitted = cp.submit_work("diagnostic.sleep", {"seconds": 60}, lease_seconds=LEASE_SECONDS)
            assert submitted.status_code == 201, submitted.text
            work_id = submitted.json()["work_id"]
            wait_until(lambda: client.status().body["busy"], 30, "the sleep to run on the worker", interval=0.05)
            assert cp.work(work_id)["status"] == "leased"

            cancelled = cp.admin("POST", f"/api/v1/admin/work/{work_id}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
            # the next renewal (within a third of the lease) answers 409; the worker is free soon after
            wait_until(
                lambda: not client.status().body["busy"],
                LEASE_SECONDS / 3 + FREE_WITHIN_SECONDS + 1,
                "the worker to be free",
                interval=0.05,
            )
            lost = wait_until(lambda: _events(agent, "work_lease_lost"), 5, "the agent's work_lease_lost")
            aborted = wait_until(lambda: _events(worker, "job_aborted"), 5, "the worker's job_aborted")
            assert lost[0]["work_id"] == work_id and lost[0]["code"] == "work_cancelled"
            assert aborted[0]["cancelled"] is True and aborted[0]["job_id"] == f"{work_id}:1"
            freed = aborted[0]["ts"] - lost[0]["ts"]
            assert 0 <= freed < FREE_WITHIN_SECONDS, freed
            print(f"renewal 409 -> worker free: {freed * 1000:.0f} ms")
            # the agent logs the worker's answer to its cancel once that answer is back
            stopped = wait_until(lambda: _events(agent, "work_job_cancelled"), 5, "the agent's work_job_cancelled")
            assert stopped[0]["state"] == "ended", agent.output()[-4000:]

            item = cp.work(work_id)
            assert item["status"] == "cancelled" and not item.get("result") and not item.get("errors"), item

            echo = cp.submit_work("diagnostic.echo", {"after": "cancel"}).json()
            done = wait_until(
                lambda: cp.work(echo["work_id"])["status"] == "succeeded", 60, "the next item to succeed", interval=0.2
            )
            assert done
        finally:
            agent.stop()
            worker.stop()
