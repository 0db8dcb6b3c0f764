"""Protocol versions and the compatibility verdict, in one place for every component."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

#: The agent protocol version the control plane speaks and the agent reports.
AGENT_PROTOCOL_VERSION = 1
#: The runtime worker protocol version.
WORKER_PROTOCOL_VERSION = 1

# The release numbers, written once. The pyproject.toml files read them (setuptools
# ``version = {attr = ...}``), and the code imports them; keep them literal strings.

#: The version of every distribution built from this repository (modelforge-protocol,
#: modelforge-node-agent, modelforge-compute) in PEP 440: a release candidate until it is cut.
#: Only package metadata (pip, wheel file names) uses this form; people read IMAGE_TAG_VERSION.
RELEASE = "1.3.0rc1"


def image_tag_version(release: str = RELEASE) -> str:
    """The release as image tags and bundle names spell it (SemVer): ``1.3.0rc1`` -> ``1.3.0-rc.1``.

    PEP 440 pre-releases (``aN``, ``bN``, ``rcN``) become ``-alpha.N``, ``-beta.N`` and ``-rc.N``;
    a final release is unchanged. Anything else is refused, so a tag is never guessed.
    """
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(?:(a|b|rc)(\d+))?", release)
    if match is None:
        raise ValueError(f"release {release!r} is not MAJOR.MINOR.PATCH with an optional aN, bN or rcN")
    final, stage, number = match.groups()
    if stage is None:
        return final
    return f"{final}-{_SEMVER_STAGES[stage]}.{number}"


_SEMVER_STAGES = {"a": "alpha", "b": "beta", "rc": "rc"}

#: The tag of this release's images and bundle: ``modelforge-node-agent:<IMAGE_TAG_VERSION>``.
IMAGE_TAG_VERSION = image_tag_version()
# The one spelling of the release wherever a person reads it (docs/DEPLOY.md "Release numbers"):
#: what the agent reports as ``agent_version`` and its ``--version`` prints.
AGENT_VERSION = IMAGE_TAG_VERSION
#: Control plane release the accepted ranges below belong to (documented in docs/COMPATIBILITY.md):
#: ``GET /api/v1/health``'s ``release`` and the OpenAPI document's version.
CONTROL_PLANE_RELEASE = IMAGE_TAG_VERSION


class Component(str, enum.Enum):
    AGENT = "agent"
    WORKER = "worker"


@dataclass(frozen=True)
class AcceptedRange:
    """The oldest and newest protocol version a component may speak."""

    oldest: int
    newest: int


#: Which protocol versions this control plane accepts, per component.
ACCEPTED: dict[Component, AcceptedRange] = {
    Component.AGENT: AcceptedRange(oldest=1, newest=AGENT_PROTOCOL_VERSION),
    Component.WORKER: AcceptedRange(oldest=1, newest=WORKER_PROTOCOL_VERSION),
}


class Verdict(str, enum.Enum):
    COMPATIBLE = "COMPATIBLE"
    TOO_OLD = "TOO_OLD"
    TOO_NEW = "TOO_NEW"
    UNKNOWN = "UNKNOWN"


def parse_protocol_version(value: Any) -> int | None:
    """Return the integer protocol version, or None when it is missing or not an integer.

    Booleans are refused (``True`` is an ``int`` in Python), and so are strings and floats:
    a JSON body must carry a JSON integer.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def parse_query_protocol_version(value: str | None) -> int | None:
    """A protocol version from a query string: ASCII decimal digits only, else None."""
    if value is None or not (1 <= len(value) <= 9) or not all("0" <= char <= "9" for char in value):
        return None
    return int(value)


def verdict(component: Component, reported: Any) -> Verdict:
    """Judge a reported protocol version against what this control plane accepts."""
    version = parse_protocol_version(reported)
    if version is None or version < 1:
        return Verdict.UNKNOWN
    accepted = ACCEPTED[component]
    if version < accepted.oldest:
        return Verdict.TOO_OLD
    if version > accepted.newest:
        return Verdict.TOO_NEW
    return Verdict.COMPATIBLE


def next_step(component: Component, judged: Verdict) -> str:
    """What an operator should do about a verdict, in one sentence."""
    accepted = ACCEPTED[component]
    span = f"{accepted.oldest}..{accepted.newest}"
    name = "node agent" if component is Component.AGENT else "runtime worker"
    if judged is Verdict.COMPATIBLE:
        return "Nothing to do."
    if judged is Verdict.TOO_OLD:
        return f"Upgrade the {name} to a release that speaks protocol {span}; see docs/COMPATIBILITY.md."
    if judged is Verdict.TOO_NEW:
        return (
            f"Upgrade the control plane (it accepts {name} protocol {span}) "
            f"or run a {name} release that speaks protocol {span}; see docs/COMPATIBILITY.md."
        )
    return (
        f"Report protocol_version as an integer; this control plane accepts {name} protocol "
        f"{span}; see docs/COMPATIBILITY.md."
    )
