"""The protocol's and the agent's wheels, built once per test process from a copy of this
checkout (the agent reads its version from ../protocol, so the copy keeps the layout), without
touching the checkout. Shared by tests/integration/test_packaging.py (a fresh virtual
environment) and tests/deploy/test_dockerfiles.py (the agent image's --target layout)."""

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


@cache
def agent_wheels() -> dict[str, Path]:
    """``{"modelforge_protocol": wheel, "modelforge_node_agent": wheel}`` (removed at exit)."""
    tree = Path(tempfile.mkdtemp(prefix="modelforge-wheels-"))
    atexit.register(shutil.rmtree, tree, ignore_errors=True)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "dist")
    for project in ("protocol", "agent"):
        shutil.copytree(REPO / project, tree / project, ignore=junk)
    out = tree / "wheels"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(tree / "protocol"),
            str(tree / "agent"),
        ],
        cwd=tree,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    built = {path.name.split("-")[0]: path for path in out.glob("*.whl")}
    assert set(built) == {"modelforge_protocol", "modelforge_node_agent"}, sorted(built)
    return built
