"""Real processes for end-to-end tests: one way to start a long-running one (a control plane or
an agent) and stop it, one way to start `modelforge local up`, and one way to run a command to
its exit."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from tests.support.polling import wait_until

READY_RE = re.compile(r"ready at (https?://\S+) \(AWS emulator (http://\S+)\)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _parents() -> dict[int, int]:
    """Every process's parent, from ``/proc/PID/stat`` (processes gone meanwhile left out)."""
    parents: dict[int, int] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat_file.parent.name)] = int(stat_file.read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError):
            continue
    return parents


def descendants(pid: int) -> set[int]:
    """Every process descended from ``pid`` (children, their children, ...), not ``pid`` itself."""
    parents, found, grew = _parents(), {pid}, True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in found and child not in found:
                found.add(child)
                grew = True
    return found - {pid}


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class LoggedProcess:
    """A long-running process whose output goes to ``log_path`` (its stderr too, unless
    ``stderr_path`` keeps it apart). Use it as a context manager to stop it whatever happens."""

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        stderr_path: Path | None = None,
        append: bool = False,
    ) -> None:
        self.log_path = log_path
        self.stderr_path = stderr_path
        mode = "ab" if append else "wb"
        self._files: list[IO[bytes]] = [open(log_path, mode)]  # noqa: SIM115 - closed by stop()
        if stderr_path is not None:
            self._files.append(open(stderr_path, mode))  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            command,
            stdout=self._files[0],
            stderr=self._files[-1] if stderr_path is not None else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stderr_lines(self) -> list[str]:
        assert self.stderr_path is not None, "stderr goes to the log: read output()"
        return self.stderr_path.read_text(errors="replace").splitlines()

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float = 60) -> re.Match[str]:
        """The first match of ``pattern`` in the output; fails at once if the process exits first."""

        def found() -> re.Match[str] | None:
            exited = self.process.poll() is not None
            match = re.search(pattern, self.output())  # read after the exit check: nothing is missed
            if match is None and exited:
                raise AssertionError(f"no {pattern!r} in the output (exit {self.returncode}):\n{self.output()}")
            return match

        return wait_until(found, timeout, f"{pattern!r} in the output", interval=0.05, detail=self.output)

    def wait_exit(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout=timeout)
        self._close()
        return code

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Stop it with ``signum`` and return its exit status; killed (a negative status) after
        ``timeout`` s, so a cleanup never raises over the failure that led to it. The default
        leaves room for a loaded 2-core CI machine: `local up` with an agent and a worker stops
        each of them in turn (seconds when idle)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._close()
        return self.process.returncode

    def _close(self) -> None:
        for file in self._files:
            file.close()

    def __enter__(self) -> LoggedProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class RunningProcess(LoggedProcess):
    """A control-plane process that has printed its ready line: where it serves, and its emulator."""

    api_url: str
    emulator_url: str

    def __enter__(self) -> RunningProcess:
        return self


def start_process(
    log_path: Path,
    command: list[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    stderr_path: Path | None = None,
) -> RunningProcess:
    """Run a control-plane process and wait for its ready line (killed if it never comes)."""
    running = RunningProcess(command, log_path, env, stderr_path=stderr_path)
    try:
        match = running.wait_for(READY_RE, timeout)
    except BaseException:
        running.stop(signal.SIGKILL)
        raise
    running.api_url, running.emulator_url = match.group(1), match.group(2)
    return running


def cli_command(*args: str) -> list[str]:
    """The `modelforge` command line, run by this interpreter."""
    return [sys.executable, "-m", "modelforge_cli.cli", *args]


def local_up_command(*args: str, port: int | None = None) -> list[str]:
    return cli_command("local", "up", "--port", str(port or free_port()), *args)


def start_local_up(
    log_path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout: float = 60,
    stderr_path: Path | None = None,
) -> RunningProcess:
    """Run `modelforge local up` and wait for its ready line; ``with`` it to stop it at the end."""
    return start_process(
        log_path, local_up_command(*args, port=port), env=env, timeout=timeout, stderr_path=stderr_path
    )


def start_unserialised_local_up(log_path: Path, env: Mapping[str, str] | None = None) -> RunningProcess:
    """The local stack on an emulator without its request lock (``unserialised_local_up.py``), on a
    free port: the race tests' negative controls show their checks catch a non-atomic emulator."""
    script = Path(__file__).resolve().with_name("unserialised_local_up.py")
    repo = Path(__file__).resolve().parents[2]
    return start_process(
        log_path, [sys.executable, str(script), str(free_port())], env={**(env or {}), "PYTHONPATH": str(repo)}
    )


def run_to_exit(
    command: list[str],
    env: Mapping[str, str] | None = None,
    *,
    timeout: float = 60,
    cwd: Path | None = None,
    base_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its exit and capture its output as text. Its environment is
    ``base_env`` (this process's by default) with ``env`` on top."""
    full_env = {**(os.environ if base_env is None else base_env), **(env or {})}
    return subprocess.run(command, env=full_env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def wait_until_exec(pid: int, timeout: float = 10) -> None:
    """Until ``/proc/<pid>/cmdline`` shows the new program: ``Popen`` returns once the exec has
    begun, a moment before the kernel has set the new command line and environment up."""
    wait_until(lambda: Path(f"/proc/{pid}/cmdline").read_bytes(), timeout, f"pid {pid} to run its program")
