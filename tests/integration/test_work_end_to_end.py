"""The whole loop with real processes: `modelforge local up`, the runtime worker and a CPU-mode
agent pointed at it; an admin submits OCR work of a rendered PNG and gets the text back. Then a
tampered model file: after a worker restart it is in quarantine, the node stops offering `ocr`,
and the API and readiness say why."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import ADMIN_TOKEN
from tests.support.agent_process import start_work_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import start_local_up
from tests.worker.worker_support import b64, squash, start_worker, text_png, worker_env

TEXT = "MODELFORGE 2026"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _work_done(cp: ControlPlane, work_id: str, timeout: float) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        item = cp.work(work_id)
        return item if item["status"] in ("succeeded", "dead", "cancelled") else None

    return wait_until(finished, timeout, f"work {work_id} to finish", interval=0.5)


def _node(cp: ControlPlane) -> dict[str, Any]:
    """The agent's node ({} until it has enrolled)."""
    found = [node for node in cp.all_nodes() if node["hostname"] == "ocr-node"]
    assert len(found) <= 1, found
    return found[0] if found else {}


def _capabilities(cp: ControlPlane) -> set[str]:
    return set((_node(cp).get("inventory") or {}).get("capabilities") or [])


def test_ocr_work_runs_on_a_real_worker_and_a_tampered_model_is_quarantined(tmp_path: Path) -> None:
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    with start_local_up(tmp_path / "local-up.log", env=env) as control_plane:
        cp = ControlPlane(control_plane.api_url, ADMIN_TOKEN)
        worker_root = tmp_path / "worker"
        worker_root.mkdir()
        wenv = worker_env(worker_root)
        worker = start_worker(tmp_path / "worker.log", wenv)
        token = cp.mint(display_name="ocr node")["token"]
        agent = start_work_agent(tmp_path, control_plane.api_url, token, "ocr-node", wenv["MODELFORGE_WORKER_LISTEN"])
        try:
            # the node advertises what its worker serves
            wait_until(
                lambda: {"ocr", "diagnostic.echo"} <= _capabilities(cp),
                60,
                "the node to advertise its worker's capabilities",
                interval=0.5,
            )
            image = text_png([TEXT])
            submitted = cp.submit_work("ocr", {"image_base64": b64(image)})
            assert submitted.status_code == 201, submitted.text
            done = _work_done(cp, submitted.json()["work_id"], 120)
            assert done["status"] == "succeeded", done
            fetched = requests.get(done["result"]["url"], timeout=30, allow_redirects=False)
            assert fetched.status_code == 200
            assert hashlib.sha256(fetched.content).hexdigest() == done["result"]["sha256"]
            assert len(fetched.content) == done["result"]["size"]
            result = json.loads(fetched.content)
            assert squash(TEXT) in squash(" ".join(line["text"] for line in result["lines"])), result
            assert result["device"] == "cpu" and len(result["model_sha256"]) == 64
            assert done["node_id"] == _node(cp)["node_id"] and done["attempts"] == 1

            # an image the control plane accepts (PNG signature) but nobody can decode: the worker
            # refuses it and the work ends dead at once with the reason, not retried
            broken = cp.submit_work("ocr", {"image_base64": b64(b"\x89PNG\r\n\x1a\n" + b"not really a png")}).json()
            refused = _work_done(cp, broken["work_id"], 60)
            assert refused["status"] == "dead" and refused["attempts"] == 1, refused
            (error,) = refused["errors"]
            assert error["retryable"] is False and "image" in error["reason"].lower(), error

            # tamper with a model file, restart the worker: quarantined, and ocr is not offered
            assert worker.stop(signal.SIGTERM) == 0
            model = sorted((worker_root / "artifacts").rglob("*rec*.onnx"))[0]
            model.write_bytes(model.read_bytes()[:-16] + b"\0" * 16)
            worker = start_worker(tmp_path / "worker-2.log", wenv)
            quarantined = list((worker_root / "quarantine").rglob("*.onnx"))
            assert [path.name for path in quarantined] == [model.name] and not model.exists()
            quarantine = {"name": "ocr", "reason": "artifact_quarantined"}

            def says_quarantined() -> bool:
                worker_health = (_node(cp).get("health") or {}).get("worker") or {}
                return quarantine in (worker_health.get("unavailable") or []) and "ocr" not in _capabilities(cp)

            wait_until(says_quarantined, 60, "the node to report ocr quarantined and stop offering it", interval=0.5)
            node = _node(cp)
            assert node["health"]["status"] == "degraded"
            readiness = cp.admin("GET", f"/api/v1/admin/nodes/{node['node_id']}/readiness").json()
            check = next(check for check in readiness["checks"] if check["name"] == "worker")
            assert check["ok"] is False and "artifact_quarantined" in check["detail"]

            # ocr work waits in the queue; the node still runs what it can
            waiting = cp.submit_work("ocr", {"image_base64": b64(image)}).json()
            echo = cp.submit_work("diagnostic.echo", {"still": "working"}).json()
            echoed = _work_done(cp, echo["work_id"], 60)
            assert echoed["status"] == "succeeded"
            time.sleep(2)  # a few more heartbeats and claims: none may take the ocr item
            assert cp.work(waiting["work_id"])["status"] == "queued"
        finally:
            agent.stop()
            worker.stop()
