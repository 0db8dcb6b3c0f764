"""What the benchmark scripts in bench/ share: the failure type, the ``main()`` wrapper, and child processes.

Not a script: the scripts import it as ``from modelforge_bench import support as _support``, which
works both when run as ``.venv/bin/python bench/<name>.py`` and in the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

LOOPBACK = "127.0.0.1"
MAX_KEPT_LINES = 200_000  # per piped child, so a chatty process cannot grow this one without bound
TAIL_LINES = 20


class BenchFailure(Exception):
    """Something the benchmark depends on did not work; the run exits non-zero."""


class Terminated(Exception):
    """This process got SIGTERM: stop the children and exit."""


def install_sigterm_handler() -> None:
    """Turn SIGTERM into ``Terminated``, so that the clean-up of the children runs."""

    def terminated(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        raise Terminated()

    signal.signal(signal.SIGTERM, terminated)


def run_main(
    script_name: str,
    parse_args: Callable[[list[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
    *,
    interrupted_note: str = "",
    interrupted_code: int = 130,
    after_failure: Callable[[bool], None] | None = None,
) -> int:
    """Parse ``argv``, ``run`` it, and turn a failure into a ``bench/<script_name>: FAILED: ...`` line.

    ``BenchFailure`` and unexpected exceptions exit 1 (the latter with a traceback first); Ctrl-C
    and ``Terminated`` exit ``interrupted_code``. ``after_failure(interrupted)`` runs after the
    message of either, for a script to add its own last line.
    """
    prefix = f"bench/{script_name}"
    args = parse_args(argv)
    try:
        return run(args)
    except BenchFailure as failure:
        print(f"{prefix}: FAILED: {failure}", file=sys.stderr)
        code, interrupted = 1, False
    except (KeyboardInterrupt, Terminated):
        print(f"{prefix}: interrupted{interrupted_note}", file=sys.stderr)
        code, interrupted = interrupted_code, True
    except Exception as error:  # noqa: BLE001 - report, then exit non-zero
        import traceback

        traceback.print_exc()
        print(f"{prefix}: FAILED: unexpected {type(error).__name__}: {error}", file=sys.stderr)
        code, interrupted = 1, False
    if after_failure is not None:
        after_failure(interrupted)
    return code


def require_loopback(url: str, what: str, error: type[Exception] = BenchFailure) -> None:
    if urlparse(url).hostname != LOOPBACK:
        raise error(f"{what} is at {url}, not on {LOOPBACK}; refusing to run")


# --- child processes -----------------------------------------------------------------------


def json_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON-object lines (the ModelForge log format); other lines are skipped."""
    found = []
    for line in lines:
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                found.append(record)
    return found


class LineCollector:
    """Read a child's merged stdout/stderr line by line on a thread, keeping (wall time, line)."""

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self._stream = stream
        self._lines: list[tuple[float, str]] = []
        self._dropped = 0
        self._guard = threading.Lock()
        self._thread = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in iter(self._stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with self._guard:
                if len(self._lines) < MAX_KEPT_LINES:
                    self._lines.append((time.time(), line))
                else:
                    self._dropped += 1
        self._stream.close()

    def lines(self) -> list[str]:
        with self._guard:
            return [line for _, line in self._lines]

    @property
    def dropped(self) -> int:
        with self._guard:
            return self._dropped

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class Child:
    """A child process whose merged stdout/stderr is kept: in memory (``collector``) or in ``log_path``."""

    def __init__(
        self,
        name: str,
        process: subprocess.Popen,
        collector: LineCollector | None = None,
        log_path: Path | None = None,
        log: IO[bytes] | None = None,
    ) -> None:
        self.name = name
        self.process = process
        self.collector = collector
        self.log_path = log_path
        self._log = log

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> int | None:
        return self.process.poll()

    def output(self) -> str:
        if self.log_path is not None:
            return self.log_path.read_text(errors="replace")
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        if self.collector is not None:
            return self.collector.lines()
        return self.output().splitlines()

    @property
    def dropped(self) -> int:
        """Lines past ``MAX_KEPT_LINES`` that were not kept (in-memory output only)."""
        return self.collector.dropped if self.collector is not None else 0

    def records(self) -> list[dict[str, Any]]:
        """The JSON-object lines of its output (the ModelForge log format)."""
        return json_records(self.lines())

    def tail(self, count: int = TAIL_LINES) -> str:
        return "\n".join("    " + line for line in self.lines()[-count:]) or "    (no output)"

    def release(self) -> None:
        """After the process ended: finish reading its output, or close its log file."""
        if self.collector is not None:
            self.collector.join(timeout=2)
        if self._log is not None:
            self._log.close()


def start_child(name: str, command: list[str], env: dict[str, str], cwd: Path, log_path: Path | None = None) -> Child:
    """Start ``command`` in its own session, its output to ``log_path`` or, without one, kept in memory."""
    log = open(log_path, "wb") if log_path is not None else None  # noqa: SIM115 - open while the child runs
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log if log is not None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,  # a Ctrl-C reaches only this script, which stops the children itself
        )
    except BaseException:
        if log is not None:
            log.close()
        raise
    if log is not None:
        return Child(name, process, log_path=log_path, log=log)
    assert process.stdout is not None
    return Child(name, process, collector=LineCollector(process.stdout, name))


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """This environment without ModelForge or AWS settings or proxies for loopback, plus ``extra``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("MODELFORGE_", "AWS_"))
        and name.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env["NO_PROXY"] = env["no_proxy"] = f"{LOOPBACK},localhost"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def start_cpu_agent(
    api_url: str,
    enrollment_token: str,
    interval: float,
    state_volume: Path,
    hostname: str,
    cwd: Path,
    log_path: Path | None = None,
) -> Child:
    """A disposable CPU-mode node agent that enrolls with ``enrollment_token`` and heartbeats every
    ``interval`` seconds; ``cwd`` is not the repository, so it runs from its installed package."""
    env = child_environment(
        {
            "MODELFORGE_AGENT_CONTROL_PLANE_URL": api_url,
            "MODELFORGE_AGENT_ENROLLMENT_TOKEN": enrollment_token,
            "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
            "MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS": f"{interval:g}",
            "MODELFORGE_AGENT_STATE_VOLUME": str(state_volume),
            "MODELFORGE_AGENT_HOSTNAME": hostname,
        }
    )
    return start_child("agent", [sys.executable, "-m", "modelforge_node_agent.main"], env, cwd, log_path)


def enrolled_record(agent: Child) -> dict[str, Any] | None:
    """The agent's ``enrolled`` log record with its node id, once it has written one."""
    return next((r for r in agent.records() if r.get("event") == "enrolled" and r.get("node_id")), None)


def exit_description(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


def stop_child(child: Child, timeout: float) -> str:
    """SIGTERM the child by its PID, SIGKILL it after ``timeout``; say how it ended."""
    process = child.process
    try:
        if process.poll() is not None:
            return f"had already {exit_description(process.returncode).replace('was ', 'been ', 1)}"
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)  # Popen signals its own PID only
        try:
            process.wait(timeout=timeout)
            return f"{exit_description(process.returncode)} {time.monotonic() - began:.2f} s after SIGTERM"
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return f"did not exit within {timeout:g} s of SIGTERM and was killed"
    finally:
        child.release()


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    watched: list[Child],
    what: str,
    poll: float = 0.05,
    *,
    error: type[Exception] = BenchFailure,
    tail_on_timeout: bool = True,
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail (``error``) when a watched child exits.

    On timeout the message shows the last output of the first watched child, if ``tail_on_timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        for child in watched:
            code = child.exited()
            if code is not None:
                raise error(
                    f"the {child.name} (PID {child.pid}) {exit_description(code)} while waiting for {what};"
                    f" its last output:\n{child.tail()}"
                )
        if time.monotonic() >= deadline:
            if tail_on_timeout and watched:
                raise error(
                    f"no {what} within {timeout:g} s; the last output of the {watched[0].name}:\n{watched[0].tail()}"
                )
            raise error(f"no {what} within {timeout:g} s")
        time.sleep(poll)


# --- in-process local stack ----------------------------------------------------------------


def run_together(
    threads: list[threading.Thread],
    start: threading.Barrier,
    *,
    start_timeout: float,
    give_up_after: float,
    what: str,
    stop: threading.Event | None = None,
) -> float:
    """Start ``threads`` (each waits on ``start``), release them together, and wait for them all
    within ``give_up_after`` seconds of the release: the seconds they took. One still running then
    sets ``stop`` and fails the run as ``what`` did not finish in time."""
    for thread in threads:
        thread.start()
    start.wait(timeout=start_timeout)
    began = time.perf_counter()
    give_up = began + give_up_after
    for thread in threads:
        thread.join(timeout=max(0.0, give_up - time.perf_counter()))
    elapsed = time.perf_counter() - began
    if any(thread.is_alive() for thread in threads):
        if stop is not None:
            stop.set()
        raise BenchFailure(f"{what} did not finish in time")
    return elapsed


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def app_operations(snapshot: Mapping[str, int]) -> dict[str, int]:
    """Emulator counters without the local stream poller's traffic."""
    return {name: count for name, count in snapshot.items() if not name.startswith("poller:")}


def format_ops(ops: Mapping[str, float]) -> str:
    """``GetItem=1, Query=0.5`` (sorted; "(none)" when empty)."""
    return ", ".join(f"{name}={value:.2f}".rstrip("0").rstrip(".") for name, value in sorted(ops.items())) or "(none)"


def brief(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def loopback_client(base_url: str, timeout: float) -> Any:
    """An admin-token ``ControlPlane`` client with its own requests.Session that ignores the
    environment (no proxies, no netrc: 127.0.0.1 only)."""
    import requests
    from modelforge_cli.api_client import ControlPlane

    session = requests.Session()
    session.trust_env = False
    return ControlPlane(base_url, os.environ["MODELFORGE_ADMIN_TOKEN"], session=session, timeout=timeout)


def mint_and_enroll(client: Any, identity: Any, index: int, display_name: str, hostname: str, **enroll: Any) -> None:
    """Mint an enrollment token through ``client`` and enroll ``identity`` with it (``enroll``: the
    rest of the enroll request, such as the inventory); a refusal of either is a BenchFailure."""
    minted = client.admin(
        "POST", "/api/v1/admin/node-enrollments", json={"display_name": display_name, "expires_in_seconds": 900}
    )
    if minted.status_code != 201:
        raise BenchFailure(f"minting an enrollment token answered {minted.status_code}: {brief(minted.text)}")
    response = client.enroll(minted.json()["token"], identity, hostname=hostname, **enroll)
    if response.status_code != 201:
        raise BenchFailure(f"enrolling node {index} answered {response.status_code}: {brief(response.text)}")


def prepare_stack_environment(log_level: str, *, keep_thresholds: bool) -> None:
    """The environment a bench's in-process local stack runs with: a fresh admin token for this run
    only, the liveness thresholds the figures assume (the documented 90 s and 300 s; ``keep_thresholds`` leaves
    ones already set), the app's log level, and loopback traffic that never goes through a proxy."""
    os.environ.pop("MODELFORGE_ADMIN_TOKEN_SHA256", None)
    os.environ["MODELFORGE_ADMIN_TOKEN"] = secrets.token_urlsafe(32)
    for name, seconds in (
        ("MODELFORGE_NODE_STALE_AFTER_SECONDS", "90"),
        ("MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", "300"),
    ):
        if keep_thresholds:
            os.environ.setdefault(name, seconds)
        else:
            os.environ[name] = seconds
    os.environ["MODELFORGE_LOG_LEVEL"] = log_level
    add_loopback_to_no_proxy()


def add_loopback_to_no_proxy() -> None:
    """Loopback traffic of this process never goes through a proxy."""
    for name in ("NO_PROXY", "no_proxy"):
        existing = [part for part in os.environ.get(name, "").split(",") if part]
        os.environ[name] = ",".join(existing + [LOOPBACK, "localhost"])


def emulator_dynamodb(endpoint_url: str, region: str, read_timeout: float, session: Any = None) -> Any:
    """A low-level DynamoDB client for the emulator on 127.0.0.1 (no proxies, no retries).

    ``session``: the boto3 session to make it from (default: a new one).
    """
    import boto3
    from botocore.config import Config

    return (session or boto3.session.Session()).client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=region,
        # the emulator accepts any credentials; these are not secrets
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=read_timeout,
            proxies={},
        ),
    )
