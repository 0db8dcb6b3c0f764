"""Read container images out of the archives `docker save` and OCI tools write, checking every
byte against its digest.

Formats read:

- ``docker save`` tarballs: ``manifest.json`` (each image's config, tags and layer files), the
  config JSON and the layers, in the legacy layout (``<id>.json``, ``<id>/layer.tar``) or the
  layout of Docker 25 and later (``blobs/sha256/...``, which is also an OCI layout: ``index.json``
  is then read as well, and must agree with ``manifest.json``);
- OCI image layouts, as a folder or a tarball: ``oci-layout``, ``index.json``, ``blobs/sha256/...``,
  tags from the ``io.containerd.image.name`` or ``org.opencontainers.image.ref.name`` annotation.

Layers may be stored uncompressed or gzip-compressed; zstd is refused. Every blob named by its
digest must hash to it, and each layer's uncompressed content must hash to the image config's
``rootfs.diff_ids`` entry at the same position. Nothing is extracted to disk: the archive's
members are read by name. Every failure is an :class:`ImageArchiveError` with one line.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import posixpath
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from modelforge_protocol.release_bundle import DIGEST, OCI_LABEL_PREFIX

from .tables import counted

CHUNK = 1 << 20
#: The largest JSON document (index, manifest, config) read into memory.
MAX_JSON_BYTES = 16 << 20

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX_TYPES = {OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json"}
MANIFEST_TYPES = {OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json"}
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class ImageArchiveError(Exception):
    """An archive that cannot be read, or whose content does not match its digests (one line)."""


@dataclass(frozen=True)
class Blob:
    """One stored blob: where it is, and the digests of its stored and its uncompressed bytes."""

    path: str
    digest: str
    size: int
    diff_id: str
    compression: str  # "none" or "gzip"


@dataclass(frozen=True)
class Image:
    """One image as an archive holds it, every digest checked."""

    tags: tuple[str, ...]
    config: bytes
    config_digest: str
    rootfs_layers: tuple[str, ...]
    architecture: str
    os: str
    variant: str | None
    #: the image's org.opencontainers.image.* labels (other labels are not recorded)
    labels: dict[str, str]
    layers: tuple[Blob, ...]
    #: where in the archive, for messages: "manifest.json image 2", "index.json manifest sha256:..."
    where: str


# --- where the bytes are: a tarball or a folder -------------------------------------------------


class _Tar:
    def __init__(self, path: Path) -> None:
        self.label = str(path)
        try:
            # open for the reader's life, across member reads; close() closes it
            self._tar = tarfile.open(path, "r:*")  # noqa: SIM115
            self._members = self._index()
        except (OSError, tarfile.TarError, EOFError, zlib.error) as error:
            raise ImageArchiveError(f"{path}: not a readable tar archive ({error or type(error).__name__})") from None

    def _index(self) -> dict[str, tarfile.TarInfo]:
        members: dict[str, tarfile.TarInfo] = {}
        for member in self._tar:
            name = _normal(member.name)
            if name is None or member.isdir():
                continue
            if name in members:
                raise ImageArchiveError(f"{self.label}: {name} appears twice in the archive")
            members[name] = member
        return members

    def _resolve(self, name: str) -> tarfile.TarInfo | None:
        member = self._members.get(name)
        for _ in range(8):
            if member is None or member.isfile():
                return member
            if member.issym():
                target = _normal(posixpath.join(posixpath.dirname(name), member.linkname))
            elif member.islnk():
                target = _normal(member.linkname)
            else:
                return None
            if target is None:
                return None
            name, member = target, self._members.get(target)
        return None

    def has(self, name: str) -> bool:
        return self._resolve(name) is not None

    def open(self, name: str) -> IO[bytes]:
        member = self._resolve(name)
        handle = self._tar.extractfile(member) if member is not None else None
        if handle is None:
            raise ImageArchiveError(f"{self.label}: {name} is not in the archive")
        return handle

    def close(self) -> None:
        self._tar.close()


class _Folder:
    def __init__(self, path: Path) -> None:
        self.label = str(path)
        self._root = os.path.realpath(path)

    def _path(self, name: str) -> str | None:
        path = os.path.realpath(os.path.join(self._root, name))
        inside = path.startswith(self._root + os.sep)
        return path if inside and os.path.isfile(path) else None

    def has(self, name: str) -> bool:
        return self._path(name) is not None

    def open(self, name: str) -> IO[bytes]:
        path = self._path(name)
        if path is None:
            raise ImageArchiveError(f"{self.label}: {name} is not in the layout")
        return open(path, "rb")

    def close(self) -> None:
        pass


def _normal(name: str) -> str | None:
    """An archive path as manifests spell it (no ``./``), or None when it leaves the archive."""
    name = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith(("/", "../")) or name in (".", ".."):
        return None
    return name


class _Tee:
    """Reads a stream while hashing and counting what passes (gzip reads through it)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.hash.update(data)
        self.size += len(data)
        return data


# --- an opened archive ------------------------------------------------------------------------


class ImageArchive:
    """An opened archive: its images (read and checked on opening) and its blobs' bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.is_dir():
            self._source: _Tar | _Folder = _Folder(path)
        elif path.is_file():
            self._source = _Tar(path)
        else:
            raise ImageArchiveError(f"{path}: no such file or folder")
        self._blobs: dict[str, Blob] = {}
        try:
            self.format, self.images = self._read()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._source.close()

    def open_blob(self, blob: Blob) -> IO[bytes]:
        return self._source.open(blob.path)

    def _read(self) -> tuple[str, list[Image]]:
        has = self._source.has
        if has("manifest.json"):
            images = _read_docker_save(self)
            if has("index.json") and has("oci-layout"):
                _check_agreement(self, images, _read_oci(self))
                return "docker-save+oci", images
            return "docker-save", images
        if has("index.json"):
            return "oci-layout", _read_oci(self)
        raise ImageArchiveError(
            f"{self._source.label}: neither a docker save archive (manifest.json) nor an OCI layout (index.json)"
        )

    # reading, with every error one line naming the archive

    def has(self, name: str) -> bool:
        return self._source.has(name)

    def fail(self, message: str) -> ImageArchiveError:
        return ImageArchiveError(f"{self._source.label}: {message}")

    def read_bytes(self, name: str) -> bytes:
        try:
            with self._source.open(name) as handle:
                data = handle.read(MAX_JSON_BYTES + 1)
        except (OSError, tarfile.TarError, EOFError) as error:
            raise self.fail(f"cannot read {name} ({error})") from None
        if len(data) > MAX_JSON_BYTES:
            raise self.fail(f"{name} is larger than {MAX_JSON_BYTES} bytes")
        return data

    def read_json(self, name: str, data: bytes | None = None) -> Any:
        try:
            return json.loads(self.read_bytes(name) if data is None else data)
        except ValueError:
            raise self.fail(f"{name} is not JSON") from None

    def blob(self, name: str) -> Blob:
        """Hash a stored blob (once per archive): its stored bytes, and uncompressed when gzip."""
        if name not in self._blobs:
            blob = self._hash(name)
            named = _digest_in_name(name)
            if named is not None and named != blob.digest:
                raise self.fail(f"{name} does not match its digest: its content hashes to {blob.digest}")
            self._blobs[name] = blob
        return self._blobs[name]

    def _hash(self, name: str) -> Blob:
        try:
            with self._source.open(name) as handle:
                tee = _Tee(handle)
                head = handle.read(len(_ZSTD_MAGIC))
                if head.startswith(_ZSTD_MAGIC):
                    raise self.fail(f"{name} is zstd-compressed: save the image with gzip or uncompressed layers")
                compression = "gzip" if head.startswith(_GZIP_MAGIC) else "none"
                tee.hash.update(head)
                tee.size = len(head)
                diff = _gunzip_digest(_Prefixed(head, tee)) if compression == "gzip" else None
                while tee.read(CHUNK):
                    pass
        except (OSError, EOFError, zlib.error, tarfile.TarError) as error:
            raise self.fail(f"cannot read {name} ({error or type(error).__name__})") from None
        digest = "sha256:" + tee.hash.hexdigest()
        return Blob(name, digest, tee.size, diff or digest, compression)


class _Prefixed:
    """A stream that first gives back bytes already read from it."""

    def __init__(self, head: bytes, rest: _Tee) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        if self._head:
            head, self._head = (
                (self._head, b"")
                if size < 0 or size >= len(self._head)
                else (
                    self._head[:size],
                    self._head[size:],
                )
            )
            return head
        return self._rest.read(size)


def _gunzip_digest(stream: Any) -> str:
    digest = hashlib.sha256()
    with gzip.GzipFile(fileobj=stream, mode="rb") as content:
        for chunk in iter(lambda: content.read(CHUNK), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


@contextmanager
def open_images(path: Path) -> Iterator[ImageArchive]:
    """Open an image archive (file or folder) and read its images; closed on leaving."""
    archive = ImageArchive(path)
    try:
        yield archive
    finally:
        archive.close()


def _digest_in_name(name: str) -> str | None:
    """The digest a content-addressed name promises: ``blobs/sha256/<hex>``, or a legacy
    ``<hex>.json`` config."""
    head, _, tail = name.rpartition("/")
    if head.endswith("blobs/sha256") or (not head and tail.endswith(".json")):
        candidate = "sha256:" + tail.removesuffix(".json")
        return candidate if DIGEST.match(candidate) else None
    return None


# --- docker save ------------------------------------------------------------------------------


def _read_docker_save(archive: ImageArchive) -> list[Image]:
    entries = archive.read_json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise archive.fail("manifest.json lists no image")
    images = []
    for number, entry in enumerate(entries, 1):
        where = f"manifest.json image {number}"
        if not isinstance(entry, dict):
            raise archive.fail(f"{where} is not an object")
        config_path = _text(archive, entry.get("Config"), f"{where} Config")
        tags = entry.get("RepoTags") or []
        paths = entry.get("Layers")
        if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
            raise archive.fail(f"{where}: RepoTags is not a list of tags")
        if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
            raise archive.fail(f"{where}: Layers is not a list of files")
        config = _config_blob(archive, config_path, None, where)
        layers = tuple(archive.blob(_member(archive, path, where)) for path in paths)
        images.append(_image(archive, tuple(normalise_reference(tag) for tag in tags), config, layers, where))
    return images


def _member(archive: ImageArchive, path: str, where: str) -> str:
    name = _normal(path)
    if name is None:
        raise archive.fail(f"{where} names {path!r}, outside the archive")
    return name


def _text(archive: ImageArchive, value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise archive.fail(f"{what} is missing")
    return value


def _config_blob(archive: ImageArchive, path: str, digest: str | None, where: str) -> bytes:
    name = _member(archive, path, where)
    data = archive.read_bytes(name)
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    promised = digest or _digest_in_name(name)
    if promised is not None and promised != found:
        raise archive.fail(
            f"{where}: config {name} does not match its digest {promised}: its content hashes to {found}"
        )
    return data


def _image(archive: ImageArchive, tags: tuple[str, ...], config: bytes, layers: tuple[Blob, ...], where: str) -> Image:
    document = archive.read_json(f"{where}: the image config", config)
    if not isinstance(document, dict):
        raise archive.fail(f"{where}: the image config is not a JSON object")
    rootfs = document.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) and DIGEST.match(d) for d in diff_ids):
        raise archive.fail(f"{where}: the image config has no rootfs.diff_ids list of sha256 digests")
    _match_layers(archive, where, diff_ids, layers)
    architecture = document.get("architecture")
    os_name = document.get("os")
    variant = document.get("variant")
    if not isinstance(architecture, str) or not architecture or not isinstance(os_name, str) or not os_name:
        raise archive.fail(f"{where}: the image config has no architecture or os")
    if variant is not None and not isinstance(variant, str):
        raise archive.fail(f"{where}: the image config's variant is not a string")
    settings = document.get("config")
    labels = (settings.get("Labels") if isinstance(settings, dict) else None) or {}
    if not isinstance(labels, dict) or not all(isinstance(value, str) for value in labels.values()):
        raise archive.fail(f"{where}: the image config's Labels are not an object of strings")
    return Image(
        tags=tags,
        config=config,
        config_digest="sha256:" + hashlib.sha256(config).hexdigest(),
        rootfs_layers=tuple(diff_ids),
        architecture=architecture,
        os=os_name,
        variant=variant or None,
        labels={key: value for key, value in sorted(labels.items()) if key.startswith(OCI_LABEL_PREFIX)},
        layers=layers,
        where=where,
    )


def _match_layers(archive: ImageArchive, where: str, diff_ids: list[str], layers: tuple[Blob, ...]) -> None:
    if len(diff_ids) != len(layers):
        raise archive.fail(
            f"{where}: the image config lists {counted(len(diff_ids), 'layer')} (rootfs.diff_ids),"
            f" the archive {len(layers)}"
        )
    for number, (diff_id, layer) in enumerate(zip(diff_ids, layers, strict=True), 1):
        if layer.diff_id != diff_id:
            raise archive.fail(
                f"{where}: layer {number} ({layer.path}) does not match its digest: its content hashes to "
                f"{layer.diff_id}, the image config's diff ID is {diff_id}"
            )


# --- OCI image layout ---------------------------------------------------------------------------


def _read_oci(archive: ImageArchive) -> list[Image]:
    layout = archive.read_json("oci-layout") if archive.has("oci-layout") else None
    if not isinstance(layout, dict) or not isinstance(layout.get("imageLayoutVersion"), str):
        raise archive.fail("oci-layout is missing or has no imageLayoutVersion")
    index = archive.read_json("index.json")
    descriptors = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(descriptors, list) or not descriptors:
        raise archive.fail("index.json lists no manifest")
    tags: dict[str, list[str]] = {}
    manifests: dict[str, Any] = {}
    for number, descriptor in enumerate(descriptors, 1):
        where = f"index.json manifest {number}"
        tag = _oci_tag(archive, _annotations(archive, descriptor, where), where)
        digest, manifest = _platform_manifest(archive, descriptor, where)
        tags.setdefault(digest, []).append(tag)
        manifests[digest] = manifest
    return [
        _oci_image(archive, manifests[digest], tuple(found), f"index.json manifest {digest}")
        for digest, found in tags.items()
    ]


def _annotations(archive: ImageArchive, descriptor: Any, where: str) -> dict[str, Any]:
    if not isinstance(descriptor, dict):
        raise archive.fail(f"{where} is not a descriptor")
    annotations = descriptor.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise archive.fail(f"{where}: annotations are not an object")
    return annotations


def _oci_tag(archive: ImageArchive, annotations: dict[str, Any], where: str) -> str:
    name = annotations.get(CONTAINERD_NAME)
    ref = annotations.get(OCI_REF_NAME)
    if isinstance(name, str) and name:
        return normalise_reference(name)
    if isinstance(ref, str) and ":" in ref.rpartition("/")[2]:
        return normalise_reference(ref)
    if isinstance(ref, str) and ref:
        raise archive.fail(
            f"{where}: {OCI_REF_NAME} {ref!r} names a tag but not the image; annotate it {CONTAINERD_NAME}, "
            f"or copy it as <name>:<tag> (skopeo copy oci:LAYOUT:{ref} oci:NEW:<name>:<tag>)"
        )
    raise archive.fail(f"{where} has no tag ({CONTAINERD_NAME} or {OCI_REF_NAME} annotation)")


def normalise_reference(reference: str) -> str:
    """``docker.io/library/x:tag`` (containerd, skopeo) as Docker shows it: ``x:tag``."""
    return reference.removeprefix("docker.io/library/")


def _read_blob_json(archive: ImageArchive, descriptor: dict[str, Any], where: str) -> Any:
    digest = descriptor.get("digest")
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise archive.fail(f"{where}: digest {digest!r} is not sha256:<64 hex>")
    name = "blobs/sha256/" + digest.removeprefix("sha256:")
    if not archive.has(name):
        raise archive.fail(f"{where}: blob {name} is not in the archive")
    data = _config_blob(archive, name, digest, where)
    size = descriptor.get("size")
    if isinstance(size, int) and size != len(data):
        raise archive.fail(f"{where}: blob {name} is {len(data)} bytes, its descriptor says {size}")
    return archive.read_json(name, data)


def _platform_manifest(archive: ImageArchive, descriptor: dict[str, Any], where: str) -> tuple[str, Any]:
    """The image manifest a descriptor names; through an image index, its one stored platform."""
    for _ in range(4):
        document = _read_blob_json(archive, descriptor, where)
        media_type = descriptor.get("mediaType") or (document.get("mediaType") if isinstance(document, dict) else None)
        if media_type in MANIFEST_TYPES or (media_type is None and isinstance(document, dict) and "config" in document):
            return str(descriptor["digest"]), document
        if media_type not in INDEX_TYPES or not isinstance(document, dict):
            raise archive.fail(f"{where}: {descriptor.get('digest')} is neither an image manifest nor an index")
        children = [child for child in document.get("manifests") or [] if _is_stored_image(archive, child)]
        if len(children) != 1:
            raise archive.fail(
                f"{where}: the image index holds {len(children)} stored platform images; save exactly one "
                "platform (docker save --platform ...)"
            )
        descriptor = children[0]
    raise archive.fail(f"{where}: image indexes nested too deep")


def _is_stored_image(archive: ImageArchive, child: Any) -> bool:
    if not isinstance(child, dict) or not isinstance(child.get("digest"), str):
        return False
    annotations = child.get("annotations") or {}
    platform = child.get("platform") or {}
    if isinstance(annotations, dict) and annotations.get("vnd.docker.reference.type") == "attestation-manifest":
        return False
    if isinstance(platform, dict) and platform.get("os") == "unknown":
        return False
    return archive.has("blobs/sha256/" + child["digest"].removeprefix("sha256:"))


def _oci_image(archive: ImageArchive, manifest: Any, tags: tuple[str, ...], where: str) -> Image:
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise archive.fail(f"{where} has no config descriptor")
    descriptors = manifest.get("layers")
    if not isinstance(descriptors, list):
        raise archive.fail(f"{where} has no layers list")
    config_descriptor = manifest["config"]
    config_digest = config_descriptor.get("digest")
    if not isinstance(config_digest, str) or not DIGEST.match(config_digest):
        raise archive.fail(f"{where}: config digest {config_digest!r} is not sha256:<64 hex>")
    config = _config_blob(archive, "blobs/sha256/" + config_digest.removeprefix("sha256:"), config_digest, where)
    layers = tuple(_oci_layer(archive, descriptor, f"{where} layer {n}") for n, descriptor in enumerate(descriptors, 1))
    return _image(archive, tags, config, layers, where)


def _oci_layer(archive: ImageArchive, descriptor: Any, where: str) -> Blob:
    if not isinstance(descriptor, dict):
        raise archive.fail(f"{where} is not a descriptor")
    if descriptor.get("urls"):
        raise archive.fail(f"{where} is a foreign layer (urls): it is not in the archive")
    digest = descriptor.get("digest")
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise archive.fail(f"{where}: digest {digest!r} is not sha256:<64 hex>")
    blob = archive.blob("blobs/sha256/" + digest.removeprefix("sha256:"))
    size = descriptor.get("size")
    if isinstance(size, int) and size != blob.size:
        raise archive.fail(f"{where}: blob {blob.path} is {blob.size} bytes, its descriptor says {size}")
    return blob


def _check_agreement(archive: ImageArchive, saved: list[Image], indexed: list[Image]) -> None:
    """A Docker 25+ archive describes each image twice (manifest.json for the classic image store,
    index.json for containerd's); both must tag the same images, or what a node gets would depend
    on its Docker's image store. (The same config means the same layers: both were checked.)"""
    classic = {image.config_digest: image for image in saved}
    oci = {image.config_digest: image for image in indexed}
    for config in sorted(classic.keys() | oci.keys()):
        one, other = classic.get(config), oci.get(config)
        if one is None or other is None:
            only = "manifest.json" if other is None else "index.json"
            raise archive.fail(
                f"the image with config {config} is only in {only}, not in both manifest.json and index.json"
            )
        if sorted(one.tags) != sorted(other.tags):
            raise archive.fail(
                f"manifest.json tags the image with config {config} {', '.join(one.tags) or '(untagged)'}, "
                f"index.json {', '.join(other.tags) or '(untagged)'}"
            )
