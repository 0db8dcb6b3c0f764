"""Opaque page tokens for list endpoints: the store's last evaluated key, base64url JSON."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from modelforge_protocol import strict_json
from modelforge_protocol.canonical import canonical_bytes

from chalicelib.domain.errors import invalid_request

#: The largest page a list answers (and its default size).
MAX_PAGE = 100
_KEY_VALUE = re.compile(r"^[a-z]+_[0-9a-f]{32}$")
#: A key is ``{"<key name>": {"S": "<value>"}}``.
_KEY_DEPTH = 2


def encode(last_key: dict[str, Any] | None) -> str | None:
    if not last_key:
        return None
    raw = canonical_bytes(last_key)
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode(token: str | None, key_name: str) -> dict[str, Any] | None:
    """Decode a token made by ``encode`` for a table keyed by ``key_name``; 400 otherwise."""
    if token is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        key = strict_json.loads(raw, max_depth=_KEY_DEPTH)
    except (binascii.Error, ValueError):  # bad base64, a non-ASCII token, strict_json.StrictJsonError
        raise invalid_request("next_token is not a token this API issued") from None
    attribute = key.get(key_name) if isinstance(key, dict) and len(key) == 1 else None
    value = attribute.get("S") if isinstance(attribute, dict) and len(attribute) == 1 else None
    if not isinstance(value, str) or not _KEY_VALUE.fullmatch(value):
        raise invalid_request("next_token is not a token this API issued")
    return key
