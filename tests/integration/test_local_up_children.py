"""The worker and agent beside `modelforge local up`, as real processes: they die with it (even
with SIGKILL), they get only their own settings (never the admin token), a process left running in
their folders is named instead of shared, and a second local up on the same folders is refused
before it could offer to move the first one's identity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ADMIN_TOKEN
from tests.support.polling import wait_until
from tests.support.processes import local_up_command, run_to_exit, start_local_up, wait_until_exec

ENV = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the worker's slot processes, below the worker)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *_descendants(child)]
    return found


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def test_local_ups_worker_and_agent_get_no_admin_token_and_die_when_it_is_killed(tmp_path: Path) -> None:
    args = ("--with-worker", str(tmp_path / "worker"), "--with-cpu-agent", str(tmp_path / "agent-state"))
    with start_local_up(tmp_path / "run.log", *args, env=ENV) as running:
        worker = int(running.wait_for(r"runtime worker started \(pid (\d+)", timeout=90).group(1))
        agent = int(running.wait_for(r"CPU node agent started \(pid (\d+)", timeout=60).group(1))
        running.wait_for(r"agent: runtime worker ok", timeout=90)  # the worker's slots have started
        assert _descendants(worker), "the worker's slot process should be running"
        for pid in (worker, agent, *_descendants(worker)):
            environ = _environ(pid)
            assert "MODELFORGE_ADMIN_TOKEN" not in environ and ADMIN_TOKEN not in str(environ), sorted(environ)
            assert not [name for name in environ if name.startswith("AWS_")], sorted(environ)
        assert _environ(worker)["MODELFORGE_WORKER_LISTEN"].endswith("worker.sock")
        assert _environ(agent)["MODELFORGE_AGENT_STATE_VOLUME"] == str((tmp_path / "agent-state").resolve())
        running.process.send_signal(signal.SIGKILL)
        running.process.wait(timeout=10)
        slots = _descendants(worker)
        wait_until(
            lambda: all(_gone(pid) for pid in (worker, agent, *slots)), 10, "the worker, its slots and the agent to die"
        )


def test_a_worker_left_running_in_the_folder_is_named_with_its_pid_and_how_to_stop_it(tmp_path: Path) -> None:
    folder = tmp_path / "worker"
    folder.mkdir()
    # what a worker of an earlier, killed local up looks like: its module on the command line, its
    # socket in the folder
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "modelforge_runtime_worker.main"],
        env={"MODELFORGE_WORKER_LISTEN": f"unix://{folder}/worker.sock"},
    )
    try:
        wait_until_exec(leftover.pid)
        done = run_to_exit(local_up_command("--with-worker", str(folder)), ENV, timeout=120)
    finally:
        leftover.kill()
        leftover.wait()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"a runtime worker not started by this local up still runs in {folder} (pid {leftover.pid})" in done.stderr
    assert f"kill {leftover.pid}" in done.stderr
    assert "ready at" not in done.stdout  # refused before anything started


def test_a_second_local_up_on_the_same_agent_folder_is_refused_naming_the_first_and_never_offers_to_move_its_identity(
    tmp_path: Path,
) -> None:
    agent_state = tmp_path / "agent-state"
    with start_local_up(tmp_path / "first.log", "--with-cpu-agent", str(agent_state), env=ENV) as first:
        first.wait_for(r"agent: enrolled as node_\w+", timeout=90)
        second = run_to_exit(
            local_up_command("--with-cpu-agent", str(agent_state), "--data-dir", str(tmp_path / "other")),
            ENV,
            timeout=120,
        )
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"is in use by another modelforge local up (pid {first.process.pid}" in second.stderr
        assert "mv " not in second.stdout + second.stderr
        assert (agent_state / "identity.json").is_file()
        assert "Traceback" not in first.output()


def test_a_ctrl_c_on_the_terminal_stops_local_up_and_its_children_in_turn_without_a_traceback(tmp_path: Path) -> None:
    """A terminal's Ctrl-C sends SIGINT to its whole foreground process group: it reaches local up
    alone (each child has its own group), and local up stops the children with SIGTERM."""
    log = tmp_path / "run.log"
    args = ("--with-worker", str(tmp_path / "worker"), "--with-cpu-agent", str(tmp_path / "agent-state"))
    with open(log, "wb") as out:
        process = subprocess.Popen(
            local_up_command(*args),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **ENV},
            start_new_session=True,  # the group a terminal's Ctrl-C is sent to
        )
        try:
            wait_until(lambda: "agent: heartbeating every" in log.read_text(), 120, "the agent's heartbeat")
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    output = log.read_text()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "agent: stopped" in output and "modelforge control plane stopped" in output
