#!/usr/bin/env python
"""Local restart benchmark: how long `modelforge local up --data-dir` takes to be ready again, and
how much disk its data dir holds, after some minutes of dev-up-like traffic.

Run from the repository root:

    .venv/bin/python bench/local_restart.py [--minutes 10] [--checkout DIR]

It starts ``modelforge local up --port P --data-dir D --with-cpu-agent S`` as a subprocess on
127.0.0.1 (a fresh random ``MODELFORGE_ADMIN_TOKEN``, the liveness thresholds dev-up uses, the
sweep every 60 s): the control plane, its sweep and state log, and one CPU-mode node agent
heartbeating at the interval the control plane hands out (15 s), which is what ./scripts/dev-up
runs, less the runtime worker (which never touches the tables). It waits for the agent's node to be
online, lets it run for ``--minutes``, stops it with SIGTERM and starts it again on the same data
dir, port and agent state, and prints:

* the time to ready of the first start (empty data dir) and of the restart: from starting the
  process to its ``ready at`` line;
* the data dir's size (bytes and files) halfway and at the end of the traffic, and after the stop;
* the tracebacks each run printed (``Traceback (most recent call last)``);
* how long after the restart's ready line the node heartbeats again.

``--checkout DIR`` runs the code of another checkout of this repository (``git worktree add
/tmp/old HEAD``, say) with this interpreter: its source folders go first on ``PYTHONPATH`` for
every process. That is how the figures before a change are measured.

Both processes are stopped by PID whatever happens. It exits non-zero, with a
``bench/local_restart.py: FAILED: ...`` line on stderr, when a start fails, the agent never comes
online, or does not heartbeat after the restart.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import LOOPBACK, BenchFailure, Child, child_environment, start_child, stop_child, wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_RE = re.compile(r"ready at (https?://\S+) \(AWS emulator (http://\S+)\)")
TRACEBACK = "Traceback (most recent call last)"
#: the folders of a checkout that hold its packages, this layout's and the one before tools/ split
#: into tools/cli and tools/local_stack (a folder a checkout lacks is harmless on PYTHONPATH)
SOURCE_FOLDERS = ("tools/cli", "tools/local_stack", "tools", "functions", "protocol", "agent", "worker")
#: the `modelforge` command's module in a checkout, in either layout
CLI_FILES = ("tools/cli/modelforge_cli/cli.py", "tools/modelforge_cli/cli.py")
START_TIMEOUT = 600  # an old data dir after a long run can take minutes to replay
ONLINE_TIMEOUT = 120
STOP_TIMEOUT = 60
MAX_MINUTES = 24 * 60


@dataclass
class Run:
    """One `local up` process: its time to ready and what it printed."""

    ready_seconds: float
    tracebacks: int = 0
    stopped: str = ""


@dataclass
class Result:
    checkout: Path
    minutes: float
    first: Run
    restart: Run
    #: bytes and files in the data dir, sampled while the traffic ran and after the stop
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    bytes_after_stop: int = 0
    files_after_stop: int = 0
    heartbeats: int = 0
    #: seconds from the restart's ready line to the node's next heartbeat
    heartbeat_after_restart_seconds: float = 0.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def _size(folder: Path) -> tuple[int, int]:
    total = files = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                continue  # replaced while walking
    return total, files


#: Where the checkout defines local up's options (an older checkout has no --verbose).
LOCAL_UP_SOURCE = Path("tools/local_stack/modelforge_local_stack/local_up.py")


def _environment(checkout: Path, admin_token: str) -> dict[str, str]:
    return child_environment(
        {
            "MODELFORGE_ADMIN_TOKEN": admin_token,
            "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
            "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
            "MODELFORGE_LOG_LEVEL": "INFO",
            # the checkout's code first, for local up and for the agent it starts
            "PYTHONPATH": os.pathsep.join(str(checkout / folder) for folder in SOURCE_FOLDERS),
        }
    )


def _admin_get(api_url: str, admin_token: str, path: str) -> Any:
    import requests

    session = requests.Session()
    session.trust_env = False  # 127.0.0.1 only: no proxies
    response = session.get(api_url + path, headers={"X-ModelForge-Admin-Token": admin_token}, timeout=30)
    if response.status_code != 200:
        raise BenchFailure(f"GET {path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def _online_node(api_url: str, admin_token: str) -> dict[str, Any] | None:
    answer = _admin_get(api_url, admin_token, "/api/v1/admin/nodes")
    nodes = answer.get("nodes", answer) if isinstance(answer, dict) else answer
    return next((node for node in nodes if node.get("status") == "online" and node.get("last_heartbeat_at")), None)


def _start(
    name: str, checkout: Path, args: list[str], env: dict[str, str], log_path: Path, children: list[Child]
) -> tuple[Child, Run, str]:
    began = time.monotonic()
    child = start_child(
        name, [sys.executable, "-m", "modelforge_cli.cli", "local", "up", *args], env, checkout, log_path
    )
    children.append(child)

    def ready() -> re.Match[str] | None:
        return READY_RE.search(child.output())

    match = wait_for(ready, START_TIMEOUT, [child], f"{name}'s ready line", poll=0.02)
    run = Run(ready_seconds=time.monotonic() - began)
    _support.require_loopback(match.group(1), f"the {name}")
    return child, run, match.group(1)


def run_bench(minutes: float, checkout: Path, scratch: Path, echo: Callable[[str], None] = print) -> Result:
    children: list[Child] = []
    try:
        return _run(minutes, checkout, scratch, echo, children)
    finally:
        for child in children:
            if child.exited() is None:
                stop_child(child, STOP_TIMEOUT)


def _run(minutes: float, checkout: Path, scratch: Path, echo: Callable[[str], None], children: list[Child]) -> Result:
    admin_token = secrets.token_urlsafe(32)
    env = _environment(checkout, admin_token)
    data_dir, agent_state = scratch / "control-plane", scratch / "agent-state"
    args = [
        "--host",
        LOOPBACK,
        "--port",
        str(_free_port()),
        "--data-dir",
        str(data_dir),
        "--with-cpu-agent",
        str(agent_state),
    ]
    if "--verbose" in (checkout / LOCAL_UP_SOURCE).read_text():
        # the heartbeats are counted from access lines, routine lines kept at debug since issue 21
        args.append("--verbose")
    echo(f"checkout: {checkout}")
    echo(f"traffic: {minutes:g} min of one CPU agent heartbeating (15 s), the sweep (60 s) and the state log")

    first, first_run, api_url = _start("control plane", checkout, args, env, scratch / "first.log", children)
    echo(f"first start (empty data dir): ready in {first_run.ready_seconds:.2f} s")
    node = wait_for(
        lambda: _online_node(api_url, admin_token), ONLINE_TIMEOUT, [first], "the agent's node online", poll=0.2
    )
    samples: list[tuple[float, int, int]] = []
    began = time.monotonic()
    window = minutes * 60
    next_sample = min(window / 2, 60.0)
    while (elapsed := time.monotonic() - began) < window:
        if first.exited() is not None:
            raise BenchFailure(
                f"local up {_support.exit_description(first.exited() or 0)} during the traffic:\n{first.tail()}"
            )
        if elapsed >= next_sample:
            size, files = _size(data_dir)
            samples.append((elapsed, size, files))
            echo(f"  after {elapsed / 60:5.1f} min: data dir {size:>12,} bytes in {files} files")
            next_sample += min(window / 2, 60.0)
        time.sleep(min(1.0, max(0.05, window - elapsed)))
    size, files = _size(data_dir)
    samples.append((time.monotonic() - began, size, files))
    echo(f"  after {minutes:5.1f} min: data dir {size:>12,} bytes in {files} files")
    heartbeats = sum(1 for line in first.lines() if '"/api/v1/agent/heartbeat"' in line and '"http_request"' in line)
    first_run.stopped = stop_child(first, STOP_TIMEOUT)
    first_run.tracebacks = first.output().count(TRACEBACK)
    stopped_size, stopped_files = _size(data_dir)
    echo(
        f"stopped: {first_run.stopped}; data dir {stopped_size:,} bytes in {stopped_files} files;"
        f" {heartbeats} heartbeats served"
    )

    restart, restart_run, api_url = _start(
        "control plane (restart)", checkout, args, env, scratch / "restart.log", children
    )
    echo(f"restart: ready in {restart_run.ready_seconds:.2f} s")
    last = _admin_get(api_url, admin_token, f"/api/v1/admin/nodes/{node['node_id']}").get("last_heartbeat_at")
    ready_at = time.monotonic()
    wait_for(
        lambda: (
            _admin_get(api_url, admin_token, f"/api/v1/admin/nodes/{node['node_id']}").get("last_heartbeat_at") != last
        ),
        ONLINE_TIMEOUT,
        [restart],
        "the node's next heartbeat after the restart",
        poll=0.2,
    )
    heartbeat_after = time.monotonic() - ready_at
    restart_run.stopped = stop_child(restart, STOP_TIMEOUT)
    restart_run.tracebacks = restart.output().count(TRACEBACK)
    return Result(
        checkout=checkout,
        minutes=minutes,
        first=first_run,
        restart=restart_run,
        samples=samples,
        bytes_after_stop=stopped_size,
        files_after_stop=stopped_files,
        heartbeats=heartbeats,
        heartbeat_after_restart_seconds=heartbeat_after,
    )


def report(result: Result, echo: Callable[[str], None] = print) -> None:
    halfway = result.samples[len(result.samples) // 2 - 1] if len(result.samples) > 1 else result.samples[0]
    end = result.samples[-1]
    minutes_between = max((end[0] - halfway[0]) / 60, 1e-9)
    growth = (end[1] - halfway[1]) / minutes_between if end[0] > halfway[0] else 0.0
    echo("")
    echo(f"RESULT ({result.checkout}, {result.minutes:g} min of traffic, {result.heartbeats} heartbeats)")
    echo(f"  time to ready, first start (empty data dir): {result.first.ready_seconds:8.2f} s")
    echo(f"  time to ready, restart:                      {result.restart.ready_seconds:8.2f} s")
    echo(f"  data dir at the end of the traffic:          {end[1]:>12,} bytes in {end[2]} files")
    echo(f"  data dir growth over the second half:        {growth:>12,.0f} bytes per minute")
    echo(
        f"  data dir after the stop:                     {result.bytes_after_stop:>12,} bytes"
        f" in {result.files_after_stop} files"
    )
    echo(f"  tracebacks: first run {result.first.tracebacks}, restart {result.restart.tracebacks}")
    echo(f"  the node heartbeat again {result.heartbeat_after_restart_seconds:.2f} s after the restart's ready line")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--minutes", type=float, default=10.0, help=f"minutes of traffic before the restart (0..{MAX_MINUTES})"
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=REPO_ROOT,
        help="the checkout whose code runs (default: this one), e.g. a `git worktree add` of an older commit",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.minutes <= MAX_MINUTES:
        parser.error(f"--minutes must be between 0 and {MAX_MINUTES}")
    args.checkout = args.checkout.resolve()
    if not any((args.checkout / name).is_file() for name in CLI_FILES):
        parser.error(f"--checkout {args.checkout} is not a checkout of this repository")
    return args


def _run_in_scratch(args: argparse.Namespace) -> int:
    _support.install_sigterm_handler()
    with tempfile.TemporaryDirectory(prefix="modelforge-restart-bench-") as scratch:
        report(run_bench(args.minutes, args.checkout, Path(scratch)))
    return 0


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("local_restart.py", parse_args, _run_in_scratch, argv)


if __name__ == "__main__":
    sys.exit(main())
