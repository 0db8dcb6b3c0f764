"""Who is calling: the admin token, or a node's bearer credential. No secret is ever echoed."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from modelforge_protocol.credentials import (
    ADMIN_TOKEN_HEADER,
    NODE_CREDENTIAL_RE,
    NODE_ID_HEADER,
    NODE_ID_RE,
    sha256_hex,
)

from chalicelib.domain.errors import Forbidden, Unauthenticated


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def require_admin(headers: Mapping[str, str], admin_token_sha256: str) -> None:
    presented = _header(headers, ADMIN_TOKEN_HEADER)
    if not presented:
        raise Unauthenticated("admin_token_missing", f"the {ADMIN_TOKEN_HEADER} header is required")
    # compare digests of equal length in constant time
    if not hmac.compare_digest(sha256_hex(presented), admin_token_sha256):
        raise Forbidden("admin_token_invalid", "the admin token is not valid")


@dataclass(frozen=True)
class NodeCaller:
    """A node's claimed identity and credential hash, before the database has checked them."""

    node_id: str
    credential_sha256: str = field(repr=False)


def require_node(headers: Mapping[str, str]) -> NodeCaller:
    """Parse the node's identity and bearer credential; the database checks them."""
    authorization = _header(headers, "Authorization") or ""
    node_id = _header(headers, NODE_ID_HEADER) or ""
    if not authorization or not node_id:
        raise Unauthenticated(
            "credential_missing",
            f"send 'Authorization: Bearer <node credential>' and {NODE_ID_HEADER}",
        )
    scheme, _, credential = authorization.partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not NODE_CREDENTIAL_RE.fullmatch(credential) or not NODE_ID_RE.fullmatch(node_id):
        raise Unauthenticated("credential_invalid", "the node credential is not valid")
    return NodeCaller(node_id=node_id, credential_sha256=sha256_hex(credential))


class _HasCredential(Protocol):
    credential_sha256: str
    credential_state: str


H = TypeVar("H", bound=_HasCredential)


def require_holder(node: H | None, caller: NodeCaller) -> H:
    """The node exists and the caller holds its active credential; else say which is wrong."""
    if node is None or not hmac.compare_digest(node.credential_sha256, caller.credential_sha256):
        raise credential_invalid()
    if node.credential_state != "active":
        raise credential_revoked()
    return node


def credential_invalid() -> Unauthenticated:
    return Unauthenticated("credential_invalid", "the node credential is not valid")


def credential_revoked() -> Unauthenticated:
    return Unauthenticated(
        "credential_revoked",
        "this node's credential was revoked; enroll the node again with a new token",
    )
