"""`make_bundle`: the images tarball, its manifest and SHA256SUMS from image archives, and what it
refuses (wrong tags, latest, duplicates, missing or unexpected images, missing labels, corrupt
archives)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from modelforge_cli.release_images import open_images
from modelforge_cli.release_manifest import PLACEHOLDER_LABELS, make_bundle
from modelforge_cli.release_verify import Refused, UsageError
from modelforge_protocol.release_bundle import MANIFEST_FORMAT, bundle_file_name, manifest_file_name
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.support.image_tarballs import release_image, release_images, sha256, write_docker_save, write_oci_layout

AGENT, WORKER = "modelforge-node-agent", "modelforge-runtime-worker"


def _refusal(inputs: list[Path], out: Path, **options: object) -> list[str]:
    with pytest.raises(Refused) as refused:
        make_bundle(inputs, out, **options)  # type: ignore[arg-type]
    assert not (out / "SHA256SUMS").exists() and not (out / bundle_file_name()).exists()
    return refused.value.problems


def test_make_bundle_manifest_describes_each_image(tmp_path: Path) -> None:
    images = release_images()
    written = make_bundle([write_docker_save(tmp_path / "images.tar", images)], tmp_path / "bundle")
    manifest = json.loads(written.manifest.read_text())
    assert (manifest["format"], manifest["release"], manifest["bundle"]) == (
        MANIFEST_FORMAT,
        IMAGE_TAG_VERSION,
        bundle_file_name(),
    )
    assert list(manifest["images"]) == [AGENT, WORKER]
    for image in images:
        entry = manifest["images"][image.tags[0].rpartition(":")[0]]
        assert entry == {
            "tag": image.tags[0],
            "rootfs_layers": [sha256(data) for data in image.layers],
            "architecture": image.architecture,
            "os": image.os,
            "labels": image.labels,
            "config_digest": sha256(image.config()),
        }


def test_make_bundle_separate_archives_of_two_formats_become_one_tarball(tmp_path: Path) -> None:
    agent, worker = release_images()
    inputs = [
        write_oci_layout(tmp_path / "agent", [agent]),
        write_docker_save(tmp_path / "worker.tar", [worker], layout="docker25"),
    ]
    written = make_bundle(inputs, tmp_path / "bundle")
    assert written.bundle.name == bundle_file_name()
    with open_images(written.bundle) as archive:
        assert archive.format == "docker-save+oci"
        assert sorted(image.tags for image in archive.images) == [agent.tags, worker.tags]
        # config blobs are copied byte for byte: the classic image store keeps the build host's ID
        assert {image.config_digest for image in archive.images} == {sha256(agent.config()), sha256(worker.config())}


def test_make_bundle_same_images_give_the_same_bytes(tmp_path: Path) -> None:
    source = write_docker_save(tmp_path / "images.tar", release_images())
    one = make_bundle([source], tmp_path / "one")
    two = make_bundle([source], tmp_path / "two")
    assert one.bundle.read_bytes() == two.bundle.read_bytes()
    assert one.sums.read_text() == two.sums.read_text()


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum is not installed")
def test_make_bundle_sha256sums_passes_sha256sum_check(tmp_path: Path) -> None:
    written = make_bundle([write_docker_save(tmp_path / "images.tar", release_images())], tmp_path / "bundle")
    checked = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=written.folder, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert sorted(checked.stdout.split()) == sorted([f"{bundle_file_name()}:", f"{manifest_file_name()}:", "OK", "OK"])


@pytest.mark.parametrize(
    ("tag", "says"),
    [
        (f"{AGENT}:latest", f"{AGENT}:latest is the floating latest tag"),
        (f"{AGENT}:1.2.0", f"{AGENT}:1.2.0 is not tagged for this release: expected {AGENT}:{IMAGE_TAG_VERSION}"),
        (f"registry.example/{AGENT}:{IMAGE_TAG_VERSION}", "is not <name>:<tag> (no registry or path)"),
    ],
)
def test_make_bundle_wrong_tag_refused(tmp_path: Path, tag: str, says: str) -> None:
    agent, worker = release_images()
    source = write_docker_save(tmp_path / "images.tar", [agent.with_(tags=(tag,)), worker])
    problems = _refusal([source], tmp_path / "bundle")
    assert any(says in problem for problem in problems), problems


def test_make_bundle_release_tag_with_latest_beside_it_refused(tmp_path: Path) -> None:
    agent, worker = release_images()
    source = write_docker_save(tmp_path / "images.tar", [agent.with_(tags=(*agent.tags, f"{AGENT}:latest")), worker])
    problems = _refusal([source], tmp_path / "bundle")
    assert any(f"{AGENT}:latest is the floating latest tag" in problem for problem in problems), problems


def test_make_bundle_untagged_image_refused(tmp_path: Path) -> None:
    agent, worker = release_images()
    source = write_docker_save(tmp_path / "images.tar", [agent.with_(tags=()), worker])
    assert any("an untagged image" in problem for problem in _refusal([source], tmp_path / "bundle"))


def test_make_bundle_duplicate_image_across_inputs_refused(tmp_path: Path) -> None:
    agent, worker = release_images()
    one = write_docker_save(tmp_path / "one.tar", [agent, worker])
    two = write_oci_layout(tmp_path / "two", [agent.with_(architecture="arm64")])
    assert f"duplicate image {agent.tags[0]}: in {one} and in {two}" in _refusal([one, two], tmp_path / "bundle")


def test_make_bundle_missing_image_refused(tmp_path: Path) -> None:
    source = write_docker_save(tmp_path / "agent.tar", [release_image(AGENT)])
    problems = _refusal([source], tmp_path / "bundle")
    assert problems == [f"missing image {WORKER}:{IMAGE_TAG_VERSION}: none of the inputs holds it"]


def test_make_bundle_unexpected_image_refused(tmp_path: Path) -> None:
    source = write_docker_save(tmp_path / "images.tar", [*release_images(), release_image("modelforge-extra")])
    problems = _refusal([source], tmp_path / "bundle")
    assert problems == [
        f"{source}: modelforge-extra:{IMAGE_TAG_VERSION}: unexpected image;"
        f" the bundle holds exactly {AGENT}, {WORKER} (--expect)"
    ]


def test_make_bundle_expect_names_the_images_it_holds(tmp_path: Path) -> None:
    source = write_docker_save(tmp_path / "agent.tar", [release_image(AGENT)])
    written = make_bundle([source], tmp_path / "bundle", expected=[AGENT])
    assert list(json.loads(written.manifest.read_text())["images"]) == [AGENT]


def test_make_bundle_image_without_a_required_label_refused(tmp_path: Path) -> None:
    agent, worker = release_images()
    labels = {key: value for key, value in agent.labels.items() if key != "org.opencontainers.image.revision"}
    source = write_docker_save(tmp_path / "images.tar", [agent.with_(labels=labels), worker])
    problems = _refusal([source], tmp_path / "bundle")
    assert problems == [f"{source}: {agent.tags[0]}: labels: org.opencontainers.image.revision missing"]


@pytest.mark.parametrize(
    ("label", "placeholder", "build_arg"),
    [
        ("org.opencontainers.image.revision", "unknown", "REVISION"),
        ("org.opencontainers.image.created", "1970-01-01T00:00:00Z", "CREATED"),
        ("org.opencontainers.image.source", "unknown", "SOURCE"),
    ],
)
def test_make_bundle_image_with_a_dockerfile_placeholder_label_refused(
    tmp_path: Path, label: str, placeholder: str, build_arg: str
) -> None:
    """Built without --build-arg: the Dockerfile's default would ship as the image's label."""
    agent, worker = release_images()
    source = write_docker_save(
        tmp_path / "images.tar", [agent.with_(labels={**agent.labels, label: placeholder}), worker]
    )
    problems = _refusal([source], tmp_path / "bundle")
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"{source}: {agent.tags[0]}: labels: {label} is the Dockerfile's placeholder {placeholder!r}"
    )
    assert f"built without --build-arg {build_arg}; rebuild it with --build-arg {build_arg}=" in problems[0]


def test_make_bundle_every_placeholder_label_named_at_once(tmp_path: Path) -> None:
    agent, worker = release_images()
    unbuilt = {**agent.labels, **{label: placeholder for label, (placeholder, _, _) in PLACEHOLDER_LABELS.items()}}
    source = write_oci_layout(tmp_path / "layout", [agent.with_(labels=unbuilt), worker])
    problems = _refusal([source], tmp_path / "bundle")
    assert [problem.split("--build-arg ")[1].split(";")[0] for problem in problems] == ["REVISION", "CREATED", "SOURCE"]


def test_make_bundle_corrupt_archive_refused(tmp_path: Path) -> None:
    source = tmp_path / "images.tar"
    source.write_bytes(b"\0garbage" * 1000)
    problems = _refusal([source], tmp_path / "bundle")
    assert len(problems) == 1 and "not a readable tar archive" in problems[0]


def test_make_bundle_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file or folder"):
        make_bundle([tmp_path / "absent.tar"], tmp_path / "bundle")


def test_make_bundle_existing_output_left_alone(tmp_path: Path) -> None:
    source = write_docker_save(tmp_path / "images.tar", release_images())
    out = tmp_path / "bundle"
    out.mkdir()
    (out / manifest_file_name()).write_text("an earlier manifest")
    with pytest.raises(UsageError, match="exists; remove it or choose another --out folder"):
        make_bundle([source], out)
    assert (out / manifest_file_name()).read_text() == "an earlier manifest"
    assert sorted(path.name for path in out.iterdir()) == [manifest_file_name()]
