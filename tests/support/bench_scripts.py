"""Run a bench/ script as its own process, as a developer does (``.venv/bin/python bench/<name>.py``).

Tests never import a script: what they share with the scripts lives in the modelforge_bench
package (bench/modelforge_bench)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO / "bench"


def run(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``run("ocr", "--images", "1")``: bench/ocr.py to its exit, from the repository root, output as text."""
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / f"{script}.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
