"""The node's Compose files, resolved by a real Compose implementation: every combination the seed
names (`docker-compose config`, Debian's docker-compose 1.29, which needs no Docker engine), with
its variables set and unset. Required variables fail naming themselves; optional ones fall back;
the fallback image tags are this release's; the token reaches the container through the env file
only; the agent and the worker share the socket volume."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from modelforge_protocol.credentials import ENROLLMENT_TOKEN_RE, NODE_CREDENTIAL_RE
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.deploy.node_host import ROOT, new_token

BASE = "docker-compose.yml"
AGENT_FILE = "docker-compose.node-agent.yml"
PRIVATE_CA_FILE = "docker-compose.node-agent.private-ca.yml"
WORKER_FILE = "docker-compose.runtime-worker.yml"
CPU_AGENT_FILE = "docker-compose.node-agent.cpu.yml"
COMPOSE_FILES = (BASE, AGENT_FILE, PRIVATE_CA_FILE, WORKER_FILE, CPU_AGENT_FILE)
#: the seed's three commands, less `up -d SERVICE`
AGENT = (BASE, AGENT_FILE)
PRIVATE_CA = (BASE, AGENT_FILE, PRIVATE_CA_FILE)
WORKER = (BASE, WORKER_FILE)
CPU_AGENT = (BASE, CPU_AGENT_FILE)
STATE_TARGET = "/var/lib/modelforge/agent-state"
CA_TARGET = "/etc/modelforge/control-plane-ca.pem"
#: the enrollment token of the "agent, all set" case: generated per run, never committed
TOKEN = new_token()
PINNED = "registry.example/modelforge/{}@sha256:" + "0f" * 32


@dataclass(frozen=True)
class Case:
    files: tuple[str, ...]
    #: the project's .env (what Compose reads for interpolation, and the agent's default env_file)
    dot_env: tuple[str, ...] = ()
    #: variables in Compose's own environment
    environment: tuple[tuple[str, str], ...] = ()
    #: the agent's env file given through MODELFORGE_AGENT_ENV_FILE
    agent_env_file: tuple[str, ...] = ()


CASES = {
    "agent, all set": Case(
        AGENT,
        environment=(
            ("MODELFORGE_AGENT_STATE_VOLUME", "/srv/agent-state"),
            ("MODELFORGE_NODE_AGENT_IMAGE", PINNED.format("node-agent")),
        ),
        agent_env_file=(
            "MODELFORGE_AGENT_HOSTNAME=gpu_node",
            "MODELFORGE_AGENT_STATE_VOLUME=/srv/agent-state",
            f"MODELFORGE_AGENT_ENROLLMENT_TOKEN={TOKEN}",
        ),
    ),
    "agent, optional unset": Case(
        AGENT, dot_env=("MODELFORGE_AGENT_STATE_VOLUME=/srv/agent-state", "MODELFORGE_AGENT_HOSTNAME=gpu_node")
    ),
    "agent, required unset": Case(AGENT, dot_env=("MODELFORGE_AGENT_HOSTNAME=gpu_node",)),
    "agent, .env.example": Case(AGENT, dot_env=tuple((ROOT / ".env.example").read_text().splitlines())),
    "private CA, all set": Case(
        PRIVATE_CA,
        dot_env=(
            "MODELFORGE_AGENT_STATE_VOLUME=/srv/agent-state",
            "MODELFORGE_AGENT_CA_CERT_PATH=/srv/ca.pem",
            "MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS=10.0.0.10",
        ),
    ),
    "private CA, optional unset": Case(
        PRIVATE_CA,
        dot_env=("MODELFORGE_AGENT_STATE_VOLUME=/srv/agent-state", "MODELFORGE_AGENT_CA_CERT_PATH=/srv/ca.pem"),
    ),
    "private CA, required unset": Case(PRIVATE_CA, dot_env=("MODELFORGE_AGENT_STATE_VOLUME=/srv/agent-state",)),
    "worker, all set": Case(
        WORKER,
        dot_env=(
            f"MODELFORGE_RUNTIME_WORKER_IMAGE={PINNED.format('runtime-worker')}",
            "MODELFORGE_WORKER_ARTIFACT_VOLUME=/srv/artifacts",
            "MODELFORGE_WORKER_QUARANTINE_VOLUME=/srv/quarantine",
            "MODELFORGE_WORKER_DEVICE=auto",
            "MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS=300",
        ),
    ),
    "worker, optional unset": Case(WORKER),
    "CPU agent, optional unset": Case(
        CPU_AGENT,
        dot_env=(
            "MODELFORGE_AGENT_STATE_VOLUME=/srv/agent-state",
            "MODELFORGE_AGENT_HOSTNAME=cpu_node",
            "MODELFORGE_AGENT_ACCELERATOR_MODE=cpu",
        ),
    ),
    "CPU agent, required unset": Case(CPU_AGENT, dot_env=("MODELFORGE_AGENT_ACCELERATOR_MODE=cpu",)),
}


@dataclass(frozen=True)
class Resolved:
    returncode: int
    stdout: str
    stderr: str

    @property
    def config(self) -> dict[str, Any]:
        assert self.returncode == 0, self.stderr
        return yaml.safe_load(self.stdout)

    def service(self, name: str) -> dict[str, Any]:
        return self.config["services"][name]


def _compose() -> str:
    found = shutil.which("docker-compose")
    assert found, "docker-compose is missing: scripts/_system_packages.sh installs it (apt-get install docker-compose)"
    return found


def _resolve(project: Path, case: Case) -> Resolved:
    project.mkdir()
    for name in COMPOSE_FILES:
        shutil.copy(ROOT / name, project / name)
    (project / ".env").write_text("\n".join(case.dot_env) + "\n")
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(project), **dict(case.environment)}
    if case.agent_env_file:
        (project / "agent.env").write_text("\n".join(case.agent_env_file) + "\n")
        environment["MODELFORGE_AGENT_ENV_FILE"] = str(project / "agent.env")
    argv = [_compose(), *(option for name in case.files for option in ("-f", name)), "config"]
    result = subprocess.run(argv, cwd=project, env=environment, capture_output=True, text=True, timeout=60)
    return Resolved(result.returncode, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Resolved]:
    """Each case resolved once, each in a project folder of its own with copies of the files."""
    root = tmp_path_factory.mktemp("compose")
    return {name: _resolve(root / f"case{number}", case) for number, (name, case) in enumerate(CASES.items())}


def _mount(service: dict[str, Any], target: str) -> dict[str, Any] | str:
    for volume in service["volumes"]:
        if (volume["target"] if isinstance(volume, dict) else volume.split(":")[1]) == target:
            return volume
    raise AssertionError(f"nothing mounted at {target}: {service['volumes']}")


def _has_gpu_reservation(service: dict[str, Any]) -> bool:
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    return any(
        device["driver"] == "nvidia" and "gpu" in device["capabilities"] and device["count"] == "all"
        for device in devices
    )


@pytest.mark.parametrize("name", [name for name in CASES if "required unset" not in name])
def test_compose_combination_resolves(resolved: dict[str, Resolved], name: str) -> None:
    assert resolved[name].returncode == 0, resolved[name].stderr


@pytest.mark.parametrize(
    ("name", "variable"),
    [
        ("agent, required unset", "MODELFORGE_AGENT_STATE_VOLUME"),
        ("private CA, required unset", "MODELFORGE_AGENT_CA_CERT_PATH"),
        ("CPU agent, required unset", "MODELFORGE_AGENT_STATE_VOLUME"),
    ],
)
def test_compose_required_variable_unset_fails_naming_it(
    resolved: dict[str, Resolved], name: str, variable: str
) -> None:
    result = resolved[name]
    assert result.returncode != 0
    assert re.search(rf"set {variable} to ", result.stderr), result.stderr


def test_compose_agent_all_set_uses_settings_and_takes_token_from_env_file(resolved: dict[str, Resolved]) -> None:
    agent = resolved["agent, all set"].service("node-agent")
    assert agent["image"] == PINNED.format("node-agent")
    assert agent["build"]["dockerfile"] == "agent/Dockerfile" and (ROOT / "agent" / "Dockerfile").is_file()
    assert agent["restart"] == "unless-stopped"
    assert _has_gpu_reservation(agent)
    assert _mount(agent, STATE_TARGET) == {"type": "bind", "source": "/srv/agent-state", "target": STATE_TARGET}
    environment = agent["environment"]
    assert environment["MODELFORGE_AGENT_ENROLLMENT_TOKEN"] == TOKEN  # from the env file, not a command line
    assert environment["MODELFORGE_AGENT_HOSTNAME"] == "gpu_node"
    assert environment["MODELFORGE_AGENT_STATE_VOLUME"] == STATE_TARGET  # the mount, not the host path


def test_compose_agent_optional_unset_falls_back_to_release_tag_and_dot_env(resolved: dict[str, Resolved]) -> None:
    agent = resolved["agent, optional unset"].service("node-agent")
    assert agent["image"] == f"modelforge-node-agent:{IMAGE_TAG_VERSION}"
    assert agent["environment"]["MODELFORGE_AGENT_HOSTNAME"] == "gpu_node"
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in agent["environment"]


def test_compose_env_example_names_this_release_and_no_token(resolved: dict[str, Resolved]) -> None:
    agent = resolved["agent, .env.example"].service("node-agent")
    assert agent["image"] == f"modelforge-node-agent:{IMAGE_TAG_VERSION}"
    assert "MODELFORGE_AGENT_ENROLLMENT_TOKEN" not in agent["environment"]
    example = (ROOT / ".env.example").read_text()
    assert f"MODELFORGE_RUNTIME_WORKER_IMAGE=modelforge-runtime-worker:{IMAGE_TAG_VERSION}" in example


def test_compose_private_ca_mounts_certificate_read_only_and_sets_both_variables(resolved: dict[str, Resolved]) -> None:
    agent = resolved["private CA, all set"].service("node-agent")
    assert _mount(agent, CA_TARGET) == {"type": "bind", "source": "/srv/ca.pem", "target": CA_TARGET, "read_only": True}
    assert agent["environment"]["MODELFORGE_AGENT_CA_CERT_PATH"] == CA_TARGET
    assert agent["environment"]["MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS"] == "10.0.0.10"
    assert _mount(agent, STATE_TARGET)  # the node-agent file's mounts are kept


def test_compose_private_ca_host_address_unset_is_empty(resolved: dict[str, Resolved]) -> None:
    agent = resolved["private CA, optional unset"].service("node-agent")
    assert agent["environment"]["MODELFORGE_AGENT_CONTROL_PLANE_HOST_ADDRESS"] == ""  # the agent reads "" as unset


def test_compose_worker_optional_unset_falls_back_to_release_tag_and_named_volumes(
    resolved: dict[str, Resolved],
) -> None:
    config = resolved["worker, optional unset"].config
    worker = config["services"]["runtime-worker"]
    assert worker["image"] == f"modelforge-runtime-worker:{IMAGE_TAG_VERSION}"
    assert worker["build"]["dockerfile"] == "worker/Dockerfile" and (ROOT / "worker" / "Dockerfile").is_file()
    assert worker["restart"] == "unless-stopped"
    assert worker["network_mode"] == "none"
    assert _has_gpu_reservation(worker)
    environment = worker["environment"]
    assert environment["MODELFORGE_WORKER_DEVICE"] == "cuda"
    for variable, volume in (
        ("MODELFORGE_WORKER_ARTIFACT_ROOT", "worker-artifacts"),
        ("MODELFORGE_WORKER_QUARANTINE_ROOT", "worker-quarantine"),
    ):
        assert _mount(worker, environment[variable]) == f"{volume}:{environment[variable]}:rw"
        assert config["volumes"][volume]["name"] == f"modelforge-{volume}"


def test_compose_worker_all_set_uses_host_directories_and_settings(resolved: dict[str, Resolved]) -> None:
    worker = resolved["worker, all set"].service("runtime-worker")
    assert worker["image"] == PINNED.format("runtime-worker")
    environment = worker["environment"]
    assert (
        _mount(worker, environment["MODELFORGE_WORKER_ARTIFACT_ROOT"])
        == "/srv/artifacts:/var/lib/modelforge/artifacts:rw"
    )
    assert (
        _mount(worker, environment["MODELFORGE_WORKER_QUARANTINE_ROOT"])
        == "/srv/quarantine:/var/lib/modelforge/quarantine:rw"
    )
    assert (environment["MODELFORGE_WORKER_DEVICE"], environment["MODELFORGE_WORKER_JOB_TIMEOUT_SECONDS"]) == (
        "auto",
        "300",
    )


def test_compose_agent_and_worker_share_socket_volume_at_worker_listen_path(resolved: dict[str, Resolved]) -> None:
    agent_config, worker_config = resolved["agent, optional unset"].config, resolved["worker, optional unset"].config
    listen = worker_config["services"]["runtime-worker"]["environment"]["MODELFORGE_WORKER_LISTEN"]
    folder = listen.removeprefix("unix://").rsplit("/", 1)[0]
    shared = {"type": "volume", "source": "worker-socket", "target": folder}
    assert _mount(agent_config["services"]["node-agent"], folder) == shared
    assert _mount(worker_config["services"]["runtime-worker"], folder) == shared
    assert (
        agent_config["volumes"]["worker-socket"]
        == worker_config["volumes"]["worker-socket"]
        == {"name": "modelforge-worker-socket"}
    )
    assert f"# MODELFORGE_AGENT_WORKER_URL={listen}\n" in (ROOT / ".env.example").read_text()


def test_compose_files_fallback_tags_are_this_release() -> None:
    """Read from the files themselves too, so a release bump that forgets them fails here."""
    for name, image in ((AGENT_FILE, "node-agent"), (CPU_AGENT_FILE, "node-agent"), (WORKER_FILE, "runtime-worker")):
        defaults = re.findall(r"image: \$\{MODELFORGE_[A-Z_]+_IMAGE:-([^}]+)\}", (ROOT / name).read_text())
        assert defaults == [f"modelforge-{image}:{IMAGE_TAG_VERSION}"]


def test_compose_resolved_configs_hold_no_secret_but_the_tokens_case(resolved: dict[str, Resolved]) -> None:
    for name, result in resolved.items():
        secrets_found = [
            token
            for token in re.findall(r"mf[en]\.[A-Za-z0-9_.-]+", result.stdout)
            if ENROLLMENT_TOKEN_RE.match(token) or NODE_CREDENTIAL_RE.match(token)
        ]
        assert secrets_found == ([TOKEN] if name == "agent, all set" else []), name


def test_compose_cpu_agent_reserves_no_gpu_and_is_otherwise_the_agent(resolved: dict[str, Resolved]) -> None:
    """Issue 21: docker-compose.node-agent.cpu.yml starts where Docker has no NVIDIA runtime."""
    cpu = resolved["CPU agent, optional unset"].service("node-agent")
    gpu = resolved["agent, optional unset"].service("node-agent")
    assert "deploy" not in cpu and _has_gpu_reservation(gpu)
    assert cpu["environment"]["MODELFORGE_AGENT_ACCELERATOR_MODE"] == "cpu"
    assert cpu["environment"]["MODELFORGE_AGENT_HOSTNAME"] == "cpu_node"
    same = ("image", "restart", "read_only", "cap_drop", "security_opt", "tmpfs", "logging", "volumes")
    assert {key: cpu.get(key) for key in same} == {key: gpu.get(key) for key in same}
    assert cpu["build"]["dockerfile"] == gpu["build"]["dockerfile"]
