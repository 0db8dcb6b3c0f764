"""The release tool against images made and read by real OCI tools from Debian: `umoci` builds an
image from files, `skopeo` saves it as an OCI layout and as a docker-archive (as `docker save`
would); the bundle made from them verifies, and `skopeo` reads the bundle's tarball back with the
manifest's layers, platform and labels. Fails, naming the install command, where umoci or
skopeo is missing (scripts/test installs both)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from modelforge_cli.release_manifest import make_bundle
from modelforge_cli.release_verify import verify_bundle
from modelforge_protocol.release_bundle import REQUIRED_LABELS, known_label_values
from modelforge_protocol.versions import IMAGE_TAG_VERSION

AGENT, WORKER = "modelforge-node-agent", "modelforge-runtime-worker"


@pytest.fixture(autouse=True)
def _real_tools_installed() -> None:
    """A failure, not a skip: scripts/test installs umoci and skopeo (scripts/_system_packages.sh),
    and a skip would hide a missing install in CI."""
    missing = [tool for tool in ("umoci", "skopeo") if shutil.which(tool) is None]
    assert not missing, (
        f"{' and '.join(missing)} not installed: these tests drive the real Debian tools. Run ./scripts/test as root "
        f"(it installs them), or: sudo apt-get install -y --no-install-recommends {' '.join(missing)}"
    )


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
    return done.stdout


def _umoci_image(tmp_path: Path, name: str, architecture: str) -> str:
    """An OCI layout built by umoci from files; returns its image reference (layout:tag)."""
    files = tmp_path / f"{name}-files"
    (files / "opt").mkdir(parents=True)
    (files / "opt" / "main.py").write_text(f"print({name!r})\n")
    layout = str(tmp_path / f"{name}-layout")
    _run("umoci", "init", "--layout", layout)
    _run("umoci", "new", "--image", f"{layout}:base")
    _run("umoci", "insert", "--rootless", "--image", f"{layout}:base", str(files / "opt"), "/opt")
    # the release's own version and title (the values a manifest entry must have), the others made up
    values = {**{label: "x-" + label.rpartition(".")[2] for label in REQUIRED_LABELS}, **known_label_values(name)}
    labels = [f"--config.label={label}={value}" for label, value in values.items()]
    _run("umoci", "config", "--image", f"{layout}:base", "--tag", "built", f"--architecture={architecture}", *labels)
    return f"{layout}:built"


def test_release_bundle_from_skopeo_archives_verifies_and_skopeo_reads_it_back(tmp_path: Path) -> None:
    agent_layout = tmp_path / "agent-oci"
    worker_archive = tmp_path / "worker.tar"
    _run(
        "skopeo",
        "copy",
        "-q",
        f"oci:{_umoci_image(tmp_path, AGENT, 'amd64')}",
        f"oci:{agent_layout}:{AGENT}:{IMAGE_TAG_VERSION}",
    )
    _run(
        "skopeo",
        "copy",
        "-q",
        f"oci:{_umoci_image(tmp_path, WORKER, 'arm64')}",
        f"docker-archive:{worker_archive}:{WORKER}:{IMAGE_TAG_VERSION}",
    )

    written = make_bundle([agent_layout, worker_archive], tmp_path / "bundle")
    verified = verify_bundle(written.folder)

    for name, entry in verified.manifest["images"].items():
        source = f"docker-archive:{written.bundle}:{name}:{IMAGE_TAG_VERSION}"
        config = json.loads(_run("skopeo", "inspect", "--config", source))
        assert config["rootfs"]["diff_ids"] == entry["rootfs_layers"]
        assert config["architecture"] == entry["architecture"] == ("amd64" if name == AGENT else "arm64")
        assert config["config"]["Labels"] == entry["labels"]
        # skopeo copy checks every layer's digest on the way
        _run("skopeo", "copy", "-q", source, f"dir:{tmp_path / ('copy-' + name)}")
