"""The protocol's and the agent's wheels, built once per test process from a copy of this
checkout (the agent reads its version from ../protocol, so the copy keeps the layout), without
touching the checkout. Shared by tests/integration/test_packaging.py (a fresh virtual
environment) and tests/deploy/test_dockerfiles.py (the agent image's --target layout);
``build_wheels`` also builds the admin CLI's and the worker's for their packaging tests."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def outside_env() -> dict[str, str]:
    """This process's environment without what ties a child to this test run's Python."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}


def build_wheels(tree: Path, projects: tuple[str, ...], built: tuple[str, ...]) -> dict[str, Path]:
    """Copy ``projects`` (folders of this checkout, layout kept: each reads its version from the
    protocol beside it) into ``tree`` and build the wheels of ``built`` there, without touching the
    checkout; ``{"modelforge_protocol": wheel, ...}`` by import name."""
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "dist")
    for project in projects:
        shutil.copytree(REPO / project, tree / project, ignore=junk)
    out = tree / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(out), *(str(tree / project) for project in built)],
        cwd=tree,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {path.name.split("-")[0]: path for path in out.glob("*.whl")}


@cache
def agent_wheels() -> dict[str, Path]:
    """``{"modelforge_protocol": wheel, "modelforge_node_agent": wheel}`` (removed at exit)."""
    tree = Path(tempfile.mkdtemp(prefix="modelforge-wheels-"))
    atexit.register(shutil.rmtree, tree, ignore_errors=True)
    built = build_wheels(tree, ("protocol", "agent"), ("protocol", "agent"))
    assert set(built) == {"modelforge_protocol", "modelforge_node_agent"}, sorted(built)
    return built
