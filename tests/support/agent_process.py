"""The node agent as a process: started and left running, or run to its exit, with one
environment builder for both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.processes import LoggedProcess, run_to_exit

AGENT_COMMAND = [sys.executable, "-m", "modelforge_node_agent.main"]


def agent_env(url: str, token: str, state: Path, **extra: str) -> dict[str, str]:
    """A CPU agent named gpu_node, heartbeating every 0.5 s; ``extra`` adds or overrides."""
    return {
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": url,
        "MODELFORGE_AGENT_ENROLLMENT_TOKEN": token,
        "MODELFORGE_AGENT_HOSTNAME": "gpu_node",
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
        "MODELFORGE_AGENT_STATE_VOLUME": str(state),
        "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": "0.5",
        **extra,
    }


def start_agent(log_path: Path, env: dict[str, str], command: list[str] | None = None) -> LoggedProcess:
    """A running agent (``command``, else the real entry point), its output appended to
    ``log_path``; ``with`` it, or ``stop()`` it, to end it."""
    return LoggedProcess(command or AGENT_COMMAND, log_path, env, append=True)


def run_agent(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The agent's entry point with ``args``, run to its exit."""
    return run_to_exit([*AGENT_COMMAND, *args], env, timeout=timeout)


def start_work_agent(
    tmp_path: Path, api_url: str, token: str, hostname: str, worker_url: str, **extra: str
) -> LoggedProcess:
    """A CPU agent named ``hostname``, enrolled with ``token``, that runs work on the worker at
    ``worker_url`` (its log and state under ``tmp_path``)."""
    env = agent_env(
        api_url,
        token,
        tmp_path / "agent-state",
        MODELFORGE_AGENT_HOSTNAME=hostname,
        MODELFORGE_AGENT_WORKER_URL=worker_url,
        **extra,
    )
    return start_agent(tmp_path / "agent.log", env)
