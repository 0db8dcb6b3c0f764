from __future__ import annotations

import pytest
from modelforge_protocol.canonical import canonical_bytes


def test_canonical_bytes_sorts_keys_without_spaces_in_utf8() -> None:
    assert canonical_bytes({"b": 1, "a": ["é", {"d": 2, "c": 3}]}) == '{"a":["é",{"c":3,"d":2}],"b":1}'.encode()


def test_canonical_bytes_ascii_only_escapes_non_ascii() -> None:
    assert canonical_bytes({"a": "é"}, ascii_only=True) == b'{"a":"\\u00e9"}'


def test_canonical_bytes_non_finite_number_is_refused() -> None:
    with pytest.raises(ValueError):
        canonical_bytes({"a": float("nan")})
