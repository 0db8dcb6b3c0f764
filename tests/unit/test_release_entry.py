"""The rules of one release manifest entry (modelforge_protocol.release_bundle), as the release
tool writes it and the console checks a pasted `images.modelforge-node-agent`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from modelforge_cli.release_images import open_images
from modelforge_cli.release_manifest import image_entry
from modelforge_protocol.release_bundle import (
    REQUIRED_LABELS,
    bundle_file_name,
    check_image_entry,
    check_manifest,
    manifest_file_name,
    parse_tag,
    release_tag,
)
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.support.image_tarballs import release_image, write_docker_save

AGENT = "modelforge-node-agent"


@pytest.fixture()
def entry(tmp_path: Path) -> dict[str, Any]:
    """The entry the release tool writes for a real (small) agent image."""
    with open_images(write_docker_save(tmp_path / "agent.tar", [release_image(AGENT)])) as archive:
        return image_entry(release_tag(AGENT), archive.images[0])


def test_release_names_come_from_the_one_version_source() -> None:
    assert release_tag(AGENT) == f"{AGENT}:{IMAGE_TAG_VERSION}"
    assert bundle_file_name() == f"modelforge-{IMAGE_TAG_VERSION}-images.tar"
    assert manifest_file_name() == f"modelforge-{IMAGE_TAG_VERSION}-manifest.json"


def test_check_image_entry_tool_written_entry_accepted(entry: dict[str, Any]) -> None:
    assert check_image_entry(AGENT, entry) == []


@pytest.mark.parametrize("config_digest", [None, "sha256:" + "0" * 64, "not a digest"])
def test_check_image_entry_config_digest_ignored(entry: dict[str, Any], config_digest: str | None) -> None:
    entry["config_digest"] = config_digest
    assert check_image_entry(AGENT, entry) == []


@pytest.mark.parametrize(
    ("tag", "says"),
    [
        (f"{AGENT}:1.2.0", f"tag: expected {AGENT}:{IMAGE_TAG_VERSION}, found '{AGENT}:1.2.0'"),
        (f"{AGENT}:latest", "is the floating latest tag"),
        (f"modelforge-runtime-worker:{IMAGE_TAG_VERSION}", f"tag: expected {AGENT}:{IMAGE_TAG_VERSION}"),
        (f"registry.example/{AGENT}:{IMAGE_TAG_VERSION}", "tag: expected"),
        (None, "tag: missing"),
    ],
)
def test_check_image_entry_wrong_tag_named(entry: dict[str, Any], tag: str | None, says: str) -> None:
    entry["tag"] = tag
    problems = check_image_entry(AGENT, entry)
    assert len(problems) == 1 and says in problems[0], problems


@pytest.mark.parametrize(
    ("layers", "says"),
    [
        (None, "rootfs_layers: missing"),
        ([], "rootfs_layers: expected a non-empty list"),
        ("sha256:" + "a" * 64, "rootfs_layers: expected a non-empty list"),
        (["sha256:" + "a" * 64, "sha256:ABC"], "rootfs_layers: layer 2 is 'sha256:ABC'"),
    ],
)
def test_check_image_entry_bad_layer_list_named(entry: dict[str, Any], layers: Any, says: str) -> None:
    entry["rootfs_layers"] = layers
    problems = check_image_entry(AGENT, entry)
    assert len(problems) == 1 and says in problems[0], problems


def test_check_image_entry_missing_architecture_named(entry: dict[str, Any]) -> None:
    del entry["architecture"]
    assert check_image_entry(AGENT, entry) == ["architecture: missing (e.g. amd64 or arm64)"]


@pytest.mark.parametrize("label", REQUIRED_LABELS)
def test_check_image_entry_each_missing_required_label_named(entry: dict[str, Any], label: str) -> None:
    del entry["labels"][label]
    assert check_image_entry(AGENT, entry) == [f"labels: {label} missing"]


def test_check_image_entry_non_oci_or_empty_label_named(entry: dict[str, Any]) -> None:
    entry["labels"]["maintainer"] = "someone"
    entry["labels"]["org.opencontainers.image.title"] = ""
    problems = check_image_entry(AGENT, entry)
    assert len(problems) == 2
    assert any("'maintainer' is not an org.opencontainers.image.* label" in problem for problem in problems)
    assert any("org.opencontainers.image.title is '', not a non-empty string" in problem for problem in problems)


@pytest.mark.parametrize(
    ("label", "value", "expected"),
    [
        ("org.opencontainers.image.version", "1.2.9", IMAGE_TAG_VERSION),
        ("org.opencontainers.image.version", "latest", IMAGE_TAG_VERSION),
        ("org.opencontainers.image.title", "modelforge-runtime-worker", AGENT),
        ("org.opencontainers.image.title", "ModelForge node agent", AGENT),
    ],
)
def test_check_image_entry_wrong_known_label_value_named(
    entry: dict[str, Any], label: str, value: str, expected: str
) -> None:
    entry["labels"][label] = value
    assert check_image_entry(AGENT, entry) == [f"labels.{label}: expected {expected}, found {value!r}"]


def test_check_image_entry_known_label_values_follow_the_release_checked(entry: dict[str, Any]) -> None:
    """The version label must be the release being checked (``tag_version``), as the tag must."""
    entry["tag"] = release_tag(AGENT, "9.9.9")
    assert check_image_entry(AGENT, entry, "9.9.9") == [
        f"labels.org.opencontainers.image.version: expected 9.9.9, found {IMAGE_TAG_VERSION!r}"
    ]
    entry["labels"]["org.opencontainers.image.version"] = "9.9.9"
    assert check_image_entry(AGENT, entry, "9.9.9") == []


def test_check_image_entry_every_problem_at_once() -> None:
    broken = {"tag": f"{AGENT}:latest", "labels": {}}
    fields = [problem.split(":")[0] for problem in check_image_entry(AGENT, broken)]
    assert fields == ["tag", "rootfs_layers", "architecture", *["labels"] * len(REQUIRED_LABELS)]


def test_check_image_entry_not_an_object_refused() -> None:
    assert check_image_entry(AGENT, ["a list"]) == [f"entry: not a JSON object (paste the value of images.{AGENT})"]


def _manifest(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": "modelforge-release-manifest/1",
        "release": IMAGE_TAG_VERSION,
        "bundle": bundle_file_name(),
        "images": {AGENT: copy.deepcopy(entry)},
    }


def test_check_manifest_good_manifest_accepted(entry: dict[str, Any]) -> None:
    assert check_manifest(_manifest(entry)) == []


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("release", "1.2.0", "release: this tool verifies release"),
        ("bundle", "../elsewhere.tar", "bundle: '../elsewhere.tar' is not a file name"),
        ("format", "something-else/9", "format: expected modelforge-release-manifest/1"),
        ("images", {}, "images: expected an object of image entries"),
    ],
)
def test_check_manifest_bad_field_named(entry: dict[str, Any], field: str, value: Any, says: str) -> None:
    manifest = _manifest(entry)
    manifest[field] = value
    problems = check_manifest(manifest)
    assert len(problems) == 1 and problems[0].startswith(says), problems


def test_check_manifest_entry_problems_prefixed_with_the_image(entry: dict[str, Any]) -> None:
    manifest = _manifest(entry)
    manifest["images"][AGENT]["architecture"] = "AMD 64"
    assert check_manifest(manifest) == [f"images.{AGENT}.architecture: 'AMD 64' is not a platform word such as amd64"]


@pytest.mark.parametrize(
    ("tag", "parsed"),
    [
        (f"{AGENT}:1.3.0-rc.1", (AGENT, "1.3.0-rc.1")),
        (f"{AGENT}:latest", (AGENT, "latest")),
        (AGENT, None),
        (f"localhost:5000/{AGENT}:1", None),
        (f"{AGENT}@sha256:" + "a" * 64, None),
    ],
)
def test_parse_tag_only_plain_name_and_tag(tag: str, parsed: tuple[str, str] | None) -> None:
    assert parse_tag(tag) == parsed
