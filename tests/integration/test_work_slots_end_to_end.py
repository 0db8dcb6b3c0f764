"""Two slots on one node, with real processes: `modelforge local up`, the runtime worker with
`MODELFORGE_WORKER_SLOTS=2` and a CPU-mode agent pointed at it. A hostile progressive JPEG (built
by the test: a 187 KB file that takes Pillow about half a minute to decode) is submitted as `ocr`;
it fails within the worker's deadline plus 5 s with a clear, non-retryable reason (the decoder's
time cap), and meanwhile a `diagnostic.echo` item submitted to the same node succeeds within 2 s on
the other slot."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.agent_process import start_work_agent
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import start_local_up
from tests.worker.test_decoder import hostile_progressive_jpeg
from tests.worker.worker_support import start_worker, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB_TIMEOUT_SECONDS = 12
DECODE_TIMEOUT_SECONDS = 4


def _capabilities(cp: ControlPlane) -> set[str]:
    found = [node for node in cp.all_nodes() if node["hostname"] == "two-slot-node"]
    return set((found[0].get("inventory") or {}).get("capabilities") or []) if found else set()


def test_a_hostile_image_fails_at_the_cap_while_an_echo_succeeds_on_the_other_slot(tmp_path: Path) -> None:
    hostile = base64.b64encode(hostile_progressive_jpeg()).decode()
    with start_local_up(tmp_path / "local-up.log", env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as control_plane:
        cp = ControlPlane(control_plane.api_url, ADMIN_TOKEN)
        root = tmp_path / "worker"
        root.mkdir()
        wenv = worker_env(
            root,
            MODELFORGE_WORKER_SLOTS="2",
            MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS=str(JOB_TIMEOUT_SECONDS),
            MODELFORGE_WORKER_DECODE_TIMEOUT_SECONDS=str(DECODE_TIMEOUT_SECONDS),
        )
        worker = start_worker(tmp_path / "worker.log", wenv, timeout=120)
        token = cp.mint(display_name="two-slot node")["token"]
        agent = start_work_agent(
            tmp_path, control_plane.api_url, token, "two-slot-node", wenv["MODELFORGE_WORKER_LISTEN"]
        )
        client = worker.client()
        try:
            wait_until(lambda: {"ocr", "diagnostic.echo"} <= _capabilities(cp), 60, "the node to serve ocr and echo")
            submitted = cp.submit_work("ocr", {"image_base64": hostile}, max_attempts=3)
            assert submitted.status_code == 201, submitted.text
            ocr_id = submitted.json()["work_id"]
            wait_until(lambda: client.status().body["slots"]["busy"] == 1, 30, "the OCR job to run", interval=0.05)
            leased_at = time.monotonic()

            echo_began = time.monotonic()
            echo = cp.submit_work("diagnostic.echo", {"while": "the other slot decodes"})
            assert echo.status_code == 201, echo.text
            echo_id = echo.json()["work_id"]
            wait_until(lambda: cp.work(echo_id)["status"] == "succeeded", 10, "the echo to succeed", interval=0.05)
            echo_took = time.monotonic() - echo_began
            assert echo_took < 2.0, echo_took
            assert cp.work(ocr_id)["status"] == "leased"  # still decoding on the first slot

            wait_until(
                lambda: cp.work(ocr_id)["status"] == "dead",
                JOB_TIMEOUT_SECONDS + 5,
                "the OCR item to fail for good",
                interval=0.1,
            )
            assert time.monotonic() - leased_at < JOB_TIMEOUT_SECONDS + 5
            item = cp.work(ocr_id)
            (error,) = item["errors"]  # not retried: the input is at fault, not the node
            assert f"took longer than {DECODE_TIMEOUT_SECONDS} s to decode" in error["reason"], item
            print(f"echo on the other slot: {echo_took * 1000:.0f} ms")
        finally:
            agent.stop()
            worker.stop()
