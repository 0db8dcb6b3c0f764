"""Make a release bundle folder from image archives: one tarball holding every image of the
release (``modelforge-<release>-images.tar``, loaded with one ``docker image load``), the
manifest that describes each image (``modelforge-<release>-manifest.json``), and ``SHA256SUMS``
over both.

The images must be exactly the expected ones (by default the node agent and the runtime worker),
each tagged ``<name>:<release>`` and nothing else (never ``latest``), each once, with every digest
in its archive right and every entry rule of :mod:`modelforge_protocol.release_bundle` met, and
no label left at a Dockerfile's placeholder (:data:`PLACEHOLDER_LABELS`: built without
``--build-arg REVISION=… CREATED=… SOURCE=…``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from modelforge_protocol import files
from modelforge_protocol.release_bundle import (
    MANIFEST_FORMAT,
    RELEASE_IMAGES,
    bundle_file_name,
    check_image_entry,
    manifest_file_name,
    parse_tag,
    release_tag,
)
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from .release_images import Image, ImageArchive, ImageArchiveError, open_images
from .release_sums import SUMS_FILE, file_sha256, sums_text
from .release_tarball import write_bundle_tarball
from .release_verify import Refused, UsageError, compare_bundle_images

Selected = tuple[str, Image, ImageArchive]
T = TypeVar("T")

#: The build-arg defaults agent/Dockerfile and worker/Dockerfile give the labels only a build can
#: know: label -> (placeholder, build arg, the value to pass). An image that carries one was built
#: without that --build-arg, and its labels would not say which commit, when or from where.
PLACEHOLDER_LABELS: dict[str, tuple[str, str, str]] = {
    "org.opencontainers.image.revision": ("unknown", "REVISION", '"$(git rev-parse HEAD)"'),
    "org.opencontainers.image.created": ("1970-01-01T00:00:00Z", "CREATED", '"$(date -u +%Y-%m-%dT%H:%M:%SZ)"'),
    "org.opencontainers.image.source": ("unknown", "SOURCE", "<the repository URL>"),
}


def placeholder_label_problems(labels: dict[str, str]) -> list[str]:
    """One line per label that still holds its Dockerfile placeholder, naming the --build-arg."""
    return [
        f"labels: {label} is the Dockerfile's placeholder {placeholder!r}: the image was built without "
        f"--build-arg {argument}; rebuild it with --build-arg {argument}={value}"
        for label, (placeholder, argument, value) in PLACEHOLDER_LABELS.items()
        if labels.get(label) == placeholder
    ]


@dataclass(frozen=True)
class BundleFiles:
    folder: Path
    bundle: Path
    manifest: Path
    sums: Path
    tags: list[str]


def image_entry(tag: str, image: Image) -> dict[str, Any]:
    """One image's manifest entry (see :mod:`modelforge_protocol.release_bundle`)."""
    entry: dict[str, Any] = {
        "tag": tag,
        "rootfs_layers": list(image.rootfs_layers),
        "architecture": image.architecture,
        "os": image.os,
        "labels": dict(image.labels),
        "config_digest": image.config_digest,
    }
    if image.variant:
        entry["variant"] = image.variant
    return entry


def build_manifest(selected: Sequence[Selected], tag_version: str = IMAGE_TAG_VERSION) -> dict[str, Any]:
    images = {tag.rpartition(":")[0]: image_entry(tag, image) for tag, image, _ in selected}
    return {
        "format": MANIFEST_FORMAT,
        "release": tag_version,
        "bundle": bundle_file_name(tag_version),
        "images": dict(sorted(images.items())),
    }


def select_release_images(
    archives: Sequence[ImageArchive], expected: Sequence[str], tag_version: str = IMAGE_TAG_VERSION
) -> list[Selected]:
    """The expected images, one each, sorted by name; :class:`Refused` with every problem."""
    problems: list[str] = []
    chosen: dict[str, tuple[Image, ImageArchive]] = {}
    for archive in archives:
        for image in archive.images:
            name = _release_name(archive, image, expected, tag_version, problems)
            if name is None:
                continue
            if name in chosen:
                first = chosen[name][1].path
                where = f"twice in {first}" if first == archive.path else f"in {first} and in {archive.path}"
                problems.append(f"duplicate image {release_tag(name, tag_version)}: {where}")
                continue
            chosen[name] = (image, archive)
            entry = image_entry(release_tag(name, tag_version), image)
            problems.extend(
                f"{archive.path}: {entry['tag']}: {problem}"
                for problem in [*check_image_entry(name, entry, tag_version), *placeholder_label_problems(image.labels)]
            )
    problems.extend(
        f"missing image {release_tag(name, tag_version)}: none of the inputs holds it"
        for name in expected
        if name not in chosen
    )
    if problems:
        raise Refused(problems)
    return [(release_tag(name, tag_version), *chosen[name]) for name in sorted(chosen)]


def _release_name(
    archive: ImageArchive, image: Image, expected: Sequence[str], tag_version: str, problems: list[str]
) -> str | None:
    """The image's release name, or None after adding to ``problems`` why its tags are refused."""
    where = archive.path
    if not image.tags:
        problems.append(f"{where}: an untagged image (config {image.config_digest}); save images by their release tag")
        return None
    before = len(problems)
    for tag in image.tags:
        parsed = parse_tag(tag)
        if parsed is None:
            problems.append(
                f"{where}: {tag} is not <name>:<tag> (no registry or path);"
                f" tag it e.g. {release_tag(expected[0], tag_version)}"
            )
        elif parsed[1] == "latest":
            problems.append(
                f"{where}: {tag} is the floating latest tag;"
                f" tag and save the image as {release_tag(parsed[0], tag_version)} only"
            )
        elif parsed[1] != tag_version:
            problems.append(
                f"{where}: {tag} is not tagged for this release: expected {release_tag(parsed[0], tag_version)}"
            )
        elif parsed[0] not in expected:
            problems.append(
                f"{where}: {tag}: unexpected image; the bundle holds exactly {', '.join(expected)} (--expect)"
            )
    if len(problems) > before:
        return None
    if len(image.tags) > 1:
        problems.append(
            f"{where}: one image is tagged {', '.join(image.tags)}; save each image under its own release tag"
        )
        return None
    parsed = parse_tag(image.tags[0])
    return parsed[0] if parsed else None


def make_bundle(
    inputs: Sequence[Path],
    out_dir: Path,
    expected: Sequence[str] = RELEASE_IMAGES,
    tag_version: str = IMAGE_TAG_VERSION,
) -> BundleFiles:
    """Read and check the inputs, then write the tarball, the manifest and ``SHA256SUMS`` into
    ``out_dir``. The tarball is read back and compared with the manifest before anything is
    left in place; ``SHA256SUMS`` is written last.

    Every file is created new (``O_EXCL | O_NOFOLLOW``) and put in place without replacing
    anything: a file or link already at one of the names, the tarball's ``.partial`` included, is
    a :class:`UsageError` and is left as it is, whenever it appears."""
    bundle = out_dir / bundle_file_name(tag_version)
    manifest_path = out_dir / manifest_file_name(tag_version)
    sums = out_dir / SUMS_FILE
    partial = bundle.with_name(bundle.name + ".partial")
    for path in inputs:
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
    for path in (bundle, manifest_path, sums, partial):
        _refuse_taken(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        try:
            archives = [stack.enter_context(open_images(path)) for path in inputs]
        except ImageArchiveError as error:
            raise Refused([str(error)]) from None
        selected = select_release_images(archives, expected, tag_version)
        manifest = build_manifest(selected, tag_version)
        output = _new_file(partial, lambda target: files.create_new(target, mode=0o644))
        try:
            write_bundle_tarball(output, selected)
            output.close()
            _check_written(partial, manifest)
            manifest_bytes = (json.dumps(manifest, indent=2) + "\n").encode()
            _write(manifest_path, manifest_bytes)
            _new_file(bundle, lambda target: files.rename_new(partial, target))
        finally:
            output.close()
            partial.unlink(missing_ok=True)
    _write(sums, sums_text({bundle.name: file_sha256(bundle), manifest_path.name: file_sha256(manifest_path)}).encode())
    return BundleFiles(out_dir, bundle, manifest_path, sums, [tag for tag, _, _ in selected])


def _refuse_taken(path: Path) -> None:
    if os.path.lexists(path):
        kind = " (a link)" if path.is_symlink() else ""
        raise UsageError(f"{path} exists{kind}; remove it or choose another --out folder")


def _check_written(path: Path, manifest: dict[str, Any]) -> None:
    try:
        with open_images(path) as written:
            problems, _ = compare_bundle_images(manifest, written.images)
    except ImageArchiveError as error:
        problems = [str(error)]
    if problems:
        raise Refused(
            [f"the tarball written does not match its manifest (an input changed while read?): {problems[0]}"]
        )


def _new_file(path: Path, create: Callable[[Path], T]) -> T:
    """``create(path)``, with a name taken meanwhile (a planted link) a :class:`UsageError`."""
    try:
        return create(path)
    except FileExistsError:
        raise UsageError(
            f"{path} appeared while the bundle was written (a file or link); nothing was written through it: "
            "remove it or choose another --out folder"
        ) from None


def _write(path: Path, data: bytes) -> None:
    _new_file(path, lambda target: files.atomic_write(target, data, mode=0o644, replace=False))
