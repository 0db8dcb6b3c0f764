#!/usr/bin/env python
"""Disconnection check: a frozen agent's heartbeat genuinely stops, and the control plane says so.

Run from the repository root:

    .venv/bin/python bench/disconnect_check.py [--seconds 100] [--stale-after 90] [--offline-after 300] [--interval 45]

The defaults are the deployed ones (a heartbeat every 45 s, stale after 90 s, offline after 300 s):
frozen for the release check's 100 s, the node must read ``stale`` from 90 s on and the sweep must
persist it. Short thresholds (``--stale-after 3 --offline-after 6 --interval 1``) see both
transitions in seconds.

The spec's release check: "A disconnected agent stops publishing and the control plane says so
rather than assuming the node is fine -- verified by disconnecting a disposable agent for 100
seconds and confirming its heartbeat genuinely stopped advancing."

It starts ``modelforge local up`` as a subprocess on a free port on 127.0.0.1 (a fresh random
``MODELFORGE_ADMIN_TOKEN``, ``MODELFORGE_NODE_STALE_AFTER_SECONDS=--stale-after``,
``MODELFORGE_NODE_OFFLINE_AFTER_SECONDS=--offline-after``, the sweep every second), mints an
enrollment token, starts one disposable CPU-mode node agent (``python -m
modelforge_node_agent.main``, ``MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS=--interval``, its state
volume in a temporary directory), waits until the node is ``online`` with its heartbeat advancing,
and then DISCONNECTS the agent for ``--seconds`` by freezing its process with SIGSTOP right after
one of its heartbeats was recorded: a frozen process sends nothing, so from the control plane's
side it is a node that went silent, with no goodbye. During the window it reads
``GET /api/v1/admin/nodes/{id}`` every second and checks that:

* ``last_heartbeat_at`` never moves from the value recorded before the freeze;
* the status is what the thresholds say for the heartbeat's age: ``online``, then ``stale`` from
  ``--stale-after``, then ``offline`` from ``--offline-after`` (each is required when a reading
  falls clearly inside its range; the window may be too short for one, which is then reported);
* the agent's threads stay stopped (Linux /proc), the control plane logs no request from the
  agent, and the S3 state log holds no heartbeat while frozen, and the sweep's persisted
  ``stale``/``offline`` transitions, when the window is long enough for them, come no earlier
  than the thresholds.

Then it resumes the agent (SIGCONT) and checks that the heartbeat advances again and the node is
back ``online``. It prints a timeline and a PASS/FAIL verdict and exits 0 on PASS, 1 otherwise.
Whatever happens (failure, Ctrl-C, SIGTERM) the agent is resumed and both processes are stopped
by their PIDs (SIGTERM, then SIGKILL after a timeout).

Importable: ``run_check(seconds, stale_after, offline_after, interval, log_dir)`` returns a
``CheckResult`` (``tests/agent/test_disconnect_check.py`` runs it for 8 seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from modelforge_bench import support as _support
from modelforge_bench.support import (
    LOOPBACK,
    BenchFailure,
    Child,
    child_environment,
    exit_description,
    start_child,
    stop_child,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_RE = re.compile(r"ready at (https?://\S+) \(AWS emulator (http://\S+)\)")
AGENT_PATH_PREFIX = "/api/v1/agent/"
HEARTBEAT_PATH = "/api/v1/agent/heartbeat"
STATE_LOG_BUCKET = "modelforge-state-log"  # `local up`'s default (its resource prefix is "modelforge")
ONLINE, STALE, OFFLINE = "online", "stale", "offline"
LIVENESS_ORDER = (ONLINE, STALE, OFFLINE)

#: Bounds on the options, so a run stays bounded in time.
MIN_SECONDS, MAX_SECONDS = 1.0, 600.0
MIN_STALE_AFTER = 2  # the control plane's own interval (an integer, at least 1) must be below it
MAX_OFFLINE_AFTER = 3600
MIN_INTERVAL = 0.5  # leaves ample time to freeze the agent between two of its heartbeats

POLL_SECONDS = 1.0  # reads of the node during the window
SWEEP_INTERVAL_SECONDS = 1  # MODELFORGE_SWEEP_INTERVAL_SECONDS of the control plane
#: A reading within this many seconds of a threshold may show either neighbouring status. The
#: heartbeat time and the reading's time come from the same clock and the request is bracketed,
#: so this only has to cover milliseconds; it is generous on purpose.
STATUS_TOLERANCE = 0.5
#: The sweep's persisted transition is required only when the window lasts this long past a
#: threshold plus one sweep interval (the end-to-end liveness test allows 0.75 s).
PERSIST_MARGIN = 3.0

CONTROL_PLANE_START_TIMEOUT = 60.0
ENROLL_TIMEOUT = 30.0  # from starting the agent to its "enrolled" log line
ONLINE_TIMEOUT = 30.0  # from enrolling to online with the heartbeat advancing
FREEZE_CONFIRM_TIMEOUT = 2.0  # for every thread of the agent to show state T after SIGSTOP
RESUME_TIMEOUT = 30.0  # plus 2 intervals: from SIGCONT to two new heartbeats and online (a reconnect backs off 1 s)
STATE_LOG_TIMEOUT = 10.0  # for the state log to hold the transition back to online
STOP_TIMEOUT_AGENT = 5.0  # the agent is specified to stop within 2 s of SIGTERM
STOP_TIMEOUT_CONTROL_PLANE = 10.0
REQUEST_TIMEOUT_SECONDS = 5.0


class CheckFailure(BenchFailure):
    """Something the check depends on did not work; the verdict is FAIL."""


# --- results -------------------------------------------------------------------------------


@dataclass
class Sample:
    """One reading of the node while the agent was frozen."""

    elapsed: float  # seconds since SIGSTOP, when the request was sent
    status: str | None
    last_heartbeat_at: str | None
    age_low: float | None  # the heartbeat's age when the request was sent ...
    age_high: float | None  # ... and when its answer arrived
    allowed: tuple[str, ...]  # the statuses the thresholds allow at that age (with the tolerance)
    agent_frozen: bool | None  # every agent thread in state T; None when /proc cannot tell
    liveness_hold: Any = None
    error: str | None = None


@dataclass
class CheckResult:
    seconds: float
    stale_after: int
    offline_after: int
    interval: float
    log_dir: Path
    passed: bool = False
    problems: list[str] = field(default_factory=list)
    node_id: str | None = None
    #: last_heartbeat_at as recorded just before the freeze, and every value read while frozen
    heartbeat_before_freeze: str | None = None
    heartbeat_values_while_disconnected: list[str] = field(default_factory=list)
    heartbeat_advanced_while_disconnected: bool | None = None
    heartbeat_age_at_end: float | None = None  # of the pre-freeze heartbeat, at the last reading
    agent_frozen_throughout: bool | None = None  # None when /proc could not tell
    #: statuses read while frozen, in the order first seen, and when (seconds since SIGSTOP)
    statuses_seen: list[str] = field(default_factory=list)
    first_seen_at: dict[str, float] = field(default_factory=dict)
    stale_expected: bool = False
    offline_expected: bool = False
    samples: list[Sample] = field(default_factory=list)
    #: agent requests the control plane logged between the last heartbeat before the freeze and SIGCONT
    agent_requests_while_disconnected: int | None = None
    #: node.liveness_changed events of the S3 state log: (from, to, cause, seconds since SIGSTOP)
    persisted_transitions: list[tuple[str, str, str, float]] = field(default_factory=list)
    resumed: bool = False
    resumed_after_seconds: float | None = None  # from SIGCONT to the first new heartbeat's server time
    heartbeat_after_resume: str | None = None
    status_after_resume: str | None = None
    stopped: dict[str, str] = field(default_factory=dict)  # how each process ended
    timeline: list[str] = field(default_factory=list)


# --- processes -----------------------------------------------------------------------------


def thread_states(pid: int) -> dict[int, str] | None:
    """The scheduler state letter of every thread of ``pid`` (/proc/PID/task/*/stat); None without /proc."""
    task_dir = Path("/proc") / str(pid) / "task"
    if not task_dir.is_dir():
        return None
    states: dict[int, str] = {}
    for entry in task_dir.iterdir():
        try:
            text = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        states[int(entry.name)] = text[text.rindex(")") + 2 :].split()[0]
    return states


def all_stopped(pid: int) -> bool | None:
    states = thread_states(pid)
    if states is None:
        return None
    return bool(states) and all(state == "T" for state in states.values())


# --- reading the control plane -------------------------------------------------------------


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()  # Python 3.11 reads the trailing Z


def derive(age: float, stale_after: float, offline_after: float) -> str:
    """The status the control plane must report for a heartbeat this old (chalicelib.domain.liveness)."""
    if age < stale_after:
        return ONLINE
    if age < offline_after:
        return STALE
    return OFFLINE


def allowed_statuses(age_low: float, age_high: float, stale_after: float, offline_after: float) -> tuple[str, ...]:
    """Every status from the youngest to the oldest the reading may have seen, with the tolerance."""
    first = LIVENESS_ORDER.index(derive(age_low - STATUS_TOLERANCE, stale_after, offline_after))
    last = LIVENESS_ORDER.index(derive(age_high + STATUS_TOLERANCE, stale_after, offline_after))
    return LIVENESS_ORDER[first : last + 1]


class Admin:
    """The admin API over a session that never uses a proxy (127.0.0.1 only)."""

    def __init__(self, base_url: str, token: str) -> None:
        import requests
        from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER

        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.headers[ADMIN_TOKEN_HEADER] = token

    def mint(self, display_name: str) -> dict[str, Any]:
        answer = self.session.post(
            f"{self.base_url}/api/v1/admin/node-enrollments",
            json={"display_name": display_name, "expires_in_seconds": 900},
            timeout=REQUEST_TIMEOUT_SECONDS,
        )
        if answer.status_code != 201:
            raise CheckFailure(f"minting an enrollment token answered {answer.status_code}: {answer.text[:300]}")
        return answer.json()

    def node(self, node_id: str) -> dict[str, Any]:
        answer = self.session.get(f"{self.base_url}/api/v1/admin/nodes/{node_id}", timeout=REQUEST_TIMEOUT_SECONDS)
        if answer.status_code != 200:
            raise CheckFailure(f"GET /api/v1/admin/nodes/{node_id} answered {answer.status_code}: {answer.text[:300]}")
        return answer.json()

    def close(self) -> None:
        self.session.close()


def state_log_transitions(emulator_url: str, node_id: str) -> list[dict[str, Any]]:
    """The node's ``node.liveness_changed`` events in the S3 state log, oldest first."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=emulator_url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(proxies={}, retries={"max_attempts": 2}, connect_timeout=5, read_timeout=10),
    )
    events = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=STATE_LOG_BUCKET, Prefix="events/"):
        for entry in page.get("Contents", []):
            event = json.loads(s3.get_object(Bucket=STATE_LOG_BUCKET, Key=entry["Key"])["Body"].read())
            subject = event.get("subject") or {}
            if event.get("type") == "node.liveness_changed" and subject.get("node_id") == node_id:
                events.append(event)
    return sorted(events, key=lambda event: event["occurred_at"])


# --- the check -----------------------------------------------------------------------------


def validate(seconds: float, stale_after: int, offline_after: int, interval: float) -> None:
    problems = []
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:  # also refuses nan
        problems.append(f"seconds must be from {MIN_SECONDS:g} to {MAX_SECONDS:g}")
    if isinstance(stale_after, bool) or not isinstance(stale_after, int) or stale_after < MIN_STALE_AFTER:
        problems.append(f"stale-after must be an integer of at least {MIN_STALE_AFTER} (seconds)")
    elif isinstance(offline_after, bool) or not isinstance(offline_after, int) or not stale_after < offline_after:
        problems.append("offline-after must be an integer greater than stale-after (seconds)")
    elif offline_after > MAX_OFFLINE_AFTER:
        problems.append(f"offline-after must be at most {MAX_OFFLINE_AFTER}")
    if not (isinstance(stale_after, int) and MIN_INTERVAL <= interval < stale_after):
        problems.append(f"interval must be at least {MIN_INTERVAL:g} and below stale-after (seconds)")
    if problems:
        raise ValueError("; ".join(problems))


class _FrozenFlag:
    """Whether the agent is (or may be) stopped, for the clean-up to resume it."""

    value = False


def run_check(
    seconds: float,
    stale_after: int,
    offline_after: int,
    interval: float,
    log_dir: Path | str,
    echo: Callable[[str], None] | None = None,
) -> CheckResult:
    """Run the whole check once; print the timeline through ``echo`` (default: stdout) and return the result.

    Raises ValueError for out-of-range parameters. KeyboardInterrupt (and any exception that is
    not a failure of the check) propagates, after the agent was resumed and both processes stopped.
    """
    validate(seconds, stale_after, offline_after, interval)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    result = CheckResult(seconds, stale_after, offline_after, interval, log_dir)
    started = time.monotonic()

    def say(line: str, stamp: bool = True) -> None:
        text = f"[{time.monotonic() - started:6.1f} s] {line}" if stamp else line
        result.timeline.append(text)
        (echo or (lambda text: print(text, flush=True)))(text)

    say(
        f"ModelForge disconnect check: freeze a CPU agent for {seconds:g} s (stale after {stale_after} s,"
        f" offline after {offline_after} s, agent heartbeat every {interval:g} s, sweep every"
        f" {SWEEP_INTERVAL_SECONDS} s)",
        stamp=False,
    )
    say(f"logs: {log_dir}", stamp=False)
    children: dict[str, Child] = {}
    frozen = _FrozenFlag()
    with tempfile.TemporaryDirectory(prefix="mf-disconnect-check-") as scratch:
        try:
            _run(result, say, children, Path(scratch), frozen)
        except CheckFailure as failure:
            result.problems.append(str(failure))
            say(f"FAILED: {failure}")
        except OSError as error:  # requests' errors are OSErrors too
            result.problems.append(f"{type(error).__name__}: {error}")
            say(f"FAILED: {type(error).__name__}: {error}")
        finally:
            _clean_up(result, say, children, frozen)
    _evaluate(result)
    stopped_agent = result.stopped.get("agent", "")
    if stopped_agent.startswith("did not exit"):
        result.problems.append(f"the agent {stopped_agent} (it must stop within 2 s of SIGTERM)")
    elif stopped_agent.startswith("had already"):
        result.problems.append(f"the agent {stopped_agent} before the check stopped it")
    result.passed = not result.problems
    _verdict(result, say)
    return result


def _clean_up(result: CheckResult, say: Callable[..., None], children: dict[str, Child], frozen: _FrozenFlag) -> None:
    """Resume the agent if it may be frozen, then stop the agent and the control plane by their PIDs."""
    agent = children.get("agent")
    if agent is not None and frozen.value and agent.exited() is None:
        try:
            os.kill(agent.pid, signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            frozen.value = False
            say(f"SIGCONT to the agent (PID {agent.pid}) during clean-up")
            # let it run again before SIGTERM, so the stop is measured on a running agent
            settle = time.monotonic() + 1.0
            while all_stopped(agent.pid) and time.monotonic() < settle:
                time.sleep(0.01)
            time.sleep(0.2)
        except ProcessLookupError:
            pass  # it is gone already; stop_child reports how
    for name, timeout in (("agent", STOP_TIMEOUT_AGENT), ("control plane", STOP_TIMEOUT_CONTROL_PLANE)):
        child = children.get(name)
        if child is None:
            continue
        try:
            how = stop_child(child, timeout)
        except Exception as error:  # noqa: BLE001 - the other process must still be stopped
            how = f"could not be stopped: {type(error).__name__}: {error}"
            result.problems.append(f"the {name} (PID {child.pid}) {how}")
        result.stopped[name] = how
        say(f"{name} (PID {child.pid}) stopped: {how}")


def _wait_for(condition: Callable[[], Any], timeout: float, watched: list[Child], what: str, poll: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; fail when a watched child exits."""
    return _support.wait_for(condition, timeout, watched, what, poll, error=CheckFailure, tail_on_timeout=False)


def _require_loopback(url: str, what: str) -> None:
    _support.require_loopback(url, what, error=CheckFailure)


def _run(
    result: CheckResult,
    say: Callable[..., None],
    children: dict[str, Child],
    scratch: Path,
    frozen: _FrozenFlag,
) -> None:
    control_plane, api_url, emulator_url, admin_token = _start_control_plane(result, say, children)
    admin = Admin(api_url, admin_token)
    try:
        minted = admin.mint("disconnect check (disposable)")
        say(f"enrollment token minted (enrollment {minted['enrollment_id']})")
        agent = _start_agent(result, say, children, scratch, api_url, minted["token"], control_plane)
        node_id = result.node_id
        assert node_id is not None
        both = [agent, control_plane]
        seen = _wait_online_and_advancing(result, say, admin, node_id, both)
        baseline, frozen_at, frozen_wall, stopped_wall = _freeze(result, say, admin, node_id, agent, both, seen, frozen)
        baseline_epoch = _epoch(baseline)
        _watch_disconnected(result, say, admin, node_id, agent, both, frozen_at, baseline)
        # the times are taken before SIGCONT: on a busy host the agent may run (and heartbeat)
        # before this process gets the CPU back
        resumed_at = time.monotonic()
        resumed_wall = time.time()
        result.heartbeat_age_at_end = resumed_wall - baseline_epoch
        os.kill(agent.pid, signal.SIGCONT)
        frozen.value = False
        say(f"SIGCONT to the agent after {resumed_at - frozen_at:.1f} s: reconnecting")
        _check_back_online(result, say, admin, node_id, both, baseline, resumed_wall)

        # the control plane's own records -----------------------------------------------------
        _check_access_log(result, say, control_plane, baseline_epoch, resumed_wall)
        _check_state_log(result, say, emulator_url, node_id, baseline_epoch, frozen_wall, stopped_wall, resumed_wall)
        failures = sorted({r.get("message", "?") for r in agent.records() if r.get("event") == "publish_failed"})
        if failures:
            say(f"agent publish failures (retried with backoff): {'; '.join(failures)}")
    finally:
        admin.close()


def _start_control_plane(
    result: CheckResult, say: Callable[..., None], children: dict[str, Child]
) -> tuple[Child, str, str, str]:
    """``modelforge local up`` with the check's thresholds: the child, its API and emulator URLs, its admin token."""
    admin_token = secrets.token_urlsafe(32)
    control_plane = start_child(
        "control plane",
        # --verbose: the access lines this check reads are routine lines, kept at debug otherwise
        [sys.executable, "-m", "modelforge_cli.cli", "local", "up", "--host", LOOPBACK, "--port", "0", "--verbose"],
        child_environment(
            {
                "MODELFORGE_ADMIN_TOKEN": admin_token,
                "MODELFORGE_NODE_STALE_AFTER_SECONDS": str(result.stale_after),
                "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": str(result.offline_after),
                # handed to agents; an integer below stale-after (the agent uses --interval anyway)
                "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": str(max(1, math.floor(result.interval))),
                "MODELFORGE_SWEEP_INTERVAL_SECONDS": str(SWEEP_INTERVAL_SECONDS),
                "MODELFORGE_LOG_LEVEL": "INFO",
            }
        ),
        REPO_ROOT,
        result.log_dir / "control-plane.log",
    )
    children["control plane"] = control_plane
    match = _wait_for(
        lambda: READY_RE.search(control_plane.output()), CONTROL_PLANE_START_TIMEOUT, [control_plane], "ready line"
    )
    api_url, emulator_url = match.group(1), match.group(2)
    _require_loopback(api_url, "the control plane")
    _require_loopback(emulator_url, "the AWS emulator")
    say(f"control plane ready at {api_url} (PID {control_plane.pid}, AWS emulator {emulator_url})")
    return control_plane, api_url, emulator_url, admin_token


def _start_agent(
    result: CheckResult,
    say: Callable[..., None],
    children: dict[str, Child],
    scratch: Path,
    api_url: str,
    enrollment_token: str,
    control_plane: Child,
) -> Child:
    """The disposable CPU-mode agent, started and enrolled (its node id in ``result.node_id``)."""
    agent = _support.start_cpu_agent(
        api_url,
        enrollment_token,
        result.interval,
        scratch / "agent-state",
        "disconnect-check",
        scratch,
        result.log_dir / "agent.log",
    )
    children["agent"] = agent

    def enrolled() -> dict[str, Any] | None:
        return _support.enrolled_record(agent)

    watched = [agent, control_plane]
    node_id = str(_wait_for(enrolled, ENROLL_TIMEOUT, watched, "'enrolled' log line from the agent")["node_id"])
    result.node_id = node_id
    say(f"agent started (PID {agent.pid}) and enrolled as {node_id}")
    return agent


def _wait_online_and_advancing(
    result: CheckResult, say: Callable[..., None], admin: Admin, node_id: str, both: list[Child]
) -> list[str]:
    """Wait until the node is online with its heartbeat advancing; the heartbeats seen."""
    seen: list[str] = []

    def online_and_advancing() -> dict[str, Any] | None:
        node = admin.node(node_id)
        beat = node.get("last_heartbeat_at")
        if beat and (not seen or seen[-1] != beat):
            seen.append(beat)
        return node if node.get("status") == ONLINE and len(seen) >= 2 else None

    timeout = ONLINE_TIMEOUT + 3 * result.interval
    _wait_for(online_and_advancing, timeout, both, "online node with an advancing heartbeat")
    say(f"node online, heartbeat advancing (last_heartbeat_at {seen[-2]} -> {seen[-1]})")
    return seen


def _freeze(
    result: CheckResult,
    say: Callable[..., None],
    admin: Admin,
    node_id: str,
    agent: Child,
    both: list[Child],
    seen: list[str],
    frozen: _FrozenFlag,
) -> tuple[str, float, float, float]:
    """SIGSTOP to the agent right after a heartbeat was recorded: the agent then waits --interval
    before it sends anything, so no request of its is in flight when it stops. The heartbeat
    recorded before the freeze, when SIGSTOP was sent (monotonic and wall clock), and when every
    agent thread was seen stopped (wall clock)."""

    def next_beat() -> str | None:
        beat = admin.node(node_id).get("last_heartbeat_at")
        return beat if beat and beat != seen[-1] else None

    baseline = _wait_for(next_beat, 3 * result.interval + 10, both, "next heartbeat to freeze after", poll=0.02)
    frozen.value = True
    os.kill(agent.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    frozen_wall = time.time()
    baseline_epoch = _epoch(baseline)
    result.heartbeat_before_freeze = baseline
    say(
        f"heartbeat recorded at {baseline}; SIGSTOP to the agent (PID {agent.pid})"
        f" {max(0.0, frozen_wall - baseline_epoch):.3f} s later: DISCONNECTED for {result.seconds:g} s"
    )
    confirm_deadline = time.monotonic() + FREEZE_CONFIRM_TIMEOUT
    while (stopped := all_stopped(agent.pid)) is False and time.monotonic() < confirm_deadline:
        time.sleep(0.01)
    states = thread_states(agent.pid)
    if stopped is None:
        say("agent threads: not verifiable (no /proc)")
    elif stopped:
        say(f"agent threads: all {len(states or {})} in state T (stopped)")
    else:
        raise CheckFailure(f"the agent's threads did not all stop after SIGSTOP: {states}")
    stopped_wall = time.time()  # from here to SIGCONT the agent surely cannot send anything
    return baseline, frozen_at, frozen_wall, stopped_wall


def _watch_disconnected(
    result: CheckResult,
    say: Callable[..., None],
    admin: Admin,
    node_id: str,
    agent: Child,
    both: list[Child],
    frozen_at: float,
    baseline: str,
) -> None:
    """Read the node at once, then every second half-way between whole seconds (the thresholds
    are whole seconds after a heartbeat that came just before the freeze, so each reading falls
    clearly inside one status's range), and at the end of the window."""
    say("disconnected window (seconds since SIGSTOP, GET /api/v1/admin/nodes/{id} each second):")
    schedule = [0.0]
    while schedule[-1] + POLL_SECONDS < result.seconds:
        schedule.append(POLL_SECONDS / 2 if len(schedule) == 1 else schedule[-1] + POLL_SECONDS)
    schedule.append(result.seconds)
    for offset in schedule:
        time.sleep(max(0.0, frozen_at + offset - time.monotonic()))
        for child in both:
            code = child.exited()
            if code is not None:
                raise CheckFailure(f"the {child.name} (PID {child.pid}) {exit_description(code)} while frozen")
        sample = _read_sample(admin, node_id, frozen_at, result.stale_after, result.offline_after, agent.pid)
        result.samples.append(sample)
        beat = sample.last_heartbeat_at
        moved = beat is not None and beat != baseline
        if beat is not None and moved and beat not in result.heartbeat_values_while_disconnected:
            result.heartbeat_values_while_disconnected.append(beat)
        say(_describe(sample, moved), stamp=False)


def _check_back_online(
    result: CheckResult,
    say: Callable[..., None],
    admin: Admin,
    node_id: str,
    both: list[Child],
    baseline: str,
    resumed_wall: float,
) -> None:
    """After SIGCONT: two new heartbeats and the node online again, none recorded before SIGCONT."""
    beats_after: list[str] = []

    def advancing_again() -> dict[str, Any] | None:
        node = admin.node(node_id)
        beat = node.get("last_heartbeat_at")
        if beat and beat != baseline and (not beats_after or beats_after[-1] != beat):
            beats_after.append(beat)
        return node if len(beats_after) >= 2 and node.get("status") == ONLINE else None

    try:
        node = _wait_for(
            advancing_again,
            RESUME_TIMEOUT + 2 * result.interval,
            both,
            "two new heartbeats and online after SIGCONT",
            0.05,
        )
    except CheckFailure as failure:
        result.problems.append(f"after resuming: {failure}")
        say(f"after resuming: {failure}")
        return
    result.resumed = True
    result.resumed_after_seconds = _epoch(beats_after[0]) - resumed_wall
    result.heartbeat_after_resume = node["last_heartbeat_at"]
    result.status_after_resume = node["status"]
    say(
        f"heartbeat advancing again: {baseline} -> {beats_after[0]} (recorded"
        f" {result.resumed_after_seconds:.2f} s after SIGCONT) -> {beats_after[1]}; status {node['status']}"
    )
    if result.resumed_after_seconds < -0.002:  # the server rounds its times to milliseconds
        result.problems.append(f"a heartbeat ({beats_after[0]}) was recorded after the last reading but before SIGCONT")


def _read_sample(
    admin: Admin,
    node_id: str,
    frozen_at: float,
    stale_after: int,
    offline_after: int,
    agent_pid: int,
) -> Sample:
    elapsed = time.monotonic() - frozen_at
    agent_frozen = all_stopped(agent_pid)
    before = time.time()
    try:
        node = admin.node(node_id)
    except (CheckFailure, OSError) as error:
        return Sample(elapsed, None, None, None, None, (), agent_frozen, error=str(error))
    after = time.time()
    beat = node.get("last_heartbeat_at")
    if beat is None:
        return Sample(elapsed, node.get("status"), None, None, None, (), agent_frozen, node.get("liveness_hold"))
    beat_epoch = _epoch(beat)
    age_low, age_high = before - beat_epoch, after - beat_epoch
    return Sample(
        elapsed,
        node.get("status"),
        beat,
        age_low,
        age_high,
        allowed_statuses(age_low, age_high, stale_after, offline_after),
        agent_frozen,
        node.get("liveness_hold"),
    )


def _offset(elapsed: float) -> str:
    return f"{'+' + format(elapsed, '.1f'):>6} s"


def _describe(sample: Sample, moved: bool) -> str:
    if sample.error:
        return f"  {_offset(sample.elapsed)}  ERROR {sample.error}"
    threads = {True: "agent stopped", False: "AGENT NOT STOPPED", None: "agent state unknown"}[sample.agent_frozen]
    age = f"age {sample.age_low:.2f} s" if sample.age_low is not None else "no heartbeat"
    verdict = "" if sample.status in sample.allowed else f"  <-- expected {'/'.join(sample.allowed) or '?'}"
    hold = "  (liveness_hold)" if sample.liveness_hold else ""
    change = "ADVANCED" if moved else "unchanged"
    return (
        f"  {_offset(sample.elapsed)}  {sample.status!s:8}  last_heartbeat_at {sample.last_heartbeat_at}"
        f" ({change}, {age})  {threads}{hold}{verdict}"
    )


def _check_access_log(
    result: CheckResult, say: Callable[..., None], control_plane: Child, baseline_epoch: float, resumed_wall: float
) -> None:
    """No agent request may reach the control plane between the pre-freeze heartbeat and SIGCONT.

    The agent sends one request at a time, so the heartbeat recorded before the freeze is the first
    heartbeat access record logged at or after its ``last_heartbeat_at`` (the log line follows the
    write); every agent record after that one and before SIGCONT is a request sent while frozen.
    """
    records = sorted(
        (
            r
            for r in control_plane.records()
            if r.get("event") == "http_request"
            and str(r.get("path", "")).startswith(AGENT_PATH_PREFIX)
            and isinstance(r.get("ts"), (int, float))
        ),
        key=lambda r: r["ts"],
    )
    later = [r for r in records if r["ts"] >= baseline_epoch - 0.002]
    first = next((i for i, r in enumerate(later) if r.get("path") == HEARTBEAT_PATH), None)
    if first is None:
        result.problems.append(
            "the control plane's log holds no access record of the heartbeat recorded before the freeze"
        )
        return
    during = [r for r in later[first + 1 :] if r["ts"] < resumed_wall]
    result.agent_requests_while_disconnected = len(during)
    routes = ", ".join(f"{r.get('method')} {r.get('path')} {r.get('status')}" for r in during)
    say(
        f"agent requests in the control plane's access log while frozen: {len(during)}{': ' + routes if routes else ''}"
    )
    if during:
        result.problems.append(f"the control plane logged {len(during)} agent request(s) while the agent was frozen")


def _check_state_log(
    result: CheckResult,
    say: Callable[..., None],
    emulator_url: str,
    node_id: str,
    baseline_epoch: float,
    frozen_wall: float,
    stopped_wall: float,
    resumed_wall: float,
) -> None:
    """The persisted side: the sweep's transitions no earlier than the thresholds, and no heartbeat while frozen.

    ``frozen_wall`` is when SIGSTOP was sent (the origin of the times shown), ``stopped_wall`` when
    every agent thread was seen stopped, ``resumed_wall`` just before SIGCONT.
    """
    events = _settled_transitions(result, say, emulator_url, node_id)
    if events is None:
        return
    result.persisted_transitions = [
        (e["subject"]["from"], e["subject"]["to"], e["subject"]["cause"], e["occurred_at"] - frozen_wall)
        for e in events
    ]
    shown = ", ".join(f"{a}->{b} ({cause}) at {at:+.1f} s" for a, b, cause, at in result.persisted_transitions)
    say(f"liveness transitions in the S3 state log (seconds since SIGSTOP): {shown or 'none'}")
    for event in events:
        subject, at = event["subject"], event["occurred_at"]
        if subject["cause"] == "heartbeat" and stopped_wall <= at < resumed_wall:
            result.problems.append(f"state log: a heartbeat moved the node {subject['from']}->online while frozen")
        if subject["cause"] == "sweep" and frozen_wall <= at < resumed_wall:
            threshold = result.stale_after if subject["to"] == STALE else result.offline_after
            if at - baseline_epoch < threshold - 0.01:
                result.problems.append(
                    f"state log: the sweep persisted {subject['to']} {at - baseline_epoch:.2f} s after the last"
                    f" heartbeat, before the {threshold} s threshold"
                )
    _check_sweep_reached(result, events, frozen_wall, resumed_wall - baseline_epoch)


def _settled_transitions(
    result: CheckResult, say: Callable[..., None], emulator_url: str, node_id: str
) -> list[dict[str, Any]] | None:
    """The node's liveness transitions in the S3 state log, once the way back to online is shipped
    (or what there is after a timeout); None when the state log cannot be read."""

    def settled() -> list[dict[str, Any]] | None:
        events = state_log_transitions(emulator_url, node_id)
        if not events or events[-1]["subject"]["to"] == ONLINE:
            return events
        return None  # the sweep moved it; the heartbeat's way back has not been shipped yet

    try:
        try:
            events: list[dict[str, Any]] = _wait_for(
                settled, STATE_LOG_TIMEOUT, [], "state-log transition back to online", poll=0.2
            )
        except CheckFailure as failure:
            events = state_log_transitions(emulator_url, node_id)
            if result.resumed:  # otherwise the missing resume is the problem already reported
                result.problems.append(f"state log: {failure}")
    except Exception as error:  # noqa: BLE001 - boto3's errors are not OSErrors
        result.problems.append(f"the S3 state log could not be read: {type(error).__name__}: {error}")
        say(f"the S3 state log could not be read: {type(error).__name__}: {error}")
        return None
    return events


def _check_sweep_reached(
    result: CheckResult, events: list[dict[str, Any]], frozen_wall: float, window_end_age: float
) -> None:
    """Each status the window was long enough for was persisted by the sweep."""
    swept = [e["subject"] for e in events if e["subject"]["cause"] == "sweep" and frozen_wall <= e["occurred_at"]]
    for target, threshold in ((STALE, result.stale_after), (OFFLINE, result.offline_after)):
        if window_end_age < threshold + SWEEP_INTERVAL_SECONDS + PERSIST_MARGIN:
            continue  # the window is too short to require it
        reached = any(s["to"] == target or (target == STALE and s["from"] == ONLINE) for s in swept)
        if not reached:
            result.problems.append(
                f"state log: the sweep never persisted {target} although the heartbeat was"
                f" {window_end_age:.1f} s old at SIGCONT"
            )


def _evaluate(result: CheckResult) -> None:
    """Judge the readings of the window (whatever part of it was reached)."""
    samples = [s for s in result.samples if not s.error]
    for sample in result.samples:
        if sample.error:
            result.problems.append(f"reading the node at +{sample.elapsed:.1f} s failed: {sample.error}")
    result.heartbeat_advanced_while_disconnected = bool(result.heartbeat_values_while_disconnected)
    if result.heartbeat_advanced_while_disconnected:
        result.problems.append(
            f"last_heartbeat_at advanced while the agent was frozen: {result.heartbeat_before_freeze} ->"
            f" {', '.join(result.heartbeat_values_while_disconnected)}"
        )
    frozen_flags = [s.agent_frozen for s in result.samples]
    result.agent_frozen_throughout = None if None in frozen_flags else all(frozen_flags)
    if False in frozen_flags:
        result.problems.append("the agent was not stopped at every reading of the window")
    for sample in samples:
        if sample.status is not None and sample.status not in result.statuses_seen:
            result.statuses_seen.append(sample.status)
            result.first_seen_at[sample.status] = sample.elapsed
        if sample.status not in sample.allowed:
            result.problems.append(
                f"at +{sample.elapsed:.1f} s (heartbeat {sample.age_low:.2f} s old) the status was"
                f" {sample.status!r}, expected {' or '.join(map(repr, sample.allowed))}"
                if sample.age_low is not None
                else f"at +{sample.elapsed:.1f} s the node had no last_heartbeat_at (status {sample.status!r})"
            )
    # a status is required when some reading fell clearly inside its range
    result.stale_expected = any(s.allowed == (STALE,) for s in samples)
    result.offline_expected = any(s.allowed == (OFFLINE,) for s in samples)
    if result.samples and not samples:
        result.problems.append("no reading of the node succeeded during the window")
    if not result.samples and not result.problems:
        result.problems.append("no reading of the node was taken")


def _verdict(result: CheckResult, say: Callable[..., None]) -> None:
    say("", stamp=False)
    say("summary:", stamp=False)
    if result.heartbeat_before_freeze is not None:
        readings = len([s for s in result.samples if not s.error])
        if result.heartbeat_advanced_while_disconnected:
            moved = f"ADVANCED to {', '.join(result.heartbeat_values_while_disconnected)}"
        else:
            moved = (
                f"never advanced ({result.heartbeat_before_freeze} in all {readings} readings"
                f" over {result.seconds:g} s)"
            )
        say(f"  last_heartbeat_at while disconnected: {moved}", stamp=False)
        for status, threshold, expected in (
            (STALE, result.stale_after, result.stale_expected),
            (OFFLINE, result.offline_after, result.offline_expected),
        ):
            age = result.heartbeat_age_at_end
            if status in result.first_seen_at:
                note = f"observed from +{result.first_seen_at[status]:.1f} s after SIGSTOP (threshold {threshold} s)"
            elif expected:
                note = f"NOT observed although a reading fell inside its range (threshold {threshold} s)"
            elif result.heartbeat_advanced_while_disconnected:
                note = f"not observed: the heartbeat kept advancing (threshold {threshold} s)"
            elif age is None or age < threshold + STATUS_TOLERANCE:
                note = f"not observed: the {result.seconds:g} s window is too short for it (threshold {threshold} s)"
            else:
                note = f"not observed: no reading fell clearly inside its range (threshold {threshold} s)"
            say(f"  {status}: {note}", stamp=False)
        if result.agent_requests_while_disconnected is not None:
            say(
                "  agent requests logged by the control plane while frozen: "
                f"{result.agent_requests_while_disconnected}",
                stamp=False,
            )
        if result.resumed:
            say(
                f"  resumed: heartbeat advancing and {result.status_after_resume} again,"
                f" first new heartbeat recorded {result.resumed_after_seconds:.2f} s after SIGCONT",
                stamp=False,
            )
        else:
            say("  resumed: NO", stamp=False)
    for problem in result.problems:
        say(f"  problem: {problem}", stamp=False)
    say(f"VERDICT: {'PASS' if result.passed else 'FAIL'}", stamp=False)


# --- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=100.0,
        help=f"how long the agent stays frozen ({MIN_SECONDS:g}..{MAX_SECONDS:g})",
    )
    parser.add_argument(
        "--stale-after",
        type=int,
        default=90,
        help="MODELFORGE_NODE_STALE_AFTER_SECONDS (at least 2; default: deployed)",
    )
    parser.add_argument(
        "--offline-after",
        type=int,
        default=300,
        help="MODELFORGE_NODE_OFFLINE_AFTER_SECONDS (above --stale-after; default: deployed)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=45.0,
        help=f"the agent's heartbeat interval ({MIN_INTERVAL:g}..below --stale-after)",
    )
    parser.add_argument(
        "--log-dir", type=Path, help="where to keep the two processes' logs (default: a new temp folder)"
    )
    args = parser.parse_args(argv)
    try:
        validate(args.seconds, args.stale_after, args.offline_after, args.interval)
    except ValueError as error:
        parser.error(str(error))
    return args


def _run_check(args: argparse.Namespace) -> int:
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="mf-disconnect-check-logs-"))
    _support.install_sigterm_handler()
    result = run_check(args.seconds, args.stale_after, args.offline_after, args.interval, log_dir)
    return 0 if result.passed else 1


def _failed_verdict(interrupted: bool) -> None:
    print("VERDICT: FAIL (interrupted)" if interrupted else "VERDICT: FAIL")


def main(argv: list[str] | None = None) -> int:
    return _support.run_main(
        "disconnect_check.py",
        parse_args,
        _run_check,
        argv,
        interrupted_note=" (agent resumed, both processes stopped)",
        interrupted_code=1,
        after_failure=_failed_verdict,
    )


if __name__ == "__main__":
    sys.exit(main())
