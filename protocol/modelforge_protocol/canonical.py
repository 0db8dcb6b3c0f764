"""Canonical JSON bytes: one spelling of a document, so equal documents have equal bytes.

Sorted keys, no whitespace, UTF-8. It is how the control plane stores a work item's input and
how the agent uploads a result, so a digest of either is stable. Non-finite numbers are refused
(``ValueError``): they are not JSON.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_bytes(document: Any, *, ascii_only: bool = False) -> bytes:
    """``document`` as canonical JSON bytes. ``ascii_only``: non-ASCII characters as ``\\uXXXX``
    escapes (the spelling ``diagnostic.echo`` hashes) instead of UTF-8."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, allow_nan=False)
    return text.encode("utf-8")
