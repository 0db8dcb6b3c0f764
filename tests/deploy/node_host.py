"""A node for the tests of scripts/node-agent-start.sh and scripts/recreate-node-agent.sh: its own
folders (a state directory, TMPDIR, a working directory), the fake docker first on PATH, a .env,
and the places an enrollment token could leak to."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelforge_protocol.credentials import new_enrollment_token

from tests.support import fake_docker

ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "scripts" / "node-agent-start.sh"
RECREATE = ROOT / "scripts" / "recreate-node-agent.sh"
IMAGE_ID = "sha256:" + "ab" * 32
#: a bound for one script run: each starts a handful of short processes
RUN_TIMEOUT = 30


def new_token() -> str:
    return new_enrollment_token("enr_" + secrets.token_hex(16))


@dataclass
class NodeHost:
    root: Path

    def __post_init__(self) -> None:
        self.bin_dir = self.root / "bin"
        self.log_dir = self.root / "docker-log"  # the fake's record: it holds the token on purpose
        self.tmp_dir = self.root / "tmp"
        self.work_dir = self.root / "work"
        self.state_dir = self.root / "agent-state"
        for folder in (self.tmp_dir, self.work_dir, self.state_dir):
            folder.mkdir(parents=True)
        fake_docker.install(self.bin_dir, self.log_dir)

    def write_env_file(self, *extra_lines: str, state: bool = True) -> Path:
        """The node's .env: the seed's non-secret settings, plus ``extra_lines``."""
        lines = [
            "# the node's settings",
            "MODELFORGE_AGENT_CONTROL_PLANE_URL=https://cp.node-test.internal:8000",
            "MODELFORGE_AGENT_HOSTNAME=gpu_node",
            "MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia",
            "MODELFORGE_AGENT_TLS_VERIFY=true",
        ]
        if state:
            lines.append(f"MODELFORGE_AGENT_STATE_VOLUME={self.state_dir}")
        path = self.work_dir / ".env"
        path.write_text("\n".join([*lines, *extra_lines]) + "\n")
        return path

    def environment(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TMPDIR": str(self.tmp_dir),
            "HOME": str(self.root),
            "LC_ALL": "C",
            "FAKE_DOCKER_IMAGE_ID": IMAGE_ID,
            **extra,
        }

    def command(self, script: Path, args: tuple[str, ...], bash_flags: tuple[str, ...]) -> list[str]:
        return ["bash", *bash_flags, str(script), *args]

    def run(
        self, script: Path, *args: str, stdin: str = "", bash_flags: tuple[str, ...] = (), **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(script, args, bash_flags),
            input=stdin,
            capture_output=True,
            text=True,
            cwd=self.work_dir,
            env=self.environment(**env),
            timeout=RUN_TIMEOUT,
        )

    def start(self, script: Path, *args: str, **env: str) -> subprocess.Popen[str]:
        """The script running, its standard input a pipe (the token goes there)."""
        return subprocess.Popen(
            self.command(script, args, ()),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.work_dir,
            env=self.environment(**env),
        )

    def stop(self, process: subprocess.Popen[str], docker_pid: int) -> None:
        """After a test: the script and the fake docker it started, if either still runs (the
        script stops its docker itself; this is for a test that failed before it could)."""
        if process.poll() is None:
            process.kill()
            process.wait()
        if docker_pid and Path(f"/proc/{docker_pid}").exists():
            os.kill(docker_pid, signal.SIGKILL)

    def calls(self) -> list[dict[str, Any]]:
        log = self.log_dir / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def call(self, name: str) -> dict[str, Any]:
        matching = [call for call in self.calls() if call["name"] == name]
        assert len(matching) == 1, f"expected one {name} call, got {[call['name'] for call in self.calls()]}"
        return matching[0]

    def files_left(self) -> list[Path]:
        """Everything in the folders the scripts may write to (TMPDIR, the working directory)."""
        return sorted(path for folder in (self.tmp_dir, self.work_dir) for path in folder.rglob("*"))

    def leaks(self, secret: str, *outputs: str) -> list[str]:
        """Where ``secret`` shows, outside the env file given to Compose (where it belongs)."""
        found = [
            f"argv of docker {call['name']}" for call in self.calls() if any(secret in arg for arg in call["argv"])
        ]
        found += [
            f"environment of docker {call['name']}"
            for call in self.calls()
            if any(secret in value for value in call["env"].values())
        ]
        found += [str(path) for path in self.files_left() if path.is_file() and secret.encode() in path.read_bytes()]
        found += [f"output {number}" for number, output in enumerate(outputs) if secret in output]
        return found
