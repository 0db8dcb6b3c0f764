"""Formats of the secrets that cross the wire, and how to make them.

Every secret is 256 bits from the operating system's CSPRNG, URL-safe base64 (43 characters).
The control plane stores only SHA-256 digests of them.
"""

from __future__ import annotations

import hashlib
import re
import secrets

SECRET_BYTES = 32
_SECRET = r"[A-Za-z0-9_-]{43}"

#: ``mfe.<enrollment_id>.<secret>``: minted by an admin, consumed once by one agent.
ENROLLMENT_TOKEN_RE = re.compile(r"^mfe\.(enr_[0-9a-f]{32})\.(" + _SECRET + r")$")
#: ``mfn.<secret>``: created by the agent before it enrolls, presented as a bearer credential.
NODE_CREDENTIAL_RE = re.compile(r"^mfn\.(" + _SECRET + r")$")
#: ``mfi.<secret>``: created by the agent before it enrolls; makes an enroll retry-safe.
IDEMPOTENCY_KEY_RE = re.compile(r"^mfi\.(" + _SECRET + r")$")

ENROLLMENT_ID_RE = re.compile(r"^enr_[0-9a-f]{32}$")
NODE_ID_RE = re.compile(r"^node_[0-9a-f]{32}$")

ADMIN_TOKEN_HEADER = "X-ModelForge-Admin-Token"
NODE_ID_HEADER = "X-ModelForge-Node-Id"


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def new_enrollment_token(enrollment_id: str) -> str:
    return f"mfe.{enrollment_id}.{new_secret()}"


def new_node_credential() -> str:
    return f"mfn.{new_secret()}"


def new_idempotency_key() -> str:
    return f"mfi.{new_secret()}"


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()
