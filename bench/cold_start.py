#!/usr/bin/env python3
"""What a Lambda cold start pays to import the API function, next to ``import boto3`` alone.

Each figure is a whole Python process (interpreter start included), run ``--runs`` times (the
three in turn, so that a change in the machine's speed falls on all of them), the median of its CPU
time (user + system) and of its peak RSS. Three processes:

- ``import boto3``: the baseline every Python Lambda that talks to AWS pays;
- ``import app``: the API function's module, as Lambda imports it (cwd ``functions/``);
- first heartbeat's imports: ``import app`` plus what the first heartbeat request loads on top
  (the heartbeat schema's validator and the node model's connection).

Bytecode: the Lambda bundle carries compiled bytecode for every module (``modelforge infra
package`` adds it), and the installed libraries have theirs, so by default the functions' own
sources are compiled once into a private cache before measuring (``PYTHONPYCACHEPREFIX``), whatever
``PYTHONDONTWRITEBYTECODE`` says. ``--no-bytecode`` measures them compiled from source in every
process instead: what a bundle without bytecode pays.

Usage: ``.venv/bin/python bench/cold_start.py [--runs 7] [--no-bytecode]``. Takes a few seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from modelforge_bench import support as _support

REPO = Path(__file__).resolve().parents[1]
FUNCTIONS = REPO / "functions"
PROBES = {
    "import boto3": "import boto3",
    "import app": "import app",
    "first heartbeat's imports": "import app\nfrom chalicelib import instance\ninstance.load_heartbeat_path()\n",
}


def _run(code: str, env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds and peak RSS (MB) of one ``python -c code`` in ``functions/``."""
    child = subprocess.Popen([sys.executable, "-c", code], cwd=FUNCTIONS, env=env)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own resource usage
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise _support.BenchFailure(f"probe exited {child.returncode}: {code!r}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # KB on Linux


def measure(runs: int, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Median CPU seconds and median peak RSS (MB) of each probe, the probes run in turn."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in PROBES}
    for _ in range(runs):
        for name, code in PROBES.items():
            samples[name].append(_run(code, env))
    return {
        name: (statistics.median(cpu for cpu, _ in got), statistics.median(rss for _, rss in got))
        for name, got in samples.items()
    }


def probe_env(bytecode_cache: str | None) -> dict[str, str]:
    env = {**os.environ, "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if bytecode_cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = bytecode_cache
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="processes per figure (1..50, default 7)")
    parser.add_argument(
        "--no-bytecode", action="store_true", help="compile the functions' sources in every process (no pycs)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 50:
        parser.error("--runs must be between 1 and 50")
    return args


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="modelforge-pyc-") as cache:
        env = probe_env(None if args.no_bytecode else cache)
        if not args.no_bytecode:
            measure(1, env)  # compiles every module the probes import into the private cache
        figures = measure(args.runs, env)
    base_cpu, _ = figures["import boto3"]
    source = "compiled from source in each process" if args.no_bytecode else "from bytecode, as the bundle ships"
    print(f"cold start, median of {args.runs} whole processes each (CPU = user + system); functions {source}")
    for name, (cpu, rss) in figures.items():
        print(f"  {name:<26} {cpu * 1000:7.0f} ms CPU  {cpu / base_cpu:5.2f}x boto3   peak RSS {rss:5.0f} MB")
    return 0


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("cold_start.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
