"""The admin CLI installs alone: modelforge-cli's wheel, built from a copy of this checkout and
installed with the protocol's wheel into a fresh virtual environment (requests from the package
index), gives every command that talks to a control plane and nothing of the local stack."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from modelforge_cli.aws_sigv4 import NEEDS_EXTRA
from modelforge_protocol.versions import RELEASE
from packaging.requirements import Requirement

from tests.support.agent_wheels import agent_wheels, build_wheels, outside_env
from tests.support.processes import run_to_exit

REPO = Path(__file__).resolve().parents[2]
#: what the base install must not pull in (distribution names)
LOCAL_STACK_ONLY = {"moto", "chalice", "pynamodb", "werkzeug", "boto3", "botocore", "onnxruntime", "flask"}
OURS = {"modelforge-local-stack", "modelforge-control-plane", "modelforge-node-agent", "modelforge-compute"}
_DISTS = (
    "import importlib.metadata as md, json; "
    "print(json.dumps(sorted(d.metadata['Name'].lower() for d in md.distributions())))"
)


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_to_exit(args, cwd=cwd, timeout=300, base_env={**outside_env(), **env})


@pytest.fixture(scope="module")
def cli_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """modelforge-cli's wheel, built from a copy (tools/cli reads its version from ../../protocol)."""
    built = build_wheels(tmp_path_factory.mktemp("cli-wheel"), ("protocol", "tools/cli"), ("tools/cli",))
    assert set(built) == {"modelforge_cli"}, sorted(built)
    return built["modelforge_cli"]


@pytest.fixture(scope="module")
def admin_env(cli_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with the admin CLI's and the protocol's wheels and what they pull in."""
    venv = tmp_path_factory.mktemp("admin") / "venv"
    done = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    python = venv / "bin" / "python"
    protocol = agent_wheels()["modelforge_protocol"]
    done = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
        + ["-c", str(REPO / "agent" / "constraints.txt"), str(protocol), str(cli_wheel)],
        cwd=venv.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


def test_the_cli_wheel_holds_modelforge_cli_only_and_declares_requests_and_the_protocol(cli_wheel: Path) -> None:
    wheel = zipfile.ZipFile(cli_wheel)
    code = [name for name in wheel.namelist() if ".dist-info/" not in name]
    assert code and all(name.startswith("modelforge_cli/") for name in code), code
    assert "modelforge_cli/emulator.py" not in code and "modelforge_cli/plugins.py" in code
    metadata = wheel.read(f"modelforge_cli-{RELEASE}.dist-info/METADATA").decode()
    requires = [
        Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    assert {r.name for r in requires if r.marker is None} == {"modelforge-protocol", "requests"}
    assert {r.name for r in requires if r.marker is not None} == {"botocore"}  # the [aws] extra
    assert (
        "modelforge = modelforge_cli.cli:main"
        in wheel.read(f"modelforge_cli-{RELEASE}.dist-info/entry_points.txt").decode()
    )


def test_the_admin_install_pulls_in_nothing_of_the_local_stack(admin_env: Path) -> None:
    done = _run([str(admin_env / "python"), "-I", "-c", _DISTS], cwd=admin_env)
    assert done.returncode == 0, done.stderr
    dists = set(json.loads(done.stdout))
    assert {"modelforge-cli", "modelforge-protocol", "requests"} <= dists
    assert not dists & (LOCAL_STACK_ONLY | OURS), dists


def test_the_admin_install_runs_help_and_the_admin_commands_help(admin_env: Path) -> None:
    done = _run([str(admin_env / "modelforge"), "--help"], cwd=admin_env)
    assert done.returncode == 0, done.stderr
    for command in ("enrollments", "nodes", "work", "release", "admin-token"):
        assert command in done.stdout
    assert "(needs modelforge-local-stack)" in " ".join(done.stdout.split())
    done = _run([str(admin_env / "modelforge"), "nodes", "list", "--help"], cwd=admin_env)
    assert done.returncode == 0 and "--aws-sigv4" in done.stdout, done.stderr
    for words in (["enrollments", "--help"], ["work", "--help"], ["release", "--help"], ["admin-token", "new"]):
        done = _run([str(admin_env / "modelforge"), *words], cwd=admin_env)
        assert done.returncode == 0 and done.stdout, (words, done.stderr)


def test_the_admin_install_says_local_up_needs_the_local_stack_and_how_to_install_it(admin_env: Path) -> None:
    done = _run([str(admin_env / "modelforge"), "local", "up", "--help"], cwd=admin_env)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        "modelforge: `local` comes with the local stack, which is not installed: pip install modelforge-local-stack\n"
    )


def test_the_admin_install_without_the_aws_extra_says_aws_sigv4_needs_it(admin_env: Path) -> None:
    url = "https://abc123defg.execute-api.us-east-1.amazonaws.com/api"
    token = "t" * 43
    done = _run(
        [str(admin_env / "modelforge"), "nodes", "list", "--aws-sigv4", "--api-url", url],
        cwd=admin_env,
        MODELFORGE_ADMIN_TOKEN=token,
    )
    assert (done.returncode, done.stderr) == (2, f"modelforge: {NEEDS_EXTRA}\n"), done.stdout
