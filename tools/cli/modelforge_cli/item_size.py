"""DynamoDB item sizes, by the rules DynamoDB bills by (developer guide, "Item sizes and formats").

Used by the benchmarks to show what a heartbeat's write costs, and by tests that keep the node
item under one write unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

#: One standard write capacity unit covers an item of up to this many bytes.
WRITE_UNIT_BYTES = 1024


def number_size(text: str) -> int:
    """Bytes DynamoDB counts for a Number value given as its string form (e.g. ``"1712.5"``).

    Approximately 1 byte per two significant digits (rounded up) plus 1 byte, with leading and
    trailing zeros trimmed, as DynamoDB documents it. ``"0"`` counts 1 byte.
    """
    try:
        digits = Decimal(text.strip()).as_tuple().digits
    except InvalidOperation:
        raise ValueError(f"not a DynamoDB number: {text!r}") from None
    significant = "".join(map(str, digits)).strip("0")
    return math.ceil(len(significant) / 2) + 1


def attribute_value_size(value: Mapping[str, Any]) -> int:
    """Bytes DynamoDB counts for one attribute value in wire format (without its name).

    ``value`` is a typed value as boto3's low-level client returns it, e.g. ``{"S": "x"}``,
    ``{"N": "12.5"}``, ``{"M": {...}}``. Rules (DynamoDB developer guide, "Item sizes and
    formats"): S is its UTF-8 bytes; N is ``number_size``; B its raw bytes; BOOL and NULL 1
    byte; L and M 3 bytes of overhead plus 1 byte per element plus the elements (for M, each
    element is its key's UTF-8 bytes plus its value); SS/NS/BS the sum of their members.
    """
    if len(value) != 1:
        raise ValueError(f"an attribute value has exactly one type key, got {sorted(value)}")
    ((kind, content),) = value.items()
    if kind == "S":
        return len(content.encode("utf-8"))
    if kind == "N":
        return number_size(content)
    if kind == "B":
        return len(content)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(member.encode("utf-8")) for member in content)
    if kind == "NS":
        return sum(number_size(member) for member in content)
    if kind == "BS":
        return sum(len(member) for member in content)
    if kind == "L":
        return 3 + sum(1 + attribute_value_size(element) for element in content)
    if kind == "M":
        return 3 + sum(1 + len(key.encode("utf-8")) + attribute_value_size(element) for key, element in content.items())
    raise ValueError(f"unknown DynamoDB attribute type {kind!r}")


def item_size(item: Mapping[str, Mapping[str, Any]]) -> int:
    """Size in bytes that DynamoDB bills for ``item``, a raw item as ``get_item`` returns it.

    The sum, over the attributes, of the attribute name's UTF-8 bytes plus the value's size
    (``attribute_value_size``). Example: ``{"id": {"S": "abc"}, "n": {"N": "123"}}`` is
    (2 + 3) + (1 + 3) = 9 bytes. This is the figure write units are computed from; it does
    not include the 100 bytes per item that storage billing adds.
    """
    return sum(item_size_breakdown(item).values())


def item_size_breakdown(item: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Bytes per attribute (name + value) of a raw item; they add up to ``item_size``."""
    return {name: len(name.encode("utf-8")) + attribute_value_size(value) for name, value in item.items()}


def write_units(size_bytes: int) -> int:
    """Standard write capacity units for one write of an item this size (1 per started KB)."""
    return max(1, math.ceil(size_bytes / WRITE_UNIT_BYTES))
