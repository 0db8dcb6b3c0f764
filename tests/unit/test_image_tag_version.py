"""The release number as image tags spell it: one conversion from the one version source."""

from __future__ import annotations

import pytest
from modelforge_protocol.versions import IMAGE_TAG_VERSION, RELEASE, image_tag_version


@pytest.mark.parametrize(
    ("release", "tag"),
    [("1.3.0rc1", "1.3.0-rc.1"), ("1.3.0", "1.3.0"), ("2.0.0a3", "2.0.0-alpha.3"), ("1.0.10b12", "1.0.10-beta.12")],
)
def test_image_tag_version_pep440_release_semver_tag(release: str, tag: str) -> None:
    assert image_tag_version(release) == tag


@pytest.mark.parametrize("release", ["1.3", "1.3.0.dev1", "1.3.0rc", "latest", "1.3.0-rc.1", ""])
def test_image_tag_version_unrecognised_release_refused(release: str) -> None:
    with pytest.raises(ValueError, match="is not MAJOR.MINOR.PATCH"):
        image_tag_version(release)


def test_image_tag_version_default_is_this_release() -> None:
    assert image_tag_version(RELEASE) == IMAGE_TAG_VERSION
