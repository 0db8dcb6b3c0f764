"""The release bundle's contract: its file names, its images, and the rules one manifest entry obeys.

``modelforge release manifest`` writes entries that follow these rules, ``modelforge release
verify`` reads them back with them, and the console's Enroll node wizard (which receives a pasted
``images.modelforge-node-agent`` entry) checks it with :func:`check_image_entry`: one set of rules,
here in the bottom layer so that the control plane can import it too. Standard library only.

One entry of the manifest's ``images`` object, keyed by image name::

    "modelforge-node-agent": {
      "tag": "modelforge-node-agent:1.3.0-rc.1",      # required, exactly <name>:<release>
      "rootfs_layers": ["sha256:<64 hex>", ...],      # required, the config's rootfs.diff_ids, in order
      "architecture": "amd64",                        # required
      "os": "linux",                                  # optional; "variant": "v8" too
      "labels": {"org.opencontainers.image.version": ..., ...},   # required: every OCI label
      "config_digest": "sha256:<64 hex>"              # recorded, never enforced
    }

``labels`` holds the image's ``org.opencontainers.image.*`` labels; the five of
:data:`REQUIRED_LABELS` must be among them, and the two whose value the release knows must have
it: ``version`` the release's tag version, ``title`` the image name. ``config_digest`` (the build
host's image/config ID) is ignored when checking: ``docker load`` may rewrite it.
"""

from __future__ import annotations

import re
from typing import Any

from .versions import IMAGE_TAG_VERSION

#: The ``format`` field of every manifest this release writes.
MANIFEST_FORMAT = "modelforge-release-manifest/1"

NODE_AGENT_IMAGE = "modelforge-node-agent"
RUNTIME_WORKER_IMAGE = "modelforge-runtime-worker"
#: The node's `.env` setting that names the agent image (the seed's Compose files read it).
NODE_AGENT_IMAGE_VARIABLE = "MODELFORGE_NODE_AGENT_IMAGE"
#: The `.env` setting that names each image, as the Compose files read them.
IMAGE_VARIABLES = {
    NODE_AGENT_IMAGE: NODE_AGENT_IMAGE_VARIABLE,
    RUNTIME_WORKER_IMAGE: "MODELFORGE_RUNTIME_WORKER_IMAGE",
}
#: The images a release bundle holds unless its maker names others.
RELEASE_IMAGES = (NODE_AGENT_IMAGE, RUNTIME_WORKER_IMAGE)

OCI_LABEL_PREFIX = "org.opencontainers.image."
#: The OCI labels every image of a release carries (issue 11's Dockerfiles set them).
REQUIRED_LABELS = tuple(OCI_LABEL_PREFIX + name for name in ("version", "revision", "source", "created", "title"))

#: The fields :func:`check_image_entry` reads; any other field (``config_digest``, ``id``) is ignored.
ENTRY_FIELDS = ("tag", "rootfs_layers", "architecture", "os", "variant", "labels")

DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
#: An image name as the release uses it: a Docker repository name without registry or path.
IMAGE_NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*\Z")
_DOCKER_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_PLATFORM_WORD = re.compile(r"[a-z0-9_]{1,32}\Z")
MAX_LAYERS = 512
MAX_LABEL_CHARS = 4096


def release_tag(name: str, tag_version: str = IMAGE_TAG_VERSION) -> str:
    """The one tag an image of this release carries: ``modelforge-node-agent:1.3.0-rc.1``."""
    return f"{name}:{tag_version}"


def parse_tag(tag: str) -> tuple[str, str] | None:
    """``(name, version)`` of a ``<name>:<version>`` tag without registry or path, else None."""
    name, colon, version = tag.rpartition(":")
    if not colon or not IMAGE_NAME.match(name) or not _DOCKER_TAG.match(version):
        return None
    return name, version


def bundle_file_name(tag_version: str = IMAGE_TAG_VERSION) -> str:
    """The bundle tarball every node loads: ``modelforge-1.3.0-rc.1-images.tar``."""
    return f"modelforge-{tag_version}-images.tar"


def manifest_file_name(tag_version: str = IMAGE_TAG_VERSION) -> str:
    return f"modelforge-{tag_version}-manifest.json"


def shorten(value: Any, limit: int = 80) -> str:
    """A value for a message: its JSON-ish repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_image_entry(name: str, entry: Any, tag_version: str = IMAGE_TAG_VERSION) -> list[str]:
    """What is missing or wrong in one manifest entry for image ``name`` (empty: it is acceptable).

    Each problem starts with the field it is about (``tag: ...``, ``labels: ...``). The
    image/config ID is not looked at.
    """
    if not isinstance(entry, dict):
        return [f"entry: not a JSON object (paste the value of images.{name})"]
    return [
        *_check_tag(name, entry.get("tag"), tag_version),
        *_check_layers(entry.get("rootfs_layers")),
        *_check_platform(entry),
        *_check_labels(name, entry.get("labels"), tag_version),
    ]


def _check_tag(name: str, tag: Any, tag_version: str) -> list[str]:
    expected = release_tag(name, tag_version)
    if tag is None:
        return [f"tag: missing (expected {expected})"]
    if tag == expected:
        return []
    if isinstance(tag, str) and tag.rpartition(":")[2] == "latest":
        return [f"tag: {shorten(tag)} is the floating latest tag; expected {expected}"]
    return [f"tag: expected {expected}, found {shorten(tag)}"]


def _check_layers(layers: Any) -> list[str]:
    if layers is None:
        return ["rootfs_layers: missing (the image config's rootfs.diff_ids, in order)"]
    if not isinstance(layers, list) or not layers:
        return ["rootfs_layers: expected a non-empty list of sha256:<64 hex> diff IDs"]
    if len(layers) > MAX_LAYERS:
        return [f"rootfs_layers: {len(layers)} layers, more than {MAX_LAYERS}"]
    return [
        f"rootfs_layers: layer {index} is {shorten(layer)}, not sha256:<64 lowercase hex>"
        for index, layer in enumerate(layers, 1)
        if not (isinstance(layer, str) and DIGEST.match(layer))
    ]


def _check_platform(entry: dict[str, Any]) -> list[str]:
    problems = []
    for field, required in (("architecture", True), ("os", False), ("variant", False)):
        value = entry.get(field)
        if value is None:
            if required:
                problems.append(f"{field}: missing (e.g. amd64 or arm64)")
        elif not (isinstance(value, str) and _PLATFORM_WORD.match(value)):
            problems.append(f"{field}: {shorten(value)} is not a platform word such as amd64")
    return problems


def known_label_values(name: str, tag_version: str = IMAGE_TAG_VERSION) -> dict[str, str]:
    """The labels whose value the release fixes: the version and the title (issue 11's Dockerfiles)."""
    return {OCI_LABEL_PREFIX + "version": tag_version, OCI_LABEL_PREFIX + "title": name}


def _check_labels(name: str, labels: Any, tag_version: str) -> list[str]:
    if labels is None:
        return [f"labels: missing (the image's {OCI_LABEL_PREFIX}* labels)"]
    if not isinstance(labels, dict):
        return ["labels: expected an object of label names and values"]
    problems = [f"labels: {label} missing" for label in REQUIRED_LABELS if label not in labels]
    for label, value in labels.items():
        if not label.startswith(OCI_LABEL_PREFIX):
            problems.append(f"labels: {shorten(label)} is not an {OCI_LABEL_PREFIX}* label")
        elif not isinstance(value, str) or not value or len(value) > MAX_LABEL_CHARS:
            problems.append(f"labels: {label} is {shorten(value)}, not a non-empty string")
    for label, expected in known_label_values(name, tag_version).items():
        value = labels.get(label)
        if isinstance(value, str) and value and value != expected:
            problems.append(f"labels.{label}: expected {expected}, found {shorten(value)}")
    return problems


def check_manifest(document: Any, tag_version: str = IMAGE_TAG_VERSION) -> list[str]:
    """What is wrong with a whole manifest: its format, release, bundle name and every entry.

    A problem with an entry is prefixed ``images.<name>.``.
    """
    if not isinstance(document, dict):
        return ["the manifest is not a JSON object"]
    problems = []
    if document.get("format") != MANIFEST_FORMAT:
        problems.append(f"format: expected {MANIFEST_FORMAT}, found {shorten(document.get('format'))}")
    if document.get("release") != tag_version:
        problems.append(
            f"release: this tool verifies release {tag_version}, the manifest is for {shorten(document.get('release'))}"
        )
    bundle = document.get("bundle")
    if not isinstance(bundle, str) or not _is_plain_file_name(bundle):
        problems.append(f"bundle: {shorten(bundle)} is not a file name in the bundle's folder")
    images = document.get("images")
    if not isinstance(images, dict) or not images:
        return [*problems, "images: expected an object of image entries, keyed by image name"]
    for name, entry in images.items():
        if not IMAGE_NAME.match(name):
            problems.append(f"images: {shorten(name)} is not an image name")
            continue
        if not isinstance(entry, dict):
            problems.append(f"images.{name}: not a JSON object")
            continue
        problems.extend(f"images.{name}.{problem}" for problem in check_image_entry(name, entry, tag_version))
    return problems


def _is_plain_file_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")
