"""A node's non-secret agent settings, checked and rendered for the console's Enroll node wizard.

The wizard sends what the admin chose; this answers every problem, each naming its field, or the
settings of the node's ``.env`` in order. The image rules are not written here: a pasted release
manifest entry is checked by ``modelforge_protocol.release_bundle`` (the rules ``modelforge release
manifest`` and ``verify`` apply), a registry reference by ``modelforge_protocol.image_reference``.
The settings themselves (names, order, the fixed values) are ``modelforge_protocol.agent_env``'s,
which ``modelforge enrollments create`` prints too. The enrollment token is never part of them: the
node's start script reads it from the terminal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol import schemas, strict_json
from modelforge_protocol.addresses import origin_problem
from modelforge_protocol.agent_env import agent_settings
from modelforge_protocol.image_reference import check_pinned_reference
from modelforge_protocol.release_bundle import NODE_AGENT_IMAGE, check_image_entry, release_tag
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from chalicelib.domain import requests

RELEASE_BUNDLE, REGISTRY, NO_CONTAINER = schemas.IMAGE_SOURCES
_HOSTNAME = re.compile(schemas.HOSTNAME_PATTERN)
#: An absolute path that needs no quoting in a .env file or a shell: no spaces, quotes, ``$`` or ``#``.
_STATE_VOLUME = re.compile(r"/[A-Za-z0-9._@%+=:,/-]{1,4094}\Z")
#: The JSON a pasted entry may nest (an entry is two levels deep).
_MAX_DEPTH = 16


@dataclass(frozen=True)
class Problem:
    #: the request field the problem is about
    field: str
    message: str


@dataclass(frozen=True)
class SettingsCheck:
    problems: list[Problem] = field(default_factory=list)
    #: the .env's settings, in order (name, value); empty while there are problems
    settings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(request: requests.NodeAgentSettings) -> SettingsCheck:
    """Every problem of the wizard's choices, or the node's settings when there is none."""
    problems: list[Problem] = []
    url = _control_plane_url(request.control_plane_url, problems)
    hostname = request.hostname.strip()
    if not _HOSTNAME.match(hostname):
        problems.append(
            Problem("hostname", "1 to 253 letters, digits, '.', '_' or '-', starting with a letter or digit")
        )
    state_volume = request.state_volume.strip()
    if not _STATE_VOLUME.match(state_volume) or "/../" in f"{state_volume}/":
        problems.append(
            Problem(
                "state_volume",
                "an absolute path on the node (letters, digits and . _ - / @ % + = : , only; no spaces, "
                "quotes or ..): the durable directory that keeps the node's identity",
            )
        )
    image = _image(request, problems)
    if problems:
        return SettingsCheck(problems=problems)
    return SettingsCheck(
        settings=agent_settings(
            control_plane_url=url,
            hostname=hostname,
            accelerator_mode=request.accelerator_mode,
            state_volume=state_volume,
            image=image,
        )
    )


def _control_plane_url(raw: str, problems: list[Problem]) -> str:
    """``scheme://host[:port]``: what the agent's MODELFORGE_AGENT_CONTROL_PLANE_URL must be, exactly
    (``modelforge_protocol.addresses.origin_problem``): nothing is stripped or dropped, so a value
    with a newline, a quote or a ``$()`` is refused, never cleaned up into another one."""
    problem = origin_problem(raw)
    if problem is not None:
        problems.append(
            Problem(
                "control_plane_url",
                f"{problem}. An agent's URL has no path: when the console is served under a path such as an "
                "API Gateway stage, open it through a domain that maps the API at the empty base path (docs/DEPLOY.md)",
            )
        )
        return ""
    return raw.rstrip("/")


def _image(request: requests.NodeAgentSettings, problems: list[Problem]) -> str | None:
    """The value of MODELFORGE_NODE_AGENT_IMAGE: the release's local tag, or a pinned registry image;
    None without a container (no image is run, and neither field is read)."""
    if request.image_source == NO_CONTAINER:
        return None
    if request.image_source == REGISTRY:
        reference = request.image_reference.strip()
        problems.extend(Problem("image_reference", message) for message in check_pinned_reference(reference))
        return reference
    entry = _parse_entry(request.manifest_entry, problems)
    if entry is not None:
        problems.extend(Problem("manifest_entry", message) for message in check_image_entry(NODE_AGENT_IMAGE, entry))
    return str(release_tag(NODE_AGENT_IMAGE))


def _parse_entry(text: str, problems: list[Problem]) -> Any:
    where = f"images.{NODE_AGENT_IMAGE} of modelforge-{IMAGE_TAG_VERSION}-manifest.json"
    if not text.strip():
        problems.append(Problem("manifest_entry", f"missing: paste the value of {where}"))
        return None
    try:
        return strict_json.loads(text, max_depth=_MAX_DEPTH)
    except strict_json.TooDeep:
        problems.append(
            Problem("manifest_entry", f"nested deeper than a manifest entry is: paste the value of {where}")
        )
    except strict_json.StrictJsonError:
        problems.append(Problem("manifest_entry", f"not valid JSON: paste the value of {where}, braces included"))
    return None
