"""A CPU-mode node agent, and a runtime worker for it, beside `modelforge local up`, for the quick start.

Each runs as its own process, exactly as on a node (`python -m modelforge_node_agent.main`,
`python -m modelforge_runtime_worker.main`): the agent enrolls once with a token minted over the
API and keeps its identity in a state folder; the worker listens on a unix socket in its folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

IDENTITY_FILE = "identity.json"


class DevAgentError(Exception):
    pass


def _mint(api_url: str, admin_token: str) -> str:
    response = requests.post(
        f"{api_url}/api/v1/admin/node-enrollments",
        json={"display_name": "local CPU agent", "expires_in_seconds": 300},
        headers={ADMIN_TOKEN_HEADER: admin_token},
        timeout=30,
    )
    if response.status_code != 201:
        raise DevAgentError(f"could not mint an enrollment token (HTTP {response.status_code})")
    return str(response.json()["token"])


#: How long the worker may take to load its models and listen.
WORKER_START_SECONDS = 60


def start_worker(worker_dir: Path) -> tuple[subprocess.Popen, str]:
    """Start the runtime worker on ``worker_dir/worker.sock`` and wait until it listens; the
    process and the URL the agent reaches it at."""
    worker_dir.mkdir(parents=True, exist_ok=True)
    socket_path = worker_dir / "worker.sock"
    url = f"unix://{socket_path}"
    env = {
        **os.environ,
        "MODELFORGE_WORKER_LISTEN": url,
        "MODELFORGE_WORKER_ARTIFACT_ROOT": str(worker_dir / "artifacts"),
        "MODELFORGE_WORKER_QUARANTINE_ROOT": str(worker_dir / "quarantine"),
    }
    process = subprocess.Popen([sys.executable, "-m", "modelforge_runtime_worker.main"], env=env, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + WORKER_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DevAgentError(f"the runtime worker exited with status {process.returncode} (its log is above)")
        if socket_path.is_socket():
            return process, url
        time.sleep(0.1)
    stop(process)
    raise DevAgentError(f"the runtime worker did not listen on {socket_path} within {WORKER_START_SECONDS} s")


def start(api_url: str, admin_token: str | None, state_dir: Path, worker_url: str | None = None) -> subprocess.Popen:
    """Start the agent (using the worker at ``worker_url``, when given); mint a token only when the
    state folder holds no identity yet."""
    env = {
        **os.environ,
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": api_url,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state_dir),
        "MODELFORGE_AGENT_HOSTNAME": os.environ.get("MODELFORGE_AGENT_HOSTNAME", "local-cpu-agent"),
    }
    env.pop("MODELFORGE_AGENT_ENROLLMENT_TOKEN", None)
    if worker_url is not None:
        env["MODELFORGE_AGENT_WORKER_URL"] = worker_url
    if not (state_dir / IDENTITY_FILE).exists():
        if not admin_token:
            raise DevAgentError("set MODELFORGE_ADMIN_TOKEN (not only its SHA-256) so a token can be minted for the agent")
        env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] = _mint(api_url, admin_token)
    return subprocess.Popen([sys.executable, "-m", "modelforge_node_agent.main"], env=env, stdin=subprocess.DEVNULL)


def stop(process: subprocess.Popen, timeout: float = 5) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
