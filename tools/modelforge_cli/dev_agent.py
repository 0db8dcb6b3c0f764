"""A CPU-mode node agent beside `modelforge local up`, for the quick start.

The agent runs as its own process, exactly as on a node (`python -m modelforge_node_agent.main`),
enrolling once with a token minted over the API and keeping its identity in a state folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def start(api_url: str, admin_token: str | None, state_dir: Path) -> subprocess.Popen:
    """Start the agent; mint a token only when the state folder holds no identity yet."""
    env = {
        **os.environ,
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": api_url,
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state_dir),
        "MODELFORGE_AGENT_HOSTNAME": os.environ.get("MODELFORGE_AGENT_HOSTNAME", "local-cpu-agent"),
    }
    env.pop("MODELFORGE_AGENT_ENROLLMENT_TOKEN", None)
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
