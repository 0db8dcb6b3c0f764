"""Write the release bundle's one tarball: every image of the release in the archive format that
Docker 25 and later write with `docker save`, which every `docker image load` reads.

It is two archives in one, over the same blobs (``blobs/sha256/<hex>``):

- ``manifest.json`` and ``repositories``, what the classic image store loads (any Docker version);
- ``oci-layout`` and ``index.json`` (one OCI image manifest per image, tagged with the
  ``io.containerd.image.name`` and ``org.opencontainers.image.ref.name`` annotations), what the
  containerd image store loads.

Config blobs are copied byte for byte (so the classic store's image ID is the build host's), layer
blobs as stored in the input (uncompressed or gzip). The output is deterministic: the same images
give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Sequence
from typing import Any, BinaryIO

from modelforge_protocol.canonical import canonical_bytes

from .release_images import OCI_CONFIG, OCI_INDEX, OCI_LAYER, OCI_LAYER_GZIP, OCI_MANIFEST, Blob, Image, ImageArchive

_LAYER_TYPES = {"none": OCI_LAYER, "gzip": OCI_LAYER_GZIP}


def _json(document: Any) -> bytes:
    return canonical_bytes(document, ascii_only=True)


def _blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def oci_manifest(image: Image) -> bytes:
    """The OCI image manifest of one image, over its stored config and layer blobs."""
    return _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": image.config_digest, "size": len(image.config)},
            "layers": [
                {"mediaType": _LAYER_TYPES[layer.compression], "digest": layer.digest, "size": layer.size}
                for layer in image.layers
            ],
        }
    )


def write_bundle_tarball(output: BinaryIO, images: Sequence[tuple[str, Image, ImageArchive]]) -> None:
    """Write to ``output`` the tarball holding each ``(tag, image, archive it came from)``, tagged
    ``tag`` only. The caller opens ``output`` (a new file, never through a link) and closes it."""
    small: dict[str, bytes] = {}
    layers: dict[str, tuple[Blob, ImageArchive]] = {}
    saved, descriptors, repositories = [], [], {}
    for tag, image, archive in images:
        manifest = oci_manifest(image)
        small[image.config_digest] = image.config
        small[_digest(manifest)] = manifest
        for layer in image.layers:
            layers.setdefault(layer.digest, (layer, archive))
        saved.append(
            {
                "Config": _blob_name(image.config_digest),
                "RepoTags": [tag],
                "Layers": [_blob_name(layer.digest) for layer in image.layers],
            }
        )
        name, _, version = tag.rpartition(":")
        repositories[name] = {version: image.config_digest.removeprefix("sha256:")}
        descriptors.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": _digest(manifest),
                "size": len(manifest),
                "annotations": {
                    "io.containerd.image.name": f"docker.io/library/{tag}",
                    "org.opencontainers.image.ref.name": version,
                },
            }
        )
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descriptors}
    with tarfile.open(fileobj=output, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for digest in sorted(small.keys() | layers.keys()):
            if digest in small:
                tar.addfile(_info(_blob_name(digest), len(small[digest])), io.BytesIO(small[digest]))
            else:
                layer, archive = layers[digest]
                with archive.open_blob(layer) as content:
                    tar.addfile(_info(_blob_name(digest), layer.size), content)
        for name, data in (
            ("index.json", _json(index)),
            ("manifest.json", _json(saved)),
            ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
            ("repositories", _json(repositories)),
        ):
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
