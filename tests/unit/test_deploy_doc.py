"""docs/DEPLOY.md stays true to what it describes: the NVIDIA driver floor names the worker image's
CUDA version, and every compose file and stack output it tells an operator to use exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = (REPO / "docs" / "DEPLOY.md").read_text()


def _section(heading: str) -> str:
    start = DEPLOY.index(heading)
    end = DEPLOY.find("\n## ", start + 1)
    return DEPLOY[start : end if end != -1 else None]


def test_the_driver_floor_names_the_worker_images_cuda_version() -> None:
    base = re.search(r"^FROM nvidia/cuda:(\d+)\.(\d+)\.\d+-", (REPO / "worker" / "Dockerfile").read_text(), re.M)
    assert base is not None
    cuda = f"{base.group(1)}.{base.group(2)}"
    driver = DEPLOY[DEPLOY.index("**The NVIDIA driver.**") :].split("\n\n")[0]
    assert f"CUDA {cuda}" in driver and f"cuda>={cuda}" in driver, driver
    assert re.search(r"driver (\d{3}) or newer", driver), driver


def test_every_compose_file_the_doc_names_exists() -> None:
    named = set(re.findall(r"docker-compose[\w.-]*\.yml", DEPLOY))
    assert "docker-compose.node-agent.cpu.yml" in named
    assert sorted(name for name in named if not (REPO / name).is_file()) == []


def test_the_custom_domain_and_the_hosts_use_outputs_the_stack_has() -> None:
    """Each output these sections read is in the outputs table of "After deploying", and the one
    the merged template adds itself (the HTTP API's id) is made by the template code."""
    from modelforge_local_stack import infra_node_api

    text = _section("## One domain for the console, the admins and the nodes") + _section("## What a node must reach")
    first_cells = [line.split("|")[1] for line in _section("## After deploying").splitlines() if line.startswith("| `")]
    documented = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    for output in ("NodeHttpApiId", "RestAPIId", "NodeChannelUrl", "StateLogBucketName"):
        assert output in text and output in documented, output
    assert "NodeHttpApiId" in infra_node_api.outputs()
    assert "--api-mapping-key admin" in text and "--stage '$default'" in text
