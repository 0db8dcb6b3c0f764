"""`modelforge admin-token new`: a fresh admin token, and its SHA-256 for the deployed stack."""

from __future__ import annotations

import sys

from modelforge_protocol.credentials import new_secret, sha256_hex


def run_new() -> int:
    """Print a new token on stdout (so ``KEY=$(modelforge admin-token new)`` works) and, on
    stderr, the digest the deployed stack takes instead of the token."""
    token = new_secret()  # 256 bits from the operating system's CSPRNG
    print(token)
    print(
        "admin token generated (shown once; store it in your secret manager). For the deployed stack pass "
        f"AdminTokenSha256={sha256_hex(token)} (or set MODELFORGE_ADMIN_TOKEN_SHA256)",
        file=sys.stderr,
    )
    return 0
