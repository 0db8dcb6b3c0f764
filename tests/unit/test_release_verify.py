"""`verify_bundle`: a bundle folder against SHA256SUMS and its manifest. Each kind of tampering is
refused naming the image, the field, and what was expected and found; a rewritten config ID (as
`docker load` may produce) is accepted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from modelforge_cli.release_images import open_images
from modelforge_cli.release_manifest import make_bundle
from modelforge_cli.release_verify import Refused, UsageError, compare_bundle_images, verify_bundle
from modelforge_protocol.release_bundle import bundle_file_name, manifest_file_name
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.support.image_tarballs import (
    TestImage,
    layer,
    release_image,
    release_images,
    sha256,
    write_docker_save,
    write_oci_layout,
    write_sums,
)

AGENT, WORKER = "modelforge-node-agent", "modelforge-runtime-worker"
FILES = [bundle_file_name(), manifest_file_name()]


@pytest.fixture()
def bundle(tmp_path: Path) -> Path:
    return make_bundle([write_docker_save(tmp_path / "images.tar", release_images())], tmp_path / "bundle").folder


def _refused(folder: Path) -> list[str]:
    with pytest.raises(Refused) as refused:
        verify_bundle(folder)
    return refused.value.problems


def _replace_images(folder: Path, images: list[TestImage]) -> None:
    """Swap the bundle's tarball for one holding ``images``, with SHA256SUMS made to match: what
    is left to catch it is the manifest."""
    write_docker_save(folder / bundle_file_name(), images, layout="docker25")
    write_sums(folder, FILES)


def _edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / manifest_file_name()
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    write_sums(folder, FILES)


@pytest.mark.parametrize(
    "write",
    [
        lambda path, images: write_docker_save(path / "in.tar", images),
        lambda path, images: write_docker_save(path / "in.tar", images, layout="docker25"),
        lambda path, images: write_oci_layout(path / "in", images),
        lambda path, images: write_oci_layout(path / "in.tar", images, as_tarball=True),
    ],
    ids=["docker-save legacy", "docker-save 25", "oci folder", "oci tarball"],
)
def test_verify_bundle_good_bundle_passes(tmp_path: Path, write: Callable[[Path, list[TestImage]], Path]) -> None:
    written = make_bundle([write(tmp_path, release_images())], tmp_path / "bundle")
    verified = verify_bundle(written.folder)
    assert verified.bundle == written.bundle
    assert sorted(verified.manifest["images"]) == [AGENT, WORKER]
    assert verified.notes == []


def test_verify_bundle_changed_byte_in_tarball_fails_its_checksum(bundle: Path) -> None:
    path = bundle / bundle_file_name()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))
    problems = _refused(bundle)
    assert len(problems) == 1
    assert problems[0].startswith(f"SHA256SUMS: {bundle_file_name()}: checksum mismatch: expected ")


def test_verify_bundle_file_listed_in_sums_missing_refused(bundle: Path) -> None:
    (bundle / manifest_file_name()).unlink()
    assert _refused(bundle) == [f"SHA256SUMS: {manifest_file_name()} is missing"]


def test_verify_bundle_without_sums_refused(bundle: Path) -> None:
    (bundle / "SHA256SUMS").unlink()
    assert _refused(bundle) == [f"SHA256SUMS: missing from {bundle}"]


def test_verify_bundle_sums_not_listing_the_tarball_refused(bundle: Path) -> None:
    write_sums(bundle, [manifest_file_name()])
    assert _refused(bundle) == [f"SHA256SUMS: does not list {bundle_file_name()}, the tarball the manifest names"]


def test_verify_bundle_sums_naming_a_path_outside_the_folder_refused(bundle: Path) -> None:
    with (bundle / "SHA256SUMS").open("a") as sums:
        sums.write(f"{'0' * 64}  ../elsewhere\n")
    assert _refused(bundle) == ["SHA256SUMS line 3: '../elsewhere' is not a file of this folder"]


def test_verify_bundle_manifest_of_another_release_refused(bundle: Path) -> None:
    _edit_manifest(bundle, lambda manifest: manifest.update(release="1.2.0"))
    problems = _refused(bundle)
    assert problems == [
        f"{manifest_file_name()}: release: this tool verifies release {IMAGE_TAG_VERSION}, the manifest is for '1.2.0'"
    ]


def test_verify_bundle_wrong_tag_refused(bundle: Path) -> None:
    agent, worker = release_images()
    _replace_images(bundle, [agent.with_(tags=(f"{AGENT}:1.2.0",)), worker])
    assert _refused(bundle) == [f"images.{AGENT}.tag: expected {AGENT}:{IMAGE_TAG_VERSION}, found {AGENT}:1.2.0"]


def test_verify_bundle_reordered_layers_refused(bundle: Path) -> None:
    agent, worker = release_images()
    _replace_images(bundle, [agent.with_(layers=agent.layers[::-1]), worker])
    assert _refused(bundle) == [
        f"images.{AGENT}.rootfs_layers: the same 2 layers in another order; layer 1: expected "
        f"{sha256(agent.layers[0])}, found {sha256(agent.layers[1])}"
    ]


def test_verify_bundle_extra_layer_refused(bundle: Path) -> None:
    agent, worker = release_images()
    extra = layer({"tmp/extra": b"added after the release"})
    _replace_images(bundle, [agent.with_(layers=(*agent.layers, extra)), worker])
    assert _refused(bundle) == [
        f"images.{AGENT}.rootfs_layers: expected 2 layers, found 3; layer 3: expected (no layer), found {sha256(extra)}"
    ]


def test_verify_bundle_missing_layer_refused(bundle: Path) -> None:
    agent, worker = release_images()
    _replace_images(bundle, [agent.with_(layers=agent.layers[:1]), worker])
    assert _refused(bundle) == [
        f"images.{AGENT}.rootfs_layers: expected 2 layers, found 1;"
        f" layer 2: expected {sha256(agent.layers[1])}, found (no layer)"
    ]


def test_verify_bundle_different_layer_refused(bundle: Path) -> None:
    agent, worker = release_images()
    other = layer({"opt/modelforge-node-agent/main.py": b"print('patched')\n"})
    _replace_images(bundle, [agent, worker.with_(layers=(worker.layers[0], other))])
    assert _refused(bundle) == [
        f"images.{WORKER}.rootfs_layers: layer 2: expected {sha256(worker.layers[1])}, found {sha256(other)}"
    ]


def test_verify_bundle_different_architecture_refused(bundle: Path) -> None:
    agent, worker = release_images()
    _replace_images(bundle, [agent.with_(architecture="arm64", variant="v8"), worker])
    assert _refused(bundle) == [
        f"images.{AGENT}.architecture: expected amd64, found arm64",
        f"images.{AGENT}.variant: expected (none), found v8",
    ]


def test_verify_bundle_changed_label_refused(bundle: Path) -> None:
    agent, worker = release_images()
    labels = {**agent.labels, "org.opencontainers.image.revision": "f" * 40}
    _replace_images(bundle, [agent.with_(labels=labels), worker])
    assert _refused(bundle) == [
        f"images.{AGENT}.labels: org.opencontainers.image.revision: expected "
        f"{agent.labels['org.opencontainers.image.revision']!r}, found {'f' * 40!r}"
    ]


def test_verify_bundle_missing_label_refused(bundle: Path) -> None:
    agent, worker = release_images()
    labels = {key: value for key, value in worker.labels.items() if key != "org.opencontainers.image.source"}
    _replace_images(bundle, [agent, worker.with_(labels=labels)])
    assert _refused(bundle) == [
        f"images.{WORKER}.labels: org.opencontainers.image.source: expected "
        f"{worker.labels['org.opencontainers.image.source']!r}, missing from the image"
    ]


def test_verify_bundle_added_oci_label_refused(bundle: Path) -> None:
    agent, worker = release_images()
    _replace_images(
        bundle, [agent.with_(labels={**agent.labels, "org.opencontainers.image.vendor": "someone"}), worker]
    )
    assert _refused(bundle) == [
        f"images.{AGENT}.labels: org.opencontainers.image.vendor: not in the manifest, found 'someone'"
    ]


def test_verify_bundle_extra_image_refused(bundle: Path) -> None:
    extra = release_image("modelforge-extra")
    _replace_images(bundle, [*release_images(), extra])
    assert _refused(bundle) == [
        f"images: the bundle holds {extra.tags[0]} (config {sha256(extra.config())}), which the manifest does not list"
    ]


def test_verify_bundle_image_missing_from_tarball_refused(bundle: Path) -> None:
    _replace_images(bundle, [release_image(AGENT)])
    assert _refused(bundle) == [f"images.{WORKER}: in the manifest, not in the bundle"]


def test_verify_bundle_manifest_entry_changed_refused(bundle: Path) -> None:
    def claim_arm64(manifest: dict[str, Any]) -> None:
        manifest["images"][WORKER]["architecture"] = "arm64"

    _edit_manifest(bundle, claim_arm64)
    assert _refused(bundle) == [f"images.{WORKER}.architecture: expected arm64, found amd64"]


def test_verify_bundle_corrupt_layer_with_matching_sums_refused(bundle: Path) -> None:
    agent, worker = release_images()
    _replace_images(
        bundle, [agent.with_(diff_ids=(sha256(agent.layers[0]), sha256(b"what the config promised"))), worker]
    )
    problems = _refused(bundle)
    assert len(problems) == 1 and "layer 2" in problems[0] and "does not match its digest" in problems[0]


def test_verify_bundle_rewritten_config_id_accepted(bundle: Path) -> None:
    """The same config serialised differently has another digest (image ID), as after a docker
    load and save elsewhere; layers, platform and labels are unchanged, so it passes, with a note."""
    agent, worker = release_images()
    rewritten = agent.with_(config_style="indented")
    assert sha256(rewritten.config()) != sha256(agent.config())
    _replace_images(bundle, [rewritten, worker])
    verified = verify_bundle(bundle)
    assert verified.notes == [
        f"images.{AGENT}.config_digest: {sha256(rewritten.config())}, the build host recorded "
        f"{sha256(agent.config())} (recorded only: not compared)"
    ]


def test_compare_bundle_images_ignores_config_digest_but_not_labels(bundle: Path) -> None:
    manifest = json.loads((bundle / manifest_file_name()).read_text())
    manifest["images"][AGENT]["config_digest"] = "sha256:" + "0" * 64
    with open_images(bundle / bundle_file_name()) as archive:
        problems, notes = compare_bundle_images(manifest, archive.images)
        assert problems == [] and len(notes) == 1
        manifest["images"][AGENT]["labels"]["org.opencontainers.image.title"] = "something else"
        problems, _ = compare_bundle_images(manifest, archive.images)
    assert problems == [
        f"images.{AGENT}.labels: org.opencontainers.image.title: expected 'something else', found '{AGENT}'"
    ]


def test_verify_bundle_not_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a folder"):
        verify_bundle(tmp_path / "absent")
