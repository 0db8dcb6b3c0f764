"""The real agent (its HTTP client, its push channel, its work loop) against the in-process local
stack, whose channel server runs the control plane's own WebSocket handlers, with a fake runtime
worker. The agent's heartbeat interval is an hour, so only the channel can make it claim: a submit
reaches the idle node at once, and a cancel reaches the running job.

Runs once the local stack serves the channel (``modelforge_local_stack.channel_server``)."""

from __future__ import annotations

import importlib.util
import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from modelforge_node_agent import channel
from modelforge_node_agent.agent import Agent
from modelforge_node_agent.config import load_config
from modelforge_node_agent.control_plane import ControlPlaneClient
from modelforge_node_agent.gpu_source import NoGpus
from modelforge_node_agent.identity import StateVolume
from modelforge_node_agent.transport import base_url, build_session
from modelforge_node_agent.work import for_config

from tests.agent import fake_worker as workers
from tests.agent.fake_worker import ECHO, echo_run, fake_worker, status_answer
from tests.support.api import ControlPlane
from tests.support.polling import wait_until

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("modelforge_local_stack.channel_server") is None,
    reason="the local stack does not serve the push channel on this branch yet",
)

SLEEP = {**ECHO, "name": "diagnostic.sleep"}


@contextmanager
def running_agent(cp: ControlPlane, tmp_path: Path, worker_url: str) -> Iterator[Agent]:
    config = load_config(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": cp.base_url,
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": cp.mint(display_name="channel agent")["token"],
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_VOLUME": str(tmp_path / "state"),
            "MODELFORGE_AGENT_HOSTNAME": "channel_agent",
            "MODELFORGE_AGENT_WORKER_URL": worker_url,
            "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "3600",  # no heartbeat hint in these tests
        }
    )
    state = StateVolume(config.state_volume)
    state.prepare()
    client = ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    stop = threading.Event()
    agent = Agent(
        config,
        client,
        state,
        NoGpus(),
        stop=stop,
        clock=time.monotonic,
        jitter=random.random,
        work=for_config(config),
        channel=channel.for_config(config),
    )
    publisher = threading.Thread(target=agent.run, daemon=True)
    publisher.start()
    try:
        yield agent
    finally:
        stop.set()
        publisher.join(5)


def _node_id(tmp_path: Path) -> str:
    identity = StateVolume(tmp_path / "state").load()
    assert identity is not None and identity.node_id is not None
    return identity.node_id


def _parked(caplog: pytest.LogCaptureFixture) -> bool:
    """The work loop's claim on connecting found nothing: the control plane parked the node."""
    return any(record.__dict__.get("event") == "work_drained" for record in caplog.records)


def _drain_queue(cp: ControlPlane, capability: str) -> None:
    """Items earlier tests left queued on the shared stack would be claimed first."""
    node = cp.worker_node(("cpu", capability))
    while cp.claim(node).status_code == 200:
        pass


def test_agent_channel_on_the_stack_a_submit_reaches_the_idle_node_at_once(
    cp: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "modelforge.agent")
    _drain_queue(cp, "diagnostic.echo")
    with fake_worker(status_answer(ECHO), echo_run) as worker, running_agent(cp, tmp_path, worker.url):
        wait_until(lambda: _parked(caplog), 20, "the agent to connect, claim once and park")
        assert cp.node(_node_id(tmp_path))["channel"] == "connected"
        submitted = cp.submit_work("diagnostic.echo", {"text": "over the channel"})
        assert submitted.status_code in (200, 201, 202), submitted.text
        work_id = submitted.json()["work_id"]
        started = time.monotonic()
        wait_until(lambda: cp.work(work_id)["status"] == "succeeded", 10, "the item to succeed", interval=0.02)
        assert time.monotonic() - started < 5  # an hour's heartbeat interval: only the wake can explain it


def test_agent_channel_on_the_stack_a_cancel_reaches_the_running_job(
    cp: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "modelforge.agent")
    if not hasattr(workers, "CancellableRuns"):
        pytest.skip("the work loop's cancel (WorkRunner.renew_now) is not on this branch yet")
    _drain_queue(cp, "diagnostic.sleep")
    runs = workers.CancellableRuns()
    status: dict[str, Any] = status_answer(SLEEP, features=["cancel"])
    with (
        fake_worker(status, runs.run, cancel=runs.cancel) as worker,
        running_agent(cp, tmp_path, worker.url) as agent,
    ):
        try:
            wait_until(lambda: _parked(caplog), 20, "the agent to connect, claim once and park")
            submitted = cp.submit_work("diagnostic.sleep", {"seconds": 60})
            work_id = submitted.json()["work_id"]
            wait_until(lambda: cp.work(work_id)["status"] == "leased", 10, "the sleep to be claimed", interval=0.02)
            wait_until(lambda: worker.runs, 10, "the run to start on the worker")
            cancelled = cp.admin("POST", f"/api/v1/admin/work/{work_id}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            started = time.monotonic()
            wait_until(lambda: runs.cancelled, 5, "the worker's job to be cancelled", interval=0.02)
            assert time.monotonic() - started < 2  # not the renewal a third of the lease later
            assert agent is not None
        finally:
            runs.release()
