"""Start and stop real `modelforge local up` processes for end-to-end tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

READY_RE = re.compile(r"ready at (https?://\S+) \(AWS emulator (http://\S+)\)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class RunningProcess:
    process: subprocess.Popen
    log_path: Path
    api_url: str
    emulator_url: str
    _log: IO[bytes]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def wait_for_line(log_path: Path, pattern: re.Pattern[str], process: subprocess.Popen, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = pattern.search(log_path.read_text(errors="replace"))
        if match:
            return match
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        time.sleep(0.05)
    raise TimeoutError(f"no line matching {pattern.pattern!r} within {timeout}s:\n{log_path.read_text(errors='replace')}")


def start_process(log_path: Path, command: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> RunningProcess:
    """Run a control-plane process and wait for its ready line."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log = open(log_path, "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=full_env, stdin=subprocess.DEVNULL)
    try:
        match = wait_for_line(log_path, READY_RE, process, timeout)
    except Exception:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
        raise
    return RunningProcess(process, log_path, match.group(1), match.group(2), log)


def local_up_command(*args: str, port: int | None = None) -> list[str]:
    return [sys.executable, "-m", "modelforge_cli.cli", "local", "up", "--port", str(port or free_port()), *args]


def start_local_up(
    log_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    timeout: float = 60,
) -> RunningProcess:
    """Run `modelforge local up` and wait for its ready line."""
    return start_process(log_path, local_up_command(*args, port=port), env=env, timeout=timeout)
