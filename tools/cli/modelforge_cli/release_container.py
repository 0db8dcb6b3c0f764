"""The post-start check: does the created container run the image loaded from the bundle?

Input: the JSON ``docker inspect <container>`` prints, and the image ID captured right after
``docker image load`` (``docker image inspect --format '{{.Id}}' <tag>``). The container's
``.Image`` must be that ID exactly: a tag can be moved between load and start, an ID cannot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_IMAGE_ID = re.compile(r"(?:sha256:)?([0-9a-f]{64})\Z")


@dataclass(frozen=True)
class ContainerCheck:
    ok: bool
    message: str


def normalise_image_id(value: str) -> str:
    """``sha256:<64 hex>`` from a full image ID with or without the prefix; ValueError otherwise."""
    match = _IMAGE_ID.match(value.strip())
    if match is None:
        raise ValueError(
            f"{value[:80]!r} is not a full image ID (sha256:<64 hex>, as docker image inspect --format '{{{{.Id}}}}' prints it)"
        )
    return "sha256:" + match.group(1)


def check_container(inspect: Any, expected_image_id: str) -> ContainerCheck:
    """Compare one container's ``.Image`` with the loaded image's ID; ValueError when the input
    is not one container's ``docker inspect`` output."""
    expected = normalise_image_id(expected_image_id)
    containers = inspect if isinstance(inspect, list) else [inspect]
    if len(containers) != 1 or not isinstance(containers[0], dict):
        raise ValueError(f"expected the docker inspect output of one container, found {len(containers)} entries")
    container = containers[0]
    image = container.get("Image")
    name = str(container.get("Name") or container.get("Id") or "the container").lstrip("/")[:80]
    if not isinstance(image, str) or not image:
        raise ValueError("the docker inspect output has no .Image (is it a container's, not an image's?)")
    if image == expected:
        return ContainerCheck(True, f"{name} runs {expected}, the image loaded from the bundle")
    configured = container.get("Config", {}).get("Image") if isinstance(container.get("Config"), dict) else None
    via = f" (started from {str(configured)[:80]})" if configured else ""
    return ContainerCheck(
        False,
        f"{name} runs image {image[:80]}{via}, not {expected}, the image loaded from the bundle: "
        "stop it, check the image reference in the node's .env, and start it again "
        "with --no-build --pull never",
    )
