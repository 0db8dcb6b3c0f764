"""Check a release bundle folder: every file against ``SHA256SUMS``, then the images tarball
against the manifest (tag, RootFS layer list in order, architecture/os/variant, every recorded
OCI label). The image/config ID is recorded in the manifest but never compared: ``docker load``
may rewrite it. Each difference is one line naming the image, the field, and what was expected
and found."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelforge_protocol.release_bundle import check_manifest, manifest_file_name, parse_tag, shorten
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from .release_images import Image, ImageArchiveError, open_images
from .release_sums import SUMS_FILE, check_sums, parse_sums
from .tables import counted


class Refused(Exception):
    """The bundle (or the images given) is refused: every reason, one line each (exit 1)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class UsageError(Exception):
    """A path or argument that cannot be used (exit 2)."""


@dataclass(frozen=True)
class Verified:
    folder: Path
    bundle: Path
    manifest: dict[str, Any]
    #: differences that are recorded only, never enforced (a rewritten config digest)
    notes: list[str]


def image_name(image: Image) -> str | None:
    """The release image name an image is tagged with, when it has exactly one parsable tag."""
    parsed = parse_tag(image.tags[0]) if len(image.tags) == 1 else None
    return parsed[0] if parsed else None


def compare_image(name: str, entry: dict[str, Any], image: Image) -> list[str]:
    """How ``image`` differs from its manifest entry, each line ``images.<name>.<field>: ...``."""
    prefix = f"images.{name}"
    problems = []
    if list(image.tags) != [entry.get("tag")]:
        problems.append(f"{prefix}.tag: expected {entry.get('tag')}, found {', '.join(image.tags) or '(untagged)'}")
    layers = _layer_difference(list(entry.get("rootfs_layers") or []), list(image.rootfs_layers))
    if layers:
        problems.append(f"{prefix}.rootfs_layers: {layers}")
    for field, found in (("architecture", image.architecture), ("os", image.os), ("variant", image.variant)):
        if entry.get(field) != found:
            problems.append(f"{prefix}.{field}: expected {entry.get(field) or '(none)'}, found {found or '(none)'}")
    problems.extend(
        f"{prefix}.labels: {problem}" for problem in _label_differences(entry.get("labels") or {}, image.labels)
    )
    return problems


def _layer_difference(expected: list[str], found: list[str]) -> str:
    if expected == found:
        return ""
    first = next(
        (i for i, (one, other) in enumerate(zip(expected, found, strict=False)) if one != other),
        min(len(expected), len(found)),
    )
    at = (
        f"layer {first + 1}: expected {expected[first] if first < len(expected) else '(no layer)'}, "
        f"found {found[first] if first < len(found) else '(no layer)'}"
    )
    if sorted(expected) == sorted(found):
        return f"the same {len(found)} layers in another order; {at}"
    if len(expected) != len(found):
        return f"expected {counted(len(expected), 'layer')}, found {len(found)}; {at}"
    return at


def _label_differences(expected: dict[str, Any], found: dict[str, str]) -> list[str]:
    problems = []
    for label, value in sorted(expected.items()):
        if label not in found:
            problems.append(f"{label}: expected {shorten(value)}, missing from the image")
        elif found[label] != value:
            problems.append(f"{label}: expected {shorten(value)}, found {shorten(found[label])}")
    problems.extend(
        f"{label}: not in the manifest, found {shorten(value)}"
        for label, value in sorted(found.items())
        if label not in expected
    )
    return problems


def compare_bundle_images(manifest: dict[str, Any], images: Sequence[Image]) -> tuple[list[str], list[str]]:
    """``(differences, notes)`` between the manifest's ``images`` and the images of a tarball."""
    entries: dict[str, Any] = manifest.get("images") or {}
    problems, notes = [], []
    by_name: dict[str, Image] = {}
    for image in images:
        name = image_name(image)
        if name is None or name not in entries:
            problems.append(
                f"images: the bundle holds {', '.join(image.tags) or 'an untagged image'} "
                f"(config {image.config_digest}), which the manifest does not list"
            )
        elif name in by_name:
            problems.append(f"images.{name}: the bundle holds it twice")
        else:
            by_name[name] = image
    for name, entry in entries.items():
        held = by_name.get(name)
        if held is None:
            problems.append(f"images.{name}: in the manifest, not in the bundle")
            continue
        problems.extend(compare_image(name, entry, held))
        if entry.get("config_digest") != held.config_digest:
            notes.append(
                f"images.{name}.config_digest: {held.config_digest}, the build host recorded "
                f"{entry.get('config_digest')} (recorded only: not compared)"
            )
    return problems, notes


def verify_bundle(folder: Path, tag_version: str = IMAGE_TAG_VERSION) -> Verified:
    """Check the bundle folder; :class:`Refused` with every difference, or what was verified."""
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a folder (give the folder holding {SUMS_FILE}, the manifest and the tarball)")
    sums_path = folder / SUMS_FILE
    if not sums_path.is_file():
        raise Refused([f"{SUMS_FILE}: missing from {folder}"])
    try:
        sums, problems = parse_sums(sums_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise Refused([f"{SUMS_FILE}: not text"]) from None
    problems += check_sums(folder, sums)
    if problems:
        raise Refused(problems)
    manifest_name = manifest_file_name(tag_version)
    if manifest_name not in sums:
        listed = ", ".join(sorted(sums))
        raise Refused(
            [f"{SUMS_FILE}: does not list {manifest_name}, the manifest of release {tag_version} (it lists {listed})"]
        )
    manifest = _read_manifest(folder / manifest_name)
    problems = check_manifest(manifest, tag_version)
    if problems:
        raise Refused([f"{manifest_name}: {problem}" for problem in problems])
    bundle = folder / manifest["bundle"]
    if manifest["bundle"] not in sums:
        raise Refused([f"{SUMS_FILE}: does not list {manifest['bundle']}, the tarball the manifest names"])
    try:
        with open_images(bundle) as archive:
            problems, notes = compare_bundle_images(manifest, archive.images)
    except ImageArchiveError as error:
        raise Refused([str(error)]) from None
    if problems:
        raise Refused(problems)
    return Verified(folder=folder, bundle=bundle, manifest=manifest, notes=notes)


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise Refused([f"{path.name}: not JSON"]) from None
    if not isinstance(document, dict):
        raise Refused([f"{path.name}: not a JSON object"])
    return document
