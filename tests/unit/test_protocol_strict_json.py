from __future__ import annotations

import pytest
from modelforge_protocol import strict_json


def test_strict_json_loads_plain_json_returns_the_value() -> None:
    assert strict_json.loads(b'{"a": [1, 2.5, "x", null, true]}', max_depth=2) == {"a": [1, 2.5, "x", None, True]}
    assert strict_json.loads('"text"', max_depth=0) == "text"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_strict_json_loads_non_finite_constant_is_refused(constant: str) -> None:
    with pytest.raises(strict_json.RefusedConstant) as refused:
        strict_json.loads(f'{{"a": {constant}}}', max_depth=4)
    assert refused.value.reason == f"JSON constant {constant} is not allowed"


def test_strict_json_loads_number_beyond_a_float_is_refused() -> None:
    with pytest.raises(strict_json.RefusedNumber, match="number out of range"):
        strict_json.loads(b"[1e999]", max_depth=4)


def test_strict_json_loads_over_the_depth_is_refused_before_parsing() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # would exhaust the parser's recursion
    with pytest.raises(strict_json.TooDeep) as refused:
        strict_json.loads(deep, max_depth=32)
    assert refused.value.reason == "nested deeper than 32 levels"


def test_strict_json_loads_at_the_depth_is_accepted() -> None:
    assert strict_json.loads(b'{"a": [[1]]}', max_depth=3) == {"a": [[1]]}
    with pytest.raises(strict_json.TooDeep):
        strict_json.loads(b'{"a": [[1]]}', max_depth=2)


def test_strict_json_depth_ignores_brackets_in_strings() -> None:
    assert strict_json.depth(b'{"a": "[[[{{{\\"]]]"}') == 1
    assert strict_json.depth('["}}}"]') == 1
    assert strict_json.depth(b"3") == 0


def test_strict_json_loads_over_the_size_is_refused() -> None:
    with pytest.raises(strict_json.TooLarge, match="larger than 4 bytes"):
        strict_json.loads(b'"12345"', max_depth=1, max_bytes=4)
    with pytest.raises(strict_json.TooLarge):
        strict_json.loads('"éé"', max_depth=1, max_bytes=4)  # 6 UTF-8 bytes


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe{", b"{'a': 1}", b"[1,]"])
def test_strict_json_loads_not_json_is_refused_without_quoting_it(raw: bytes) -> None:
    with pytest.raises(strict_json.NotJson) as refused:
        strict_json.loads(raw, max_depth=4)
    assert refused.value.reason == "not JSON"


def test_strict_json_errors_are_value_errors() -> None:
    assert issubclass(strict_json.StrictJsonError, ValueError)
