"""Small container images written from tar files, in the archive formats `modelforge release`
reads: `docker save` (the legacy layout, and Docker 25+'s, which is also an OCI layout) and OCI
image layouts (a folder or a tarball). Digests are computed here from the bytes written, as
Docker and OCI tools compute them, so a test can change one byte and know what must break."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from modelforge_protocol.versions import IMAGE_TAG_VERSION

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def layer(files: dict[str, bytes]) -> bytes:
    """An uncompressed layer tar holding ``files`` (deterministic bytes)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def release_labels(name: str, version: str = IMAGE_TAG_VERSION) -> dict[str, str]:
    return {
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
        "org.opencontainers.image.source": "https://example.invalid/modelforge",
        "org.opencontainers.image.created": "2026-01-02T03:04:05Z",
        "org.opencontainers.image.title": name,
    }


@dataclass(frozen=True)
class TestImage:
    """One image: its tags, its layers (uncompressed tars) and the config built from them."""

    __test__ = False  # not a pytest test class

    tags: tuple[str, ...]
    layers: tuple[bytes, ...]
    architecture: str = "amd64"
    os: str = "linux"
    variant: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: the config's key order and spacing; another value re-serialises the same config differently
    config_style: Literal["compact", "indented"] = "compact"
    #: override the config's diff IDs (to make an image whose layers do not match its config)
    diff_ids: tuple[str, ...] | None = None

    def config_document(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "architecture": self.architecture,
            "os": self.os,
            "created": "2026-01-02T03:04:05Z",
            "config": {"Cmd": ["python3", "-m", "modelforge_node_agent.main"], "Labels": dict(self.labels)},
            "rootfs": {"type": "layers", "diff_ids": list(self.diff_ids or [sha256(data) for data in self.layers])},
        }
        if self.variant:
            document["variant"] = self.variant
        return document

    def config(self) -> bytes:
        if self.config_style == "indented":
            return json.dumps(self.config_document(), indent=4, sort_keys=False).encode()
        return json.dumps(self.config_document(), sort_keys=True, separators=(",", ":")).encode()

    def with_(self, **changes: Any) -> TestImage:
        return replace(self, **changes)


def release_image(name: str, version: str = IMAGE_TAG_VERSION, *, shared_base: bool = True) -> TestImage:
    """A two-layer image tagged ``name:version`` with the five OCI labels; with ``shared_base``
    its first layer is the same in every image (as a common base image's would be)."""
    base = layer({"etc/os-release": b"ID=debian\n"}) if shared_base else layer({"etc/base": name.encode()})
    return TestImage(
        tags=(f"{name}:{version}",),
        layers=(base, layer({f"opt/{name}/main.py": f"print({name!r})\n".encode()})),
        labels=release_labels(name, version),
    )


def release_images(version: str = IMAGE_TAG_VERSION) -> list[TestImage]:
    return [release_image("modelforge-node-agent", version), release_image("modelforge-runtime-worker", version)]


# --- writing archives -------------------------------------------------------------------------


class _Writer:
    def __init__(self, target: Path, as_tarball: bool) -> None:
        self.target = target
        # open for the writer's life, across add() calls; close() closes it
        self._tar = tarfile.open(target, "w", format=tarfile.PAX_FORMAT) if as_tarball else None  # noqa: SIM115
        self.written: set[str] = set()

    def add(self, name: str, data: bytes) -> None:
        if name in self.written:
            return
        self.written.add(name)
        if self._tar is None:
            path = self.target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        self._tar.addfile(info, io.BytesIO(data))

    def symlink(self, name: str, target: str) -> None:
        assert self._tar is not None
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
        self._tar.addfile(info)
        self.written.add(name)

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()


def write_docker_save(path: Path, images: list[TestImage], layout: Literal["legacy", "docker25"] = "legacy") -> Path:
    """A `docker save` tarball of ``images``: ``legacy`` (``<id>.json``, ``<id>/layer.tar``, a
    layer seen before written as a symlink, as Docker does), or ``docker25`` (``blobs/sha256``
    plus ``index.json``)."""
    writer = _Writer(path, as_tarball=True)
    saved, repositories = [], {}
    first_copy: dict[str, str] = {}
    descriptors = []
    for image in images:
        config = image.config()
        layer_paths = []
        if layout == "legacy":
            config_path = f"{_hex(sha256(config))}.json"
            for number, data in enumerate(image.layers):
                v1_id = _hex(sha256(config + bytes([number])))
                name = f"{v1_id}/layer.tar"
                writer.add(f"{v1_id}/VERSION", b"1.0")
                writer.add(f"{v1_id}/json", json.dumps({"id": v1_id}).encode())
                if sha256(data) in first_copy:
                    writer.symlink(name, f"../{first_copy[sha256(data)]}")
                else:
                    first_copy[sha256(data)] = name
                    writer.add(name, data)
                layer_paths.append(name)
        else:
            config_path = "blobs/sha256/" + _hex(sha256(config))
            for data in image.layers:
                layer_paths.append("blobs/sha256/" + _hex(sha256(data)))
                writer.add(layer_paths[-1], data)
            manifest = _oci_manifest(
                config, [(data, "application/vnd.oci.image.layer.v1.tar") for data in image.layers]
            )
            writer.add("blobs/sha256/" + _hex(sha256(manifest)), manifest)
            for tag in image.tags:
                descriptors.append(
                    _descriptor(
                        manifest,
                        {
                            "io.containerd.image.name": f"docker.io/library/{tag}",
                            "org.opencontainers.image.ref.name": tag.rpartition(":")[2],
                        },
                    )
                )
        writer.add(config_path, config)
        saved.append({"Config": config_path, "RepoTags": list(image.tags) or None, "Layers": layer_paths})
        for tag in image.tags:
            name, _, version = tag.rpartition(":")
            repositories.setdefault(name, {})[version] = _hex(sha256(config))
    if layout == "docker25":
        writer.add(
            "index.json",
            json.dumps(
                {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": descriptors}
            ).encode(),
        )
        writer.add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    writer.add("manifest.json", json.dumps(saved).encode())
    writer.add("repositories", json.dumps(repositories).encode())
    writer.close()
    return path


def _oci_manifest(config: bytes, layers: list[tuple[bytes, str]]) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(config),
                "size": len(config),
            },
            "layers": [
                {"mediaType": media_type, "digest": sha256(data), "size": len(data)} for data, media_type in layers
            ],
        }
    ).encode()


def _descriptor(manifest: bytes, annotations: dict[str, str]) -> dict[str, Any]:
    return {"mediaType": OCI_MANIFEST, "digest": sha256(manifest), "size": len(manifest), "annotations": annotations}


def write_oci_layout(
    path: Path, images: list[TestImage], *, as_tarball: bool = False, gzip_layers: bool = True
) -> Path:
    """An OCI image layout of ``images`` (folder, or tarball with ``as_tarball``), layers gzip
    compressed unless told otherwise, each tag as skopeo writes it: ``ref.name`` = ``name:tag``."""
    if not as_tarball:
        path.mkdir(parents=True, exist_ok=True)
    writer = _Writer(path, as_tarball)
    descriptors = []
    for image in images:
        config = image.config()
        stored = [
            (gzip.compress(data, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
            if gzip_layers
            else (data, "application/vnd.oci.image.layer.v1.tar")
            for data in image.layers
        ]
        for data, _ in stored:
            writer.add("blobs/sha256/" + _hex(sha256(data)), data)
        writer.add("blobs/sha256/" + _hex(sha256(config)), config)
        manifest = _oci_manifest(config, stored)
        writer.add("blobs/sha256/" + _hex(sha256(manifest)), manifest)
        descriptors.extend(_descriptor(manifest, {"org.opencontainers.image.ref.name": tag}) for tag in image.tags)
    writer.add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    writer.add("index.json", json.dumps({"schemaVersion": 2, "manifests": descriptors}).encode())
    writer.close()
    return path


# --- changing archives and bundles afterwards ---------------------------------------------------


def rewrite_member(path: Path, name: str, data: bytes | None) -> None:
    """Rewrite tarball ``path`` with member ``name`` replaced by ``data`` (None: removed)."""
    with tarfile.open(path) as tar:
        members = [(member, tar.extractfile(member).read() if member.isfile() else None) for member in tar]  # type: ignore[union-attr]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member, content in members:
            if member.name != name:
                tar.addfile(member, io.BytesIO(content) if content is not None else None)
            elif data is not None:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))


def read_member(path: Path, name: str) -> bytes:
    with tarfile.open(path) as tar:
        handle = tar.extractfile(name)
        assert handle is not None
        return handle.read()


def write_sums(folder: Path, names: list[str]) -> None:
    """``SHA256SUMS`` over ``names`` in ``folder``, as ``sha256sum`` writes it."""
    lines = [f"{hashlib.sha256((folder / name).read_bytes()).hexdigest()}  {name}\n" for name in sorted(names)]
    (folder / "SHA256SUMS").write_text("".join(lines))
