#!/usr/bin/env python3
"""What a Lambda cold start pays to import the API function, next to ``import boto3`` alone.

Each figure is a whole Python process (interpreter start included), run ``--runs`` times, the
median of its CPU time (user + system) and of its peak RSS. Three processes:

- ``import boto3``: the baseline every Python Lambda that talks to AWS pays;
- ``import app``: the API function's module, as Lambda imports it (cwd ``functions/``);
- first heartbeat's imports: ``import app`` plus what the first heartbeat request loads on top
  (the heartbeat schema's validator and the node model's connection).

Usage: ``.venv/bin/python bench/cold_start.py [--runs 7]``. Takes a few seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from modelforge_bench import support as _support

REPO = Path(__file__).resolve().parents[1]
FUNCTIONS = REPO / "functions"
PROBES = {
    "import boto3": "import boto3",
    "import app": "import app",
    "first heartbeat's imports": (
        "import app\n"
        "from chalicelib.domain import validation\n"
        "from chalicelib.stores.models import NodeModel\n"
        "validation._validator('HEARTBEAT')\n"
        "NodeModel._get_connection()\n"
    ),
}


def measure(code: str, runs: int) -> tuple[float, float]:
    """Median CPU seconds and median peak RSS (MB) of ``python -c code`` in ``functions/``."""
    cpu, rss = [], []
    env = {**os.environ, "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    for _ in range(runs):
        child = subprocess.Popen([sys.executable, "-c", code], cwd=FUNCTIONS, env=env)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own resource usage
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise _support.BenchFailure(f"probe exited {child.returncode}: {code!r}")
        cpu.append(usage.ru_utime + usage.ru_stime)
        rss.append(usage.ru_maxrss / 1024)  # KB on Linux
    return statistics.median(cpu), statistics.median(rss)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="processes per figure (1..50, default 7)")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 50:
        parser.error("--runs must be between 1 and 50")
    return args


def run(args: argparse.Namespace) -> int:
    figures = {name: measure(code, args.runs) for name, code in PROBES.items()}
    base_cpu, _ = figures["import boto3"]
    print(f"cold start, median of {args.runs} whole processes each (CPU = user + system)")
    for name, (cpu, rss) in figures.items():
        print(f"  {name:<26} {cpu * 1000:7.0f} ms CPU  {cpu / base_cpu:5.2f}x boto3   peak RSS {rss:5.0f} MB")
    return 0


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("cold_start.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
