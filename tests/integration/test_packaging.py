"""Packaging follows the layers: a node installs only what a node runs.

The agent's and the protocol's wheels are built from a copy of this checkout and installed into
a fresh virtual environment (their dependencies come from the package index); there the agent
must run and the control plane's and the tooling's packages must be absent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from modelforge_protocol.versions import AGENT_VERSION, RELEASE
from packaging.requirements import Requirement

from tests.support.agent_wheels import agent_wheels, outside_env
from tests.support.processes import run_to_exit

REPO = Path(__file__).resolve().parents[2]
#: What a node must never carry: control-plane, AWS and tooling code.
NOT_ON_A_NODE = (
    "chalice",
    "chalicelib",
    "moto",
    "boto3",
    "botocore",
    "pynamodb",
    "werkzeug",
    "modelforge_cli",
    "modelforge_local_stack",
)
#: What the agent needs, by import name.
ON_A_NODE = (
    "modelforge_node_agent",
    "modelforge_protocol",
    "modelforge_logging",
    "requests",
    "pynvml",
    "jsonschema",
    "websockets",
)

_PROBE = """
import importlib, importlib.util, json, sys
found = {name: importlib.util.find_spec(name) is not None for name in sys.argv[1:]}
for name in sys.argv[1:]:
    if found[name]:
        importlib.import_module(name)  # present must also mean importable
import importlib.metadata as md
print(json.dumps({"found": found, "dists": sorted(d.metadata["Name"].lower() for d in md.distributions())}))
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``args`` to its exit, outside this test run's Python environment."""
    return run_to_exit(args, cwd=cwd, timeout=300, base_env=outside_env())


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    """The two wheels, built once per test process (tests/deploy/test_dockerfiles.py uses them too)."""
    return agent_wheels()


@pytest.fixture(scope="module")
def node_env(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment holding the two wheels and what they pull in, nothing else."""
    venv = tmp_path_factory.mktemp("node") / "venv"
    done = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    python = venv / "bin" / "python"
    # this environment's pip installs into the fresh one (pip's cache serves repeat runs), with the
    # versions the agent's image pins
    done = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "-c",
            str(REPO / "agent" / "constraints.txt"),
            *map(str, wheels.values()),
        ],
        cwd=venv.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return python


#: What each wheel may carry: its own package (the bottom layer also carries the log format).
CARRIES = {
    "modelforge_protocol": ("modelforge_protocol/", "modelforge_logging/"),
    "modelforge_node_agent": ("modelforge_node_agent/",),
}


def test_each_wheel_holds_its_own_packages_only(wheels: dict[str, Path]) -> None:
    for package, wheel in wheels.items():
        names = zipfile.ZipFile(wheel).namelist()
        code = [name for name in names if ".dist-info/" not in name]
        assert code and all(name.startswith(CARRIES[package]) for name in code), (wheel.name, code)
        assert any(name.startswith(package + "/") for name in code), (wheel.name, code)
        assert wheel.name.startswith(f"{package}-{RELEASE}-")


def test_the_agent_wheel_declares_exactly_what_the_agent_runs(wheels: dict[str, Path]) -> None:
    wheel = zipfile.ZipFile(wheels["modelforge_node_agent"])
    metadata = wheel.read(f"modelforge_node_agent-{RELEASE}.dist-info/METADATA").decode()
    requires = {
        Requirement(line.split(":", 1)[1]).name for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    }
    assert requires == {"modelforge-protocol", "requests", "nvidia-ml-py", "jsonschema", "websockets"}
    entry_points = wheel.read(f"modelforge_node_agent-{RELEASE}.dist-info/entry_points.txt").decode()
    assert "modelforge-node-agent = modelforge_node_agent.main:main" in entry_points


def test_a_node_gets_the_agent_and_none_of_the_control_plane_or_tooling(node_env: Path) -> None:
    done = _run([str(node_env), "-I", "-c", _PROBE, *ON_A_NODE, *NOT_ON_A_NODE], cwd=node_env.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout)
    assert [name for name in ON_A_NODE if not seen["found"][name]] == []
    assert [name for name in NOT_ON_A_NODE if seen["found"][name]] == []
    dists = set(seen["dists"])
    assert {
        "modelforge-protocol",
        "modelforge-node-agent",
        "requests",
        "nvidia-ml-py",
        "jsonschema",
        "websockets",
    } <= dists
    assert not dists & {"chalice", "moto", "boto3", "botocore", "pynamodb", "modelforge-compute", "werkzeug", "flask"}


def test_the_installed_agent_runs(node_env: Path) -> None:
    expected = f"modelforge-node-agent {AGENT_VERSION}"
    done = _run([str(node_env), "-I", "-m", "modelforge_node_agent.main", "--version"], cwd=node_env.parent)
    assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr
    done = _run([str(node_env.parent / "modelforge-node-agent"), "--version"], cwd=node_env.parent)
    assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr


def test_every_distribution_reads_its_version_from_the_one_place() -> None:
    for pyproject in (
        REPO / "pyproject.toml",
        REPO / "protocol" / "pyproject.toml",
        REPO / "agent" / "pyproject.toml",
        REPO / "tools" / "cli" / "pyproject.toml",
        REPO / "tools" / "local_stack" / "pyproject.toml",
    ):
        project = tomllib.loads(pyproject.read_text())
        assert "version" not in project["project"] and "version" in project["project"]["dynamic"], pyproject
        assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "modelforge_protocol.versions.RELEASE"}
    from importlib.metadata import version

    for distribution in (
        "modelforge-protocol",
        "modelforge-node-agent",
        "modelforge-cli",
        "modelforge-local-stack",
        "modelforge-compute",
    ):
        assert version(distribution) == RELEASE, f"{distribution}: reinstall with ./scripts/test"


def test_the_tooling_runs_the_functions_on_what_the_lambda_bundle_installs() -> None:
    """functions/requirements.txt is what Chalice puts in the Lambda bundle; the local stack runs
    the same functions, so its dependencies name the same distributions."""
    dependencies = tomllib.loads((REPO / "tools" / "local_stack" / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    tooling = {Requirement(requirement).name.lower() for requirement in dependencies}
    lines = (REPO / "functions" / "requirements.txt").read_text().splitlines()
    functions = {Requirement(line).name.lower() for line in lines if line.strip() and not line.lstrip().startswith("#")}
    assert functions <= tooling, functions - tooling
