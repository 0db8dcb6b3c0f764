"""A CPU-mode node agent, and a runtime worker for it, beside `modelforge local up`, for the quick start.

Each runs as its own process, exactly as on a node (`python -m modelforge_node_agent.main`,
`python -m modelforge_runtime_worker.main`): the agent enrolls once with a token minted over the
API and keeps its identity in a state folder; the worker listens on a unix socket in its folder.

``Supervisor`` watches both while the stack serves: when one exits it says why (the exit status's
meaning and the next step). When the agent's identity is refused because the control plane does
not know it (a reset or new data dir) or belongs to another one, it offers the one command that
moves the identity aside, and then enrolls the agent again with a new token; never while another
agent process runs on the state folder (that would take the identity from its node): then it names
that process. The processes themselves start in ``children`` (their environment, their folders).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests
from modelforge_node_agent import exit_codes
from modelforge_protocol import files
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

from . import children

IDENTITY_FILE = "identity.json"


class DevAgentError(Exception):
    pass


def _mint(api_url: str, admin_token: str, display_name: str = "local CPU agent") -> str:
    response = requests.post(
        f"{api_url}/api/v1/admin/node-enrollments",
        json={"display_name": display_name, "expires_in_seconds": 300},
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
    settings = {
        "MODELFORGE_WORKER_LISTEN": url,
        "MODELFORGE_WORKER_ARTIFACT_ROOT": str(worker_dir / "artifacts"),
        "MODELFORGE_WORKER_QUARANTINE_ROOT": str(worker_dir / "quarantine"),
    }
    process = children.start(children.WORKER, children.environment(children.WORKER, settings))
    deadline = time.monotonic() + WORKER_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DevAgentError(f"the runtime worker exited with status {process.returncode} (its log is above)")
        if socket_path.is_socket():
            return process, url
        time.sleep(0.1)
    stop(process)
    raise DevAgentError(f"the runtime worker did not listen on {socket_path} within {WORKER_START_SECONDS} s")


def simulation_files(state_dir: Path, gpus: int) -> tuple[Path, Path]:
    """Where `local up --simulated-gpus N` keeps its simulated node: its own state folder beside
    ``state_dir`` (never the CPU node's identity), and its scenario, copied from the agent's shipped
    one on first use and kept (edit it to inject a fault)."""
    from importlib import resources

    node_state = state_dir.with_name(f"{state_dir.name}-simulated-{gpus}-gpus")
    scenario = state_dir.with_name(f"simulated-{gpus}-gpus.json")
    if not scenario.exists():
        name = {4: "four_gpus.json", 8: "eight_gpus.json"}[gpus]
        shipped = resources.files("modelforge_node_agent").joinpath("simulations", name).read_bytes()
        scenario.parent.mkdir(parents=True, exist_ok=True)
        with files.create_new(scenario, mode=0o600) as out:
            out.write(shipped)
    return node_state, scenario


def start(
    api_url: str,
    admin_token: str | None,
    state_dir: Path,
    worker_url: str | None = None,
    simulation: Path | None = None,
) -> subprocess.Popen:
    """Start the agent (using the worker at ``worker_url``, when given; on the NVML simulation
    ``simulation``, when given); mint a token only when the state folder holds no identity yet."""
    env = children.environment(
        children.AGENT,
        {
            # a person reads this agent's log on the terminal of `local up`; json when asked for
            "MODELFORGE_AGENT_LOG_FORMAT": os.environ.get("MODELFORGE_AGENT_LOG_FORMAT") or "text",
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": api_url,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_STATE_VOLUME": str(state_dir),
            "MODELFORGE_AGENT_HOSTNAME": os.environ.get("MODELFORGE_AGENT_HOSTNAME", "local-cpu-agent"),
        },
    )
    env.pop("MODELFORGE_AGENT_ENROLLMENT_TOKEN", None)
    if simulation is not None:
        env.update(
            MODELFORGE_AGENT_ACCELERATOR_MODE="nvidia",
            MODELFORGE_AGENT_NVML_SIMULATION=str(simulation),
            MODELFORGE_AGENT_ALLOW_SIMULATION="true",
            MODELFORGE_AGENT_HOSTNAME=os.environ.get("MODELFORGE_AGENT_HOSTNAME", "local-simulated-gpu-node"),
        )
    if worker_url is not None:
        env["MODELFORGE_AGENT_WORKER_URL"] = worker_url
    if not (state_dir / IDENTITY_FILE).exists():
        if not admin_token:
            raise DevAgentError(
                "set MODELFORGE_ADMIN_TOKEN (not only its SHA-256) so a token can be minted for the agent"
            )
        name = "local simulated GPU node" if simulation is not None else "local CPU agent"
        env["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] = _mint(api_url, admin_token, name)
    return children.start(children.AGENT, env)


def stop(process: subprocess.Popen, timeout: float = 5) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


#: The agent's exit statuses (agent/README.md), and what to do next beside `local up`.
AGENT_EXITS: dict[int, tuple[str, str]] = {
    exit_codes.OK: (
        "it stopped cleanly",
        "something outside this process stopped it; restart local up to run it again",
    ),
    exit_codes.UNEXPECTED: (
        "an unexpected error",
        "its traceback is in the log above; restart local up, and report it if it happens again",
    ),
    exit_codes.CONFIGURATION_INVALID: (
        "its configuration is invalid",
        "the log above names each bad MODELFORGE_AGENT_* variable; fix them and restart local up",
    ),
    exit_codes.PREFLIGHT_FAILED: (
        "its NVIDIA preflight failed",
        "the CPU agent should not need NVML: check MODELFORGE_AGENT_ACCELERATOR_MODE, then restart local up",
    ),
    exit_codes.IDENTITY_REFUSED: (
        "its identity or credential was refused",
        "the log above says why; to enroll it again as a new node, move its identity aside",
    ),
    exit_codes.PROTOCOL_INCOMPATIBLE: (
        "the control plane refused its protocol version",
        "install the agent and the control plane from the same checkout (./scripts/dev-up does),"
        " see docs/COMPATIBILITY.md",
    ),
}


@dataclass(frozen=True)
class AgentExit:
    """Why the agent exited, in lines to print, and the identity file to move aside when moving
    it lets the supervisor enroll the agent again."""

    lines: list[str]
    identity_to_move: Path | None = None


def _identity(state_dir: Path) -> dict[str, object] | None:
    try:
        identity = json.loads((state_dir / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return identity if isinstance(identity, dict) else None


def _node_known(api_url: str, admin_token: str | None, node_id: str) -> bool | None:
    """Whether the control plane has ``node_id`` (None: cannot tell)."""
    if not admin_token:
        return None
    try:
        response = requests.get(
            f"{api_url}/api/v1/admin/nodes/{node_id}", headers={ADMIN_TOKEN_HEADER: admin_token}, timeout=10
        )
    except requests.RequestException:
        return None
    if response.status_code == 404:
        return False
    return True if response.status_code == 200 else None


def explain_exit(code: int, state_dir: Path, api_url: str, admin_token: str | None) -> AgentExit:
    """What the agent's exit status ``code`` means here, and what to do next."""
    if code < 0:
        return AgentExit([f"the CPU node agent was killed by signal {-code}; restart local up to run it again"])
    meaning, next_step = AGENT_EXITS.get(code, ("an exit status it does not document", "see its log above"))
    lines = [f"the CPU node agent exited with status {code}: {meaning}."]
    if code != exit_codes.IDENTITY_REFUSED:
        return AgentExit([*lines, f"next: {next_step}"])
    identity = _identity(state_dir)
    path = state_dir / IDENTITY_FILE
    if identity is None:
        return AgentExit([*lines, f"next: {next_step}"])
    others = children.running_in(state_dir, children.AGENT)
    if others:  # moving the identity would take it from the node of that agent
        return AgentExit(
            [
                *lines,
                f"Its identity in {path} is in use: {children.leftovers_message(state_dir, children.AGENT, others)}",
            ]
        )
    node_id, owner = identity.get("node_id"), identity.get("control_plane_url")
    if owner != api_url:
        port = urlsplit(str(owner)).port
        again = f" (--port {port})" if port else ""
        lines.append(
            f"Its identity in {path} belongs to the control plane at {owner}, not to this one ({api_url}): "
            f"serve on that address again{again}, or enroll the agent here as a new node."
        )
    elif isinstance(node_id, str) and _node_known(api_url, admin_token, node_id) is False:
        lines.append(
            f"This control plane does not know node {node_id}: its data was reset (a new or deleted --data-dir), "
            f"so the identity in {path} is of no use here."
        )
    else:
        lines.append(f"The log above says why; its identity is in {path}.")
    moved = path.with_name(f"{IDENTITY_FILE}.old")
    lines += [
        f"To enroll it again as a new node, run:  mv {shlex.quote(str(path))} {shlex.quote(str(moved))}",
        "(the control plane keeps serving; the agent is started again, with a new token,"
        " as soon as the identity is moved)",
    ]
    return AgentExit(lines, identity_to_move=path)


class Supervisor:
    """Watches the CPU agent and the runtime worker of `local up` (``check`` is called about twice
    a second): says once why either exited, and starts the agent again, enrolling it with a new
    token, once the identity it was refused for has been moved aside."""

    def __init__(
        self,
        api_url: str,
        admin_token: str | None,
        state_dir: Path | None,
        worker_url: str | None,
        agent: subprocess.Popen | None,
        worker: subprocess.Popen | None,
        say: Callable[[str], None],
        simulation: Path | None = None,
    ) -> None:
        self.api_url, self.admin_token, self.state_dir, self.worker_url = api_url, admin_token, state_dir, worker_url
        self.simulation = simulation
        self.agent, self.worker = agent, worker
        self._say = say
        self._identity_to_move: Path | None = None

    def check(self) -> None:
        if self.agent is not None and self.agent.poll() is not None:
            assert self.state_dir is not None
            code = self.agent.returncode
            self.agent = None
            explained = explain_exit(code, self.state_dir, self.api_url, self.admin_token)
            for line in explained.lines:
                self._say(line)
            self._identity_to_move = explained.identity_to_move
        elif self.agent is None and self._identity_to_move is not None and not os.path.lexists(self._identity_to_move):
            assert self.state_dir is not None
            self._identity_to_move = None
            try:
                self.agent = start(self.api_url, self.admin_token, self.state_dir, self.worker_url, self.simulation)
            except (DevAgentError, OSError) as error:
                self._say(f"cannot start the CPU agent again: {error}")
                return
            self._say(
                f"CPU node agent enrolling again with a new token (pid {self.agent.pid}, state in {self.state_dir})"
            )
        if self.worker is not None and self.worker.poll() is not None:
            code = self.worker.returncode
            self.worker = None
            self._say(
                f"the runtime worker {children.how_it_ended(code)}: the agent's work fails until it is back. "
                "Its log is above; restart local up to run it again"
            )

    def stop(self) -> None:
        for process in (self.agent, self.worker):
            if process is not None:
                stop(process)
