"""The worker is its own distribution: it carries its own package only, depends on the protocol
and its model runtime and on nothing of the control plane or tooling, and the agent's
distribution does not pull the model runtime onto a host that runs only the agent."""

from __future__ import annotations

import importlib.metadata as metadata
import sys
import tomllib
import zipfile
from pathlib import Path

from modelforge_protocol.versions import RELEASE
from packaging.requirements import Requirement

from tests.support.agent_wheels import build_wheels
from tests.support.processes import run_to_exit

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE_AND_TOOLING = {
    "chalice",
    "boto3",
    "botocore",
    "pynamodb",
    "moto",
    "modelforge-compute",
    "werkzeug",
    "flask",
}
MODEL_RUNTIME = {"onnxruntime", "onnxruntime-gpu", "rapidocr", "opencv-python-headless", "opencv-python"}


def requirement_names(lines: list[str] | None, *, with_extras: bool = False) -> set[str]:
    names = set()
    for line in lines or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not with_extras and "extra" in str(requirement.marker):
            continue
        names.add(requirement.name.lower())
    return names


def test_the_worker_distribution_requires_nothing_of_the_control_plane() -> None:
    requires = metadata.requires("modelforge-runtime-worker")
    everything = requirement_names(requires, with_extras=True)
    assert not everything & CONTROL_PLANE_AND_TOOLING, everything
    assert requirement_names(requires) == {"modelforge-protocol", "rapidocr", "onnxruntime", "pillow", "jsonschema"}
    assert "rapidocr==3.10.0" in [str(Requirement(line)) for line in requires or []]
    assert metadata.version("modelforge-runtime-worker") == RELEASE, "reinstall with ./scripts/test"


def test_the_cuda_extra_brings_the_gpu_runtime() -> None:
    cuda = [Requirement(line) for line in metadata.requires("modelforge-runtime-worker") or [] if "extra" in line]
    assert [
        (requirement.name, requirement.marker.evaluate({"extra": "cuda"})) for requirement in cuda if requirement.marker
    ] == [("onnxruntime-gpu", True)]


def test_the_agent_distribution_does_not_require_the_model_runtime() -> None:
    agent = requirement_names(metadata.requires("modelforge-node-agent"), with_extras=True)
    assert not agent & (MODEL_RUNTIME | {"modelforge-runtime-worker", "pillow"}), agent


def test_the_worker_reads_its_version_from_the_one_place() -> None:
    project = tomllib.loads((REPO / "worker" / "pyproject.toml").read_text())
    assert project["project"]["name"] == "modelforge-runtime-worker"
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "modelforge_protocol.versions.RELEASE"}
    assert project["tool"]["setuptools"]["packages"] == ["modelforge_runtime_worker"]


def test_the_dev_install_script_installs_the_worker() -> None:
    script = (REPO / "scripts" / "_venv.sh").read_text()
    assert '-e "$ROOT/worker"' in script


def test_starting_the_worker_imports_nothing_of_the_agent_or_control_plane() -> None:
    probe = (
        "import sys, modelforge_runtime_worker.main\n"
        "banned = ('modelforge_node_agent', 'chalicelib', 'chalice', 'modelforge_cli', 'boto3', 'moto', 'pynamodb')\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in banned))\n"
    )
    done = run_to_exit([sys.executable, "-c", probe])
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_the_wheel_holds_the_worker_package_only(tmp_path: Path) -> None:
    built = build_wheels(tmp_path, ("protocol", "worker"), ("worker",))  # it reads its version from ../protocol
    assert set(built) == {"modelforge_runtime_worker"}, sorted(built)
    wheel_path = built["modelforge_runtime_worker"]
    assert wheel_path.name.startswith(f"modelforge_runtime_worker-{RELEASE}-py3-none-any")
    wheel = zipfile.ZipFile(wheel_path)
    code = [name for name in wheel.namelist() if ".dist-info/" not in name]
    assert code and all(name.startswith("modelforge_runtime_worker/") for name in code), code
    dist_info = f"modelforge_runtime_worker-{RELEASE}.dist-info"
    requires = [
        line.split(":", 1)[1].strip()
        for line in wheel.read(f"{dist_info}/METADATA").decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert not requirement_names(requires, with_extras=True) & CONTROL_PLANE_AND_TOOLING
    assert requirement_names(requires) == {"modelforge-protocol", "rapidocr", "onnxruntime", "pillow", "jsonschema"}
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert "modelforge-runtime-worker = modelforge_runtime_worker.main:main" in entry_points
