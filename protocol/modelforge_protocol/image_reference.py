"""A registry image reference pinned by digest: the one registry form a node's configuration takes.

A tag can be moved to other bytes (``latest`` above all); a digest cannot. So where a node is
told which image to run from a registry, the reference must be ``<name>@sha256:<64 hex>``: the
name as Docker's reference grammar (distribution/reference) spells it, with an optional registry
host and port, and no tag. Standard library only: the control plane and the tools both import it.
"""

from __future__ import annotations

import re

#: A digest as OCI spells a SHA-256 one.
DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]{{1,5}})?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: ``[registry[:port]/]path[/path...]``: a first component is the registry when it has a dot or
#: a port, or is ``localhost`` (Docker's rule).
NAME = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*\Z")
#: Docker refuses longer names.
MAX_NAME_CHARS = 255
EXAMPLE = "registry.example.com/modelforge-node-agent@sha256:<64 hex>"


def check_pinned_reference(reference: str) -> list[str]:
    """What is wrong with ``reference`` as an image pinned by digest (empty: it is acceptable).

    Values are never echoed: the messages say which rule failed.
    """
    reference = reference.strip()
    if not reference:
        return [f"missing: give the image as {EXAMPLE}"]
    name, at, digest = reference.partition("@")
    if not at:
        return [f"not pinned by digest: a tag can be moved to other bytes; give {EXAMPLE}"]
    problems = []
    if not DIGEST.match(digest):
        problems.append("the digest after @ must be sha256: followed by 64 lowercase hex characters")
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        tag = last.rsplit(":", 1)[1]
        what = "the floating latest tag" if tag == "latest" else "a tag"
        problems.append(f"names {what} as well as a digest: give the name and the digest only ({EXAMPLE})")
        name = name[: len(name) - len(tag) - 1]
    if len(name) > MAX_NAME_CHARS:
        problems.append(f"the image name is longer than {MAX_NAME_CHARS} characters")
    elif not NAME.match(name):
        problems.append(
            "the image name is not a registry image name: [registry[:port]/]path, with lowercase letters, "
            "digits and . _ - in each path component"
        )
    return problems
