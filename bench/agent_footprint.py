#!/usr/bin/env python
"""Agent footprint benchmark: the memory and CPU one idle CPU-mode node agent uses while it heartbeats.

Run from the repository root:

    .venv/bin/python bench/agent_footprint.py [--heartbeats 60] [--interval 1]

It starts ``modelforge local up`` as a subprocess on a free port on 127.0.0.1 (with a fresh
random ``MODELFORGE_ADMIN_TOKEN``), mints an enrollment token over HTTP, starts ONE node agent
process (``python -m modelforge_node_agent.main``, ``MODELFORGE_AGENT_ACCELERATOR_MODE=cpu``,
``MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS=--interval``, state volume in a temporary
directory), waits until it has enrolled and sent its first heartbeat, and then, for
``--heartbeats`` intervals, samples the agent process once per interval from /proc:

* RSS (``VmRSS`` in /proc/PID/status) at the start, maximum and end of the window, in MB;
* CPU time (``utime + stime`` in /proc/PID/stat, over ``SC_CLK_TCK``), as % of one core over the
  window, split into the main thread (/proc/PID/task/PID/stat: it only waits for a stop signal)
  and the other threads (the publisher: the heartbeats), with CPU ms per heartbeat;
* the heartbeats the control plane recorded in the window (its JSON access log,
  ``event=http_request``, ``path=/api/v1/agent/heartbeat``, ``status=200``) and the agent's HTTP
  requests per heartbeat (every ``/api/v1/agent/*`` request in the window over those heartbeats);

and compares them with the spec's aims: under 40 MB RSS and under 1% of one core at the default
15 s heartbeat interval. A shorter ``--interval`` makes the agent heartbeat more often, so its
CPU% is that many times the default-interval figure (about 15x at 1 s); the figure extrapolated
to 15 s is printed next to the measured one.

This is a benchmark, not a test. Both processes are stopped by PID (SIGTERM, then SIGKILL after
a timeout) whatever happens. It exits non-zero, with a ``bench/agent_footprint.py: FAILED: ...``
line on stderr, when the control plane does not start, the agent exits early or never enrolls,
or the window holds no successful heartbeat or any failed agent request.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import (
    LOOPBACK,
    MAX_KEPT_LINES,
    BenchFailure,
    Child,
    child_environment,
    exit_description,
    start_child,
    stop_child,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT_PATH = "/api/v1/agent/heartbeat"
AGENT_PATH_PREFIX = "/api/v1/agent/"
READY_RE = re.compile(r"ready at (https?://\S+) \(AWS emulator (http://\S+)\)")

#: Bounds on the options, so a run stays bounded in count and time.
MAX_HEARTBEATS = 600
MIN_INTERVAL, MAX_INTERVAL = 0.2, 15.0
#: The agent's default heartbeat interval (the control plane's answer), and the spec's aims.
DEFAULT_INTERVAL_SECONDS = 15.0
AIM_RSS_MB = 40.0
AIM_CPU_PERCENT = 1.0
MB = 1_000_000  # decimal megabytes: the stricter reading of "40 MB" (VmRSS itself is in KiB)

CONTROL_PLANE_START_TIMEOUT = 60.0
ENROLL_TIMEOUT = 30.0  # from starting the agent to its "enrolled" log line
STOP_TIMEOUT_AGENT = 5.0  # the agent is specified to stop within 2 s of SIGTERM
STOP_TIMEOUT_CONTROL_PLANE = 10.0
REQUEST_TIMEOUT_SECONDS = 10
LOG_SETTLE_SECONDS = 0.5  # after the window, for the access-log lines of its last requests to arrive


# --- reading /proc -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic() when read
    rss_kib: int
    cpu_ticks: int  # utime + stime, the whole process
    main_ticks: int  # utime + stime of the main thread (TID = PID)


def read_rss_kib(pid: int, proc: Path = Path("/proc")) -> int:
    """``VmRSS`` of ``pid`` in KiB, from /proc/PID/status."""
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchFailure(f"/proc/{pid}/status has no VmRSS line (a zombie process?)")


def read_cpu_ticks(pid: int, tid: int | None = None, proc: Path = Path("/proc")) -> int:
    """``utime + stime`` in clock ticks of process ``pid`` (/proc/PID/stat), or of its thread ``tid``.

    The second field (the command name, in parentheses) may contain spaces and parentheses, so
    the fields are counted from after its last ``)``: there, utime and stime (fields 14 and 15
    of the whole line) are at positions 11 and 12.
    """
    path = proc / str(pid) / "stat" if tid is None else proc / str(pid) / "task" / str(tid) / "stat"
    text = path.read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def take_sample(pid: int) -> Sample:
    try:
        return Sample(
            at=time.monotonic(),
            rss_kib=read_rss_kib(pid),
            cpu_ticks=read_cpu_ticks(pid),
            main_ticks=read_cpu_ticks(pid, tid=pid),
        )
    except (FileNotFoundError, ProcessLookupError):
        raise BenchFailure(f"the agent process {pid} is gone from /proc") from None


# --- control-plane log ---------------------------------------------------------------------


def access_records(records: list[dict[str, Any]], since: float, until: float) -> list[dict[str, Any]]:
    """The control plane's ``http_request`` records for agent routes logged in (since, until]."""
    return [
        record
        for record in records
        if record.get("event") == "http_request"
        and str(record.get("path", "")).startswith(AGENT_PATH_PREFIX)
        and isinstance(record.get("ts"), (int, float))
        and since < record["ts"] <= until
    ]


def count_heartbeats(records: list[dict[str, Any]]) -> int:
    return sum(1 for record in records if record.get("path") == HEARTBEAT_PATH and record.get("status") == 200)


# --- the benchmark -------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--heartbeats",
        type=int,
        default=60,
        help=f"measured heartbeat intervals, one sample each (1..{MAX_HEARTBEATS})",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help=f"the agent's heartbeat interval and the sampling interval, seconds ({MIN_INTERVAL:g}..{MAX_INTERVAL:g})",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.heartbeats <= MAX_HEARTBEATS:
        parser.error(f"--heartbeats must be from 1 to {MAX_HEARTBEATS}")
    if not MIN_INTERVAL <= args.interval <= MAX_INTERVAL:  # also refuses nan
        parser.error(f"--interval must be from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}")
    return args


def _admin_client(base_url: str, token: str) -> Any:
    import requests
    from modelforge_cli.api_client import ControlPlane

    session = requests.Session()
    session.trust_env = False  # no proxies, no netrc: 127.0.0.1 only
    return ControlPlane(base_url, token, session=session, timeout=REQUEST_TIMEOUT_SECONDS)


def _mb(kib: int) -> float:
    return kib * 1024 / MB


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def run(args: argparse.Namespace, children: list[Child], scratch: Path) -> int:
    from modelforge_node_agent import AGENT_VERSION

    ticks_per_second = os.sysconf("SC_CLK_TCK")
    problems: list[str] = []
    wall_started = time.monotonic()
    print(
        f"ModelForge agent footprint benchmark: 1 CPU-mode agent, {args.heartbeats} heartbeats"
        f" at {args.interval:g} s (window about {args.heartbeats * args.interval:g} s)"
    )
    print(
        f"host: {os.cpu_count()} logical CPUs, Linux {platform.release()}, Python {platform.python_version()},"
        f" agent {AGENT_VERSION}, SC_CLK_TCK {ticks_per_second}"
    )
    control_plane, api_url, admin_token = _start_control_plane(children)
    agent, first_beat_ts = _start_agent(args, children, scratch, control_plane, api_url, admin_token)
    samples, window_start_wall, window_end_wall = _measure(args, agent, control_plane, first_beat_ts)
    time.sleep(LOG_SETTLE_SECONDS)
    in_window = access_records(control_plane.records(), window_start_wall, window_end_wall)
    figures = _figures(args, samples, ticks_per_second, in_window, agent)

    print()
    _print_rss(agent, samples, figures)
    print()
    _print_cpu(args, agent, figures, ticks_per_second)
    print()
    _print_requests(args, figures, control_plane, problems)
    print()
    _print_aims(args, figures)

    if figures.heartbeats == 0:
        problems.append("the control plane recorded no successful heartbeat in the measured window")
    if figures.failed:
        problems.append(f"agent requests in the window that were not 200: {', '.join(sorted(figures.failed))}")

    # stop: the agent first (its clean stop is part of its contract), then the control plane
    print()
    print(f"agent stopped: {stop_child(agent, STOP_TIMEOUT_AGENT)}")
    print(f"control plane stopped: {stop_child(control_plane, STOP_TIMEOUT_CONTROL_PLANE)}")
    print(f"total wall time {time.monotonic() - wall_started:.1f} s")
    if problems:
        for problem in problems:
            print(f"bench/agent_footprint.py: FAILED: {problem}", file=sys.stderr)
        return 1
    return 0


def _start_control_plane(children: list[Child]) -> tuple[Child, str, str]:
    """``modelforge local up`` on a free loopback port: the child, its API URL and its admin token."""
    admin_token = secrets.token_urlsafe(32)
    control_plane = start_child(
        "control plane",
        # --verbose: the access lines this check reads are routine lines, kept at debug otherwise
        [sys.executable, "-m", "modelforge_cli.cli", "local", "up", "--host", LOOPBACK, "--port", "0", "--verbose"],
        child_environment(
            {
                "MODELFORGE_ADMIN_TOKEN": admin_token,
                "MODELFORGE_LOG_LEVEL": "INFO",
                "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
                "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
            }
        ),
        REPO_ROOT,
    )
    children.append(control_plane)

    def ready() -> re.Match[str] | None:
        return next(filter(None, map(READY_RE.search, control_plane.lines())), None)

    match = wait_for(ready, CONTROL_PLANE_START_TIMEOUT, [control_plane], "control-plane ready line")
    api_url, emulator_url = match.group(1), match.group(2)
    _support.require_loopback(api_url, "the control plane")
    _support.require_loopback(emulator_url, "the AWS emulator")
    print(f"control plane: PID {control_plane.pid}, API {api_url}")
    return control_plane, api_url, admin_token


def _start_agent(
    args: argparse.Namespace,
    children: list[Child],
    scratch: Path,
    control_plane: Child,
    api_url: str,
    admin_token: str,
) -> tuple[Child, float]:
    """One CPU-mode agent, enrolled with a freshly minted token: the child, and when the control
    plane recorded its first heartbeat."""
    client = _admin_client(api_url, admin_token)
    minted = client.admin(
        "POST",
        "/api/v1/admin/node-enrollments",
        json={"display_name": "agent footprint bench", "expires_in_seconds": 900},
    )
    if minted.status_code != 201:
        raise BenchFailure(f"minting an enrollment token answered {minted.status_code}: {minted.text[:300]}")
    enrollment_token = minted.json()["token"]

    state_volume = scratch / "agent-state"
    agent_started = time.monotonic()
    agent = _support.start_cpu_agent(
        api_url, enrollment_token, args.interval, state_volume, "bench-agent-footprint", scratch
    )
    children.append(agent)
    both = [agent, control_plane]

    def enrolled() -> dict[str, Any] | None:
        return _support.enrolled_record(agent)

    node_id = str(wait_for(enrolled, ENROLL_TIMEOUT, both, "'enrolled' log line from the agent")["node_id"])
    enrolled_after = time.monotonic() - agent_started

    def first_heartbeat() -> float | None:
        beats = [
            r["ts"]
            for r in access_records(control_plane.records(), 0, float("inf"))
            if r.get("path") == HEARTBEAT_PATH and r.get("status") == 200
        ]
        return min(beats) if beats else None

    first_beat_ts = wait_for(
        first_heartbeat, ENROLL_TIMEOUT + args.interval, both, "first heartbeat (200) from the agent"
    )
    node = client.admin("GET", f"/api/v1/admin/nodes/{node_id}")
    if node.status_code != 200:
        raise BenchFailure(f"reading node {node_id} answered {node.status_code}: {node.text[:300]}")
    client.session.close()
    print(
        f"agent: PID {agent.pid}, enrolled as {node_id} {enrolled_after:.1f} s after start,"
        f" node status {node.json().get('status')!r}"
    )
    return agent, first_beat_ts


def _measure(
    args: argparse.Namespace, agent: Child, control_plane: Child, first_beat_ts: float
) -> tuple[list[Sample], float, float]:
    """The measured window: one sample per interval, and the window's wall-clock start and end.

    It starts half an interval after a heartbeat, so that each of its intervals holds one
    heartbeat (unless the agent's schedule drifts by half an interval)."""
    start_at = first_beat_ts + args.interval / 2
    while start_at <= time.time():
        start_at += args.interval
    time.sleep(max(0.0, start_at - time.time()))
    print(f"measuring {args.heartbeats} intervals of {args.interval:g} s ...", flush=True)
    window_start_wall = time.time()
    samples = [take_sample(agent.pid)]
    for index in range(1, args.heartbeats + 1):
        time.sleep(max(0.0, samples[0].at + index * args.interval - time.monotonic()))
        code = agent.exited()
        if code is not None:
            raise BenchFailure(
                f"the agent (PID {agent.pid}) {exit_description(code)} during the measured window"
                f" (after {index - 1} of {args.heartbeats} intervals); its last output:\n{agent.tail()}"
            )
        if control_plane.exited() is not None:
            raise BenchFailure(
                f"the control plane {exit_description(control_plane.exited())} during the measured window;"
                f" its last output:\n{control_plane.tail()}"
            )
        samples.append(take_sample(agent.pid))
    window_end_wall = window_start_wall + (samples[-1].at - samples[0].at)
    return samples, window_start_wall, window_end_wall


@dataclass(frozen=True)
class _Figures:
    """What the measured window shows: CPU (whole process, main thread, other threads), RSS, and
    the agent's requests the control plane logged in it."""

    window: float
    cpu_seconds: float
    cpu_percent: float
    main_seconds: float
    main_percent: float
    other_seconds: float
    other_percent: float
    scaled_cpu_percent: float  # all of it scaled with the heartbeat rate
    estimated_cpu_percent: float  # only the heartbeat work scaled
    rss_max: int
    in_window: list[dict[str, Any]]
    heartbeats: int
    requests_by_route: dict[str, int]
    failed: dict[str, int]
    agent_warnings: dict[str, int]


def _figures(
    args: argparse.Namespace,
    samples: list[Sample],
    ticks_per_second: int,
    in_window: list[dict[str, Any]],
    agent: Child,
) -> _Figures:
    first, last = samples[0], samples[-1]
    window = last.at - first.at
    cpu_seconds = (last.cpu_ticks - first.cpu_ticks) / ticks_per_second
    cpu_percent = 100 * cpu_seconds / window
    # the main thread only waits for a stop signal (waking every 0.25 s): time-driven, whatever the
    # interval; the other threads (the publisher) do the heartbeats: work per heartbeat
    main_seconds = (last.main_ticks - first.main_ticks) / ticks_per_second
    main_percent = 100 * main_seconds / window
    other_seconds = cpu_seconds - main_seconds
    other_percent = 100 * other_seconds / window
    requests_by_route: dict[str, int] = {}
    failed: dict[str, int] = {}
    for record in in_window:
        route = f"{record.get('method', '?')} {record.get('path')}"
        requests_by_route[route] = requests_by_route.get(route, 0) + 1
        if record.get("status") != 200:
            key = f"{route} -> {record.get('status')}"
            failed[key] = failed.get(key, 0) + 1
    scale = args.interval / DEFAULT_INTERVAL_SECONDS
    agent_warnings: dict[str, int] = {}
    for record in agent.records():
        if record.get("level") in ("warning", "error", "critical"):
            event = str(record.get("event", record.get("message", "?")))
            agent_warnings[event] = agent_warnings.get(event, 0) + 1
    return _Figures(
        window=window,
        cpu_seconds=cpu_seconds,
        cpu_percent=cpu_percent,
        main_seconds=main_seconds,
        main_percent=main_percent,
        other_seconds=other_seconds,
        other_percent=other_percent,
        scaled_cpu_percent=cpu_percent * scale,
        estimated_cpu_percent=main_percent + other_percent * scale,
        rss_max=max(sample.rss_kib for sample in samples),
        in_window=in_window,
        heartbeats=count_heartbeats(in_window),
        requests_by_route=requests_by_route,
        failed=failed,
        agent_warnings=agent_warnings,
    )


def _print_rss(agent: Child, samples: list[Sample], figures: _Figures) -> None:
    first, last = samples[0], samples[-1]
    print(f"[1] Agent RSS (VmRSS from /proc/{agent.pid}/status), MB = 10^6 bytes, {len(samples)} samples")
    print(f"    start {_mb(first.rss_kib):6.1f}   max {_mb(figures.rss_max):6.1f}   end {_mb(last.rss_kib):6.1f}")
    print(f"    growth over the window: {_mb(last.rss_kib - first.rss_kib):+.2f} MB")


def _print_cpu(args: argparse.Namespace, agent: Child, figures: _Figures, ticks_per_second: int) -> None:
    f = figures
    print(f"[2] Agent CPU (utime + stime from /proc/{agent.pid}/stat) over the measured window of {f.window:.2f} s")
    print(f"    resolution: one clock tick = {100 / ticks_per_second / f.window:.3f}% of one core over the window")
    print(
        f"    whole process:  {f.cpu_seconds * 1000:5.0f} ms = {f.cpu_percent:.3f}% of one core"
        f" at a {args.interval:g} s heartbeat interval"
    )
    per_heartbeat = f", {f.other_seconds * 1000 / f.heartbeats:.1f} ms per heartbeat" if f.heartbeats else ""
    for label, seconds, percent, what in (
        ("main thread:  ", f.main_seconds, f.main_percent, "waits for SIGTERM, wakes every 0.25 s"),
        ("other threads:", f.other_seconds, f.other_percent, f"the publisher{per_heartbeat}"),
    ):
        print(f"      {label} {seconds * 1000:5.0f} ms = {percent:.3f}%  ({what})")
    if args.interval != DEFAULT_INTERVAL_SECONDS:
        factor = DEFAULT_INTERVAL_SECONDS / args.interval
        for line in (
            f"NOTE: at a {args.interval:g} s interval the agent heartbeats {factor:g}x as often as at the default"
            f" {DEFAULT_INTERVAL_SECONDS:g} s, so",
            f"the CPU% above is ~{factor:g}x the default-interval figure (the heartbeat work scales with the rate;"
            " the main",
            "thread's wake-ups do not). Extrapolated to the default 15 s interval:",
            f"  {f.scaled_cpu_percent:.3f}% of one core, everything divided by {factor:g};",
            f"  {f.estimated_cpu_percent:.3f}% of one core, the main thread as measured + the other threads divided"
            f" by {factor:g} (the better estimate).",
        ):
            print("    " + line)


def _print_requests(args: argparse.Namespace, figures: _Figures, control_plane: Child, problems: list[str]) -> None:
    heartbeats, in_window = figures.heartbeats, figures.in_window
    print("[3] Agent requests the control plane recorded in the window (its JSON access log, http_request records)")
    print(f"    heartbeats (POST {HEARTBEAT_PATH}, status 200): {heartbeats} (one per interval: {args.heartbeats})")
    beat_times = sorted(r["ts"] for r in in_window if r.get("path") == HEARTBEAT_PATH and r.get("status") == 200)
    if len(beat_times) >= 2:
        period = (beat_times[-1] - beat_times[0]) / (len(beat_times) - 1)
        print(
            f"    mean time between heartbeats: {period:.3f} s (the interval plus the request: the agent waits"
            " after each answer)"
        )
    total_requests = sum(figures.requests_by_route.values())
    routes = ", ".join(f"{route} x{count}" for route, count in sorted(figures.requests_by_route.items())) or "none"
    print(f"    all {AGENT_PATH_PREFIX}* requests: {total_requests} ({routes})")
    if heartbeats:
        print(f"    HTTP requests per heartbeat: {total_requests / heartbeats:.2f}")
    if figures.failed:
        print(f"    not 200: {', '.join(f'{key} x{count}' for key, count in sorted(figures.failed.items()))}")
    if control_plane.dropped:
        dropped = control_plane.dropped
        problems.append(f"{dropped} control-plane log lines past the first {MAX_KEPT_LINES} were not kept or counted")
    warnings = ", ".join(f"{event} x{count}" for event, count in sorted(figures.agent_warnings.items())) or "none"
    print(f"    warnings/errors in the agent's own log (whole run): {warnings}")


def _print_aims(args: argparse.Namespace, figures: _Figures) -> None:
    cpu_percent, estimated_cpu_percent, rss_max = figures.cpu_percent, figures.estimated_cpu_percent, figures.rss_max
    print("[4] Aims (spec): under 40 MB RSS, and under 1% of one core at the default 15 s interval")
    rss_met = _mb(rss_max) < AIM_RSS_MB
    print(f"    RSS max {_mb(rss_max):.1f} MB ({rss_max / 1024:.1f} MiB) < {AIM_RSS_MB:g} MB: {_verdict(rss_met)}")
    if args.interval == DEFAULT_INTERVAL_SECONDS:
        cpu_verdict = f"measured {cpu_percent:.3f}% at 15 s: {_verdict(cpu_percent < AIM_CPU_PERCENT)}"
    elif cpu_percent < AIM_CPU_PERCENT:  # measured at a faster rate: an upper bound for 15 s
        cpu_verdict = (
            f"measured {cpu_percent:.3f}% at {args.interval:g} s (an upper bound), estimated"
            f" {estimated_cpu_percent:.3f}% at 15 s: met"
        )
    else:
        cpu_verdict = (
            f"estimated {estimated_cpu_percent:.3f}% at 15 s: {_verdict(estimated_cpu_percent < AIM_CPU_PERCENT)}"
            f" on the estimate only (measured {cpu_percent:.3f}% at {args.interval:g} s; --interval 15 measures it)"
        )
    print(f"    CPU < {AIM_CPU_PERCENT:g}% of one core: {cpu_verdict}")


def _run_in_scratch(args: argparse.Namespace) -> int:
    if not Path("/proc/self/stat").exists():
        raise BenchFailure("needs Linux /proc to sample the agent")
    _support.install_sigterm_handler()
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="mf-agent-footprint-") as scratch:
        try:
            return run(args, children, Path(scratch))
        finally:
            # whatever happened: the agent first, then the control plane, each by its PID
            for child in reversed(children):  # started control plane, then agent
                timeout = STOP_TIMEOUT_AGENT if child.name == "agent" else STOP_TIMEOUT_CONTROL_PLANE
                if child.exited() is None:
                    how = stop_child(child, timeout)
                    print(f"stopping the {child.name} (PID {child.pid}): {how}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("agent_footprint.py", parse_args, _run_in_scratch, argv)


if __name__ == "__main__":
    sys.exit(main())
