"""DynamoDB item-size arithmetic (modelforge_cli.item_size), on items sized by hand."""

from __future__ import annotations

import pytest
from modelforge_cli import item_size as sizes


def test_string_and_number_attributes() -> None:
    # "id" 2 + "abc" 3; "n" 1 + 123 (3 digits: 2 bytes + 1)
    assert sizes.item_size({"id": {"S": "abc"}, "n": {"N": "123"}}) == 9


@pytest.mark.parametrize(
    ("number", "size"),
    [
        ("0", 1),
        ("7", 2),
        ("42", 2),
        ("123", 3),
        ("100", 2),  # trailing zeros trimmed: one significant digit
        ("0.0010", 2),  # leading and trailing zeros trimmed
        ("-12.50", 3),  # 1, 2, 5
        ("1E+3", 2),
        ("1712345678.123", 8),  # a heartbeat timestamp: 13 significant digits
    ],
)
def test_number_sizes(number: str, size: int) -> None:
    assert sizes.number_size(number) == size


def test_boolean_and_null_are_one_byte() -> None:
    assert sizes.item_size({"ok": {"BOOL": False}, "gone": {"NULL": True}}) == (2 + 1) + (4 + 1)


def test_names_and_strings_count_utf8_bytes() -> None:
    # "é" is 2 bytes; "€" is 3 bytes, "uro" 3
    assert sizes.item_size({"é": {"S": "€uro"}}) == 2 + 6


def test_list_has_three_bytes_overhead_and_one_per_element() -> None:
    item = {"l": {"L": [{"S": "ab"}, {"N": "1"}]}}
    assert sizes.item_size(item) == 1 + 3 + (1 + 2) + (1 + 2)


def test_map_elements_count_their_key_names() -> None:
    item = {"m": {"M": {"k": {"S": "v"}, "n": {"N": "42"}}}}
    assert sizes.item_size(item) == 1 + 3 + (1 + 1 + 1) + (1 + 1 + 2)


def test_empty_and_nested_containers() -> None:
    assert sizes.item_size({"e": {"L": []}}) == 1 + 3
    assert sizes.item_size({"e": {"M": {}}}) == 1 + 3
    # x: map of 1 element ("y": list of 1 boolean)
    assert sizes.item_size({"x": {"M": {"y": {"L": [{"BOOL": True}]}}}}) == 1 + 3 + (1 + 1 + (3 + 1 + 1))


def test_binary_and_sets() -> None:
    item = {"b": {"B": b"\x00\x01\x02"}, "ss": {"SS": ["a", "bc"]}, "ns": {"NS": ["1", "100"]}}
    assert sizes.item_size(item) == (1 + 3) + (2 + 3) + (2 + 2 + 2)


def test_breakdown_adds_up_to_the_item_size() -> None:
    item = {"node_id": {"S": "node_1"}, "liveness": {"S": "online"}, "last_heartbeat_at": {"N": "1712345678.123"}}
    breakdown = sizes.item_size_breakdown(item)
    assert breakdown == {"node_id": 7 + 6, "liveness": 8 + 6, "last_heartbeat_at": 17 + 8}
    assert sizes.item_size(item) == sum(breakdown.values()) == 52


@pytest.mark.parametrize(("size", "units"), [(1, 1), (1024, 1), (1025, 2), (2048, 2), (2049, 3)])
def test_write_units_are_per_started_kilobyte(size: int, units: int) -> None:
    assert sizes.write_units(size) == units


@pytest.mark.parametrize("value", [{"S": "a", "N": "1"}, {"X": "a"}, {"N": "not a number"}])
def test_malformed_values_are_refused(value: dict) -> None:
    with pytest.raises(ValueError):
        sizes.attribute_value_size(value)
