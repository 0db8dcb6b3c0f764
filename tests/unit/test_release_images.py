"""Reading image archives (docker save, legacy and Docker 25+; OCI layouts, folder and tarball):
every image's tags, layers, platform and OCI labels, and every digest checked."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from modelforge_cli.release_images import ImageArchiveError, open_images

from tests.support.image_tarballs import (
    TestImage,
    read_member,
    release_image,
    release_images,
    rewrite_member,
    sha256,
    write_docker_save,
    write_oci_layout,
)

WRITERS: dict[str, Callable[[Path, list[TestImage]], Path]] = {
    "docker-save legacy": lambda path, images: write_docker_save(path / "images.tar", images),
    "docker-save 25": lambda path, images: write_docker_save(path / "images.tar", images, layout="docker25"),
    "oci folder": lambda path, images: write_oci_layout(path / "oci", images),
    "oci tarball": lambda path, images: write_oci_layout(path / "oci.tar", images, as_tarball=True),
    "oci tarball uncompressed": lambda path, images: write_oci_layout(
        path / "oci.tar", images, as_tarball=True, gzip_layers=False
    ),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_open_images_each_format_reads_what_was_written(tmp_path: Path, writer: str) -> None:
    written = [
        release_image("modelforge-node-agent").with_(variant="v8", architecture="arm64"),
        release_image("modelforge-runtime-worker"),
    ]
    with open_images(WRITERS[writer](tmp_path, written)) as archive:
        found = sorted(archive.images, key=lambda image: image.tags)
    assert [image.tags for image in found] == [image.tags for image in written]
    for image, source in zip(found, written, strict=True):
        assert image.rootfs_layers == tuple(sha256(data) for data in source.layers)
        assert [blob.diff_id for blob in image.layers] == list(image.rootfs_layers)
        assert (image.architecture, image.os, image.variant) == (source.architecture, source.os, source.variant)
        assert image.labels == source.labels
        assert image.config_digest == sha256(source.config())


def test_open_images_non_oci_labels_are_not_recorded(tmp_path: Path) -> None:
    image = release_image("modelforge-node-agent")
    image = image.with_(labels={**image.labels, "maintainer": "someone", "com.nvidia.cuda.version": "12.4"})
    with open_images(write_docker_save(tmp_path / "a.tar", [image])) as archive:
        assert archive.images[0].labels == release_image("modelforge-node-agent").labels


def test_open_images_fully_qualified_docker_save_tag_as_docker_shows_it(tmp_path: Path) -> None:
    """skopeo's docker-archive writes RepoTags as docker.io/library/<name>:<tag>; docker load
    shows (and tags) <name>:<tag>."""
    image = release_image("modelforge-node-agent")
    qualified = image.with_(tags=(f"docker.io/library/{image.tags[0]}",))
    with open_images(write_docker_save(tmp_path / "a.tar", [qualified])) as archive:
        assert archive.images[0].tags == image.tags


def test_open_images_not_a_tar_refused(tmp_path: Path) -> None:
    path = tmp_path / "images.tar"
    path.write_bytes(b"this is not an archive" * 100)
    with pytest.raises(ImageArchiveError, match="not a readable tar archive"):
        open_images(path).__enter__()


def test_open_images_truncated_tar_refused_in_one_line(tmp_path: Path) -> None:
    path = write_docker_save(tmp_path / "images.tar", release_images())
    path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(ImageArchiveError) as refused:
        open_images(path).__enter__()
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


def test_open_images_tar_of_neither_format_refused(tmp_path: Path) -> None:
    path = write_oci_layout(tmp_path / "oci.tar", release_images(), as_tarball=True)
    rewrite_member(path, "index.json", None)
    with pytest.raises(ImageArchiveError, match="neither a docker save archive"):
        open_images(path).__enter__()


def test_open_images_layer_not_matching_config_diff_id_refused(tmp_path: Path) -> None:
    image = release_image("modelforge-node-agent")
    lying = image.with_(diff_ids=(sha256(image.layers[0]), sha256(b"another layer")))
    path = write_docker_save(tmp_path / "images.tar", [lying])
    with pytest.raises(ImageArchiveError, match=r"layer 2 \(.*layer.tar\) does not match its digest"):
        open_images(path).__enter__()


def test_open_images_changed_layer_byte_in_docker25_blob_refused(tmp_path: Path) -> None:
    image = release_image("modelforge-node-agent")
    path = write_docker_save(tmp_path / "images.tar", [image], layout="docker25")
    name = "blobs/sha256/" + sha256(image.layers[1]).removeprefix("sha256:")
    data = bytearray(read_member(path, name))
    data[600] ^= 1
    rewrite_member(path, name, bytes(data))
    with pytest.raises(ImageArchiveError, match=f"{name} does not match its digest"):
        open_images(path).__enter__()


def test_open_images_changed_config_in_oci_layout_refused(tmp_path: Path) -> None:
    image = release_image("modelforge-node-agent")
    folder = write_oci_layout(tmp_path / "oci", [image])
    config = folder / "blobs/sha256" / sha256(image.config()).removeprefix("sha256:")
    config.write_bytes(image.with_(architecture="arm64").config())
    with pytest.raises(ImageArchiveError, match="config .* does not match its digest"):
        open_images(folder).__enter__()


def test_open_images_missing_layer_blob_refused(tmp_path: Path) -> None:
    image = release_image("modelforge-node-agent")
    folder = write_oci_layout(tmp_path / "oci", [image])
    (folder / "blobs/sha256" / sha256(gzip.compress(image.layers[1], mtime=0)).removeprefix("sha256:")).unlink()
    with pytest.raises(ImageArchiveError, match="is not in the layout"):
        open_images(folder).__enter__()


def test_open_images_duplicate_member_refused(tmp_path: Path) -> None:
    path = write_docker_save(tmp_path / "images.tar", release_images())
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"[]"))
    with pytest.raises(ImageArchiveError, match="manifest.json appears twice"):
        open_images(path).__enter__()


def test_open_images_zstd_layer_refused(tmp_path: Path) -> None:
    image = release_image("modelforge-node-agent")
    path = write_docker_save(tmp_path / "images.tar", [image], layout="docker25")
    name = "blobs/sha256/" + sha256(image.layers[1]).removeprefix("sha256:")
    rewrite_member(path, name, b"\x28\xb5\x2f\xfd" + b"\0" * 64)
    with pytest.raises(ImageArchiveError, match="zstd-compressed"):
        open_images(path).__enter__()


def test_open_images_oci_ref_name_without_image_name_refused(tmp_path: Path) -> None:
    folder = write_oci_layout(tmp_path / "oci", [release_image("modelforge-node-agent")])
    index = json.loads((folder / "index.json").read_text())
    index["manifests"][0]["annotations"] = {"org.opencontainers.image.ref.name": "1.3.0-rc.1"}
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(ImageArchiveError, match="names a tag but not the image"):
        open_images(folder).__enter__()


def test_open_images_containerd_name_annotation_gives_the_docker_tag(tmp_path: Path) -> None:
    folder = write_oci_layout(tmp_path / "oci", [release_image("modelforge-node-agent")])
    index = json.loads((folder / "index.json").read_text())
    tag = release_image("modelforge-node-agent").tags[0]
    index["manifests"][0]["annotations"] = {
        "io.containerd.image.name": f"docker.io/library/{tag}",
        "org.opencontainers.image.ref.name": "x",
    }
    (folder / "index.json").write_text(json.dumps(index))
    with open_images(folder) as archive:
        assert archive.images[0].tags == (tag,)


def test_open_images_docker25_index_disagreeing_with_manifest_json_refused(tmp_path: Path) -> None:
    path = write_docker_save(tmp_path / "images.tar", release_images(), layout="docker25")
    index = json.loads(read_member(path, "index.json"))
    index["manifests"][0]["annotations"]["io.containerd.image.name"] = "docker.io/library/modelforge-node-agent:latest"
    rewrite_member(path, "index.json", json.dumps(index).encode())
    with pytest.raises(
        ImageArchiveError, match="manifest.json tags the image .* index.json modelforge-node-agent:latest"
    ):
        open_images(path).__enter__()


def test_open_images_image_index_with_one_stored_platform_and_an_attestation_reads_that_platform(
    tmp_path: Path,
) -> None:
    """What Docker's containerd image store saves: index.json -> image index -> the stored
    platform's manifest, beside an attestation manifest and another platform not in the archive."""
    image = release_image("modelforge-node-agent")
    folder = write_oci_layout(tmp_path / "oci", [image])
    index = json.loads((folder / "index.json").read_text())
    platform = dict(index["manifests"][0], platform={"architecture": "amd64", "os": "linux"})
    platform.pop("annotations")
    absent = {
        **platform,
        "digest": sha256(b"arm64 manifest, not saved"),
        "platform": {"architecture": "arm64", "os": "linux"},
    }
    attestation = {
        **platform,
        "platform": {"architecture": "unknown", "os": "unknown"},
        "annotations": {"vnd.docker.reference.type": "attestation-manifest"},
    }
    image_index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [platform, absent, attestation],
        }
    ).encode()
    (folder / "blobs/sha256" / sha256(image_index).removeprefix("sha256:")).write_bytes(image_index)
    index["manifests"] = [
        {
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": sha256(image_index),
            "size": len(image_index),
            "annotations": {"io.containerd.image.name": f"docker.io/library/{image.tags[0]}"},
        }
    ]
    (folder / "index.json").write_text(json.dumps(index))
    with open_images(folder) as archive:
        assert [found.tags for found in archive.images] == [image.tags]
        assert archive.images[0].rootfs_layers == tuple(sha256(data) for data in image.layers)


def test_open_images_a_layer_shared_by_two_images_is_read_through_the_legacy_symlink(tmp_path: Path) -> None:
    images = release_images()
    path = write_docker_save(tmp_path / "images.tar", images)
    with tarfile.open(path) as tar:
        assert [member.name for member in tar if member.issym()]  # the writer linked the shared base layer
    with open_images(path) as archive:
        assert archive.images[1].rootfs_layers[0] == sha256(images[1].layers[0])
