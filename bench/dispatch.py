#!/usr/bin/env python
"""Dispatch latency: how long an idle node takes to claim and finish work, with the push channel
and in fallback (the heartbeat's work hint).

Run from the repository root:

    .venv/bin/python bench/dispatch.py [--submits 30] [--gap 1] [--phase 15] [--modes channel,fallback] [--seed 1]

For each mode it starts ``modelforge local up`` (a free API port, ``--channel-port 0``, a fresh
random admin token, the default heartbeat interval) with its runtime worker and its CPU node agent
(``--with-worker``, ``--with-cpu-agent``, as ./scripts/dev-up does); in ``fallback`` the agent runs
with ``MODELFORGE_AGENT_PUSH_CHANNEL=off``. Once the node is online, serves ``diagnostic.echo`` and
shows the expected channel state (``connected``, or ``fallback``), it submits ``--submits``
``diagnostic.echo`` items one at a time: each is submitted while the node is idle (the previous
one succeeded and a random pause of ``--gap`` x 0.5..1.5 plus 0..``--phase`` seconds passed, so
submits fall at random points of the heartbeat interval, not just after the heartbeat that hinted
the previous item), and followed until it succeeds. The times are the control plane's own,
to the millisecond, so polling adds nothing: submitted = the item's ``created_at``, claimed = the
``occurred_at`` of its ``work.leased`` event in the state log, succeeded = its ``finished_at``.

It prints, per mode, submit->claimed and submit->succeeded p50 and p99 (nearest rank: with 30
samples p99 is the maximum) and the mean, and the issue's target for the channel (claimed p50 <=
0.5 s, p99 <= 1.5 s). Everything it starts listens on 127.0.0.1 and is stopped by its PID at the
end, whatever happens. With the defaults a run takes about 13 minutes on 2 cores, most of it the
fallback mode (each claim waits for a heartbeat: half an interval on average).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import requests
from modelforge_bench import support as _support
from modelforge_bench.support import BenchFailure, Child, child_environment, start_child, stop_child, wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_RE = re.compile(r"ready at (http://\S+) \(AWS emulator (http://\S+)\)")
CHANNEL_RE = re.compile(r"push channel at (ws://\S+)")
MODES = ("channel", "fallback")
ECHO = "diagnostic.echo"
STATE_LOG_BUCKET = "modelforge-state-log"  # `local up`'s default resource prefix
TARGET_CLAIMED_P50, TARGET_CLAIMED_P99 = 0.5, 1.5
MIN_SUBMITS, MAX_SUBMITS = 1, 500
MIN_GAP, MAX_GAP = 0.1, 60.0
START_TIMEOUT = 120.0  # local up, its worker and its agent, to a node online with the echo capability
ITEM_TIMEOUT = 120.0  # one item, submitted to succeeded (fallback waits for a heartbeat)
STOP_TIMEOUT = 30.0
REQUEST_TIMEOUT = 10.0


@dataclass
class Sample:
    work_id: str
    submitted: float
    claimed: float | None = None
    succeeded: float | None = None


@dataclass
class ModeResult:
    mode: str
    samples: list[Sample] = field(default_factory=list)
    #: the first item after the node came up (not counted: see ``first``)
    first: Sample | None = None
    channel: str | None = None
    channel_reason: str | None = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--submits", type=int, default=30, help=f"items per mode ({MIN_SUBMITS}..{MAX_SUBMITS})")
    parser.add_argument("--gap", type=float, default=1.0, help="mean pause between items, seconds (x 0.5..1.5)")
    parser.add_argument(
        "--phase",
        type=float,
        default=15.0,
        help="plus a pause of 0..PHASE seconds, so submits fall at random points of the heartbeat interval "
        "(default 15: the default interval)",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="channel, fallback or both (comma-separated)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pauses")
    parser.add_argument("--log-dir", type=Path, help="keep each mode's local up output here")
    args = parser.parse_args(argv)
    if not MIN_SUBMITS <= args.submits <= MAX_SUBMITS:
        parser.error(f"--submits must be {MIN_SUBMITS}..{MAX_SUBMITS}")
    if not MIN_GAP <= args.gap <= MAX_GAP:
        parser.error(f"--gap must be {MIN_GAP:g}..{MAX_GAP:g}")
    if not 0 <= args.phase <= MAX_GAP:
        parser.error(f"--phase must be 0..{MAX_GAP:g}")
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        parser.error(f"--modes must name {', '.join(MODES)}")
    return args


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


class Stack:
    """One `local up` with its worker and agent, and the admin API."""

    def __init__(self, mode: str, folder: Path, log_dir: Path | None) -> None:
        self.token = secrets.token_urlsafe(32)
        extra = {
            "MODELFORGE_ADMIN_TOKEN": self.token,
            "MODELFORGE_AGENT_LOG_FORMAT": "text",
            # required by every entry point: ./scripts/dev-up's documented defaults
            "MODELFORGE_NODE_STALE_AFTER_SECONDS": "60",
            "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
        }
        if mode == "fallback":
            extra["MODELFORGE_AGENT_PUSH_CHANNEL"] = "off"
        command = [sys.executable, "-m", "modelforge_cli.cli", "local", "up", "--port", "0", "--channel-port", "0",
                   "--with-worker", str(folder / "w"), "--with-cpu-agent", str(folder / "agent")]  # fmt: skip
        log_path = log_dir / f"local-up-{mode}.log" if log_dir is not None else None
        self.child: Child = start_child("local up", command, child_environment(extra), REPO_ROOT, log_path)
        match = wait_for(lambda: READY_RE.search("\n".join(self.child.lines())), START_TIMEOUT, [self.child], "ready")
        self.api_url, self.emulator_url = match.group(1), match.group(2)
        _support.require_loopback(self.api_url, "the control plane")
        self.session = requests.Session()
        self.session.trust_env = False

    def admin(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"X-ModelForge-Admin-Token": self.token}
        response = self.session.request(method, self.api_url + path, headers=headers, timeout=REQUEST_TIMEOUT, **kwargs)
        if response.status_code >= 400:
            raise BenchFailure(f"{method} {path} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def node(self) -> dict[str, Any] | None:
        nodes = self.admin("GET", "/api/v1/admin/nodes")["nodes"]
        return nodes[0] if nodes else None

    def leased_at(self, work_ids: set[str]) -> dict[str, float]:
        """When each item was leased, from the ``work.leased`` events of the state log."""
        s3 = boto3.client("s3", endpoint_url=self.emulator_url, region_name="us-east-1",
                          aws_access_key_id="local", aws_secret_access_key="local")  # fmt: skip
        found: dict[str, float] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=STATE_LOG_BUCKET, Prefix="events/"):
            for entry in page.get("Contents", []):
                event = json.loads(s3.get_object(Bucket=STATE_LOG_BUCKET, Key=entry["Key"])["Body"].read())
                work_id = event.get("subject", {}).get("work_id")
                if event.get("type") == "work.leased" and work_id in work_ids:
                    found[work_id] = min(found.get(work_id, float("inf")), float(event["occurred_at"]))
        return found


def _ready(stack: Stack, mode: str) -> dict[str, Any] | None:
    node = stack.node()
    if node is None or node.get("status") != "online":
        return None
    if ECHO not in ((node.get("inventory") or {}).get("capabilities") or []):
        return None
    expected = "connected" if mode == "channel" else "fallback"
    return node if node.get("channel") == expected else None


def run_mode(mode: str, args: argparse.Namespace, rng: random.Random) -> ModeResult:
    """Start the stack for ``mode``, run the first item and then ``submits`` counted ones."""
    result = ModeResult(mode)
    submits = args.submits
    with tempfile.TemporaryDirectory(prefix=f"dispatch-{mode}-") as scratch:
        stack = Stack(mode, Path(scratch), args.log_dir)
        try:
            node = wait_for(lambda: _ready(stack, mode), START_TIMEOUT, [stack.child], f"an idle node ({mode})", 0.5)
            result.channel, result.channel_reason = node.get("channel"), node.get("channel_reason")
            # the first item after the node came up, not counted: a node that has not claimed since
            # its channel opened has not parked yet, so nothing wakes it and it waits for a heartbeat
            result.first = _run_item(stack, mode, "first")
            for index in range(submits):
                # a submit right after the previous item would fall at the same point of the heartbeat
                # interval every time (just after the heartbeat that hinted it): spread them over it
                time.sleep(args.gap * rng.uniform(0.5, 1.5) + rng.uniform(0, args.phase))
                result.samples.append(_run_item(stack, mode, f"{index + 1}/{submits}"))
            everything = [result.first, *result.samples]
            ids = {sample.work_id for sample in everything}
            leased = wait_for(lambda: _all_leased(stack, ids), 30, [stack.child], "the state log's work.leased events")
            for sample in everything:
                sample.claimed = leased[sample.work_id]
        finally:
            print(f"  local up ({mode}) {stop_child(stack.child, STOP_TIMEOUT)}", file=sys.stderr)
    return result


def _run_item(stack: Stack, mode: str, label: str) -> Sample:
    """Submit one echo item and follow it until it succeeded."""
    submitted = stack.admin("POST", "/api/v1/admin/work", json={"capability": ECHO, "input": {"item": label}})
    work_id = submitted["work_id"]
    done = wait_for(lambda: _finished(stack, work_id), ITEM_TIMEOUT, [stack.child], f"{work_id} done")
    if done["status"] != "succeeded":
        raise BenchFailure(f"{work_id} ended {done['status']}: {done.get('errors')}")
    sample = Sample(work_id, _epoch(done["created_at"]), None, _epoch(done["finished_at"]))
    took = (sample.succeeded or 0.0) - sample.submitted
    print(f"  {mode} {label}: succeeded after {took:.3f} s", file=sys.stderr, flush=True)
    return sample


def _finished(stack: Stack, work_id: str) -> dict[str, Any] | None:
    item: dict[str, Any] = stack.admin("GET", f"/api/v1/admin/work/{work_id}")
    return item if item["status"] in ("succeeded", "failed", "dead", "cancelled") else None


def _all_leased(stack: Stack, ids: set[str]) -> dict[str, float] | None:
    leased = stack.leased_at(ids)
    return leased if set(leased) == ids else None


def _line(label: str, values: list[float]) -> str:
    p50, p99 = _support.percentile(values, 50), _support.percentile(values, 99)
    return f"{label:<22} p50 {p50:7.3f} s   p99 {p99:7.3f} s   mean {statistics.fmean(values):7.3f} s"


def report(results: list[ModeResult]) -> None:
    for result in results:
        claimed = [s.claimed - s.submitted for s in result.samples if s.claimed is not None]
        succeeded = [s.succeeded - s.submitted for s in result.samples if s.succeeded is not None]
        reason = f" ({result.channel_reason})" if result.channel_reason else ""
        print(f"{result.mode}: {len(result.samples)} diagnostic.echo items, node channel {result.channel}{reason}")
        print("  " + _line("submit -> claimed", claimed))
        print("  " + _line("submit -> succeeded", succeeded))
        if result.first is not None and result.first.claimed is not None:
            first = result.first
            claimed_after = (first.claimed or 0.0) - first.submitted
            succeeded_after = (first.succeeded or 0.0) - first.submitted
            print(f"  not counted: the first item after the node came up: claimed after {claimed_after:.3f} s, "
                  f"succeeded after {succeeded_after:.3f} s")  # fmt: skip
        if result.mode == "channel":
            p50, p99 = _support.percentile(claimed, 50), _support.percentile(claimed, 99)
            verdict = "met" if p50 <= TARGET_CLAIMED_P50 and p99 <= TARGET_CLAIMED_P99 else "NOT met"
            print(f"  target submit -> claimed p50 <= {TARGET_CLAIMED_P50} s, p99 <= {TARGET_CLAIMED_P99} s: {verdict}")


def run(args: argparse.Namespace) -> int:
    _support.install_sigterm_handler()
    rng = random.Random(args.seed)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    results = [run_mode(mode, args, rng) for mode in args.modes]
    report(results)
    return 0


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("dispatch.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
