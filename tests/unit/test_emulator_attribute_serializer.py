"""The emulator's one-step attribute values (modelforge_local_stack/attribute_serializer.py) give the
same answers as moto's own walk of the service model, value for value."""

from __future__ import annotations

import json
import random
import string
from typing import Any

import pytest
from modelforge_local_stack import attribute_serializer


def _serializer(operation: str, own: bool) -> Any:
    """moto's serializer for a DynamoDB operation: patched, or with moto's own structure walk."""
    from moto.core.serialize import get_serializer_class
    from moto.core.utils import get_service_model

    attribute_serializer.make_attribute_values_serialize_in_one_step()
    service = get_service_model("dynamodb")
    cls = get_serializer_class(service.service_name, service.protocol)
    if own:
        patched = cls._serialize_type_structure
        cls = type("OwnWalk", (cls,), {"_serialize_type_structure": patched.__wrapped__})
    return cls(operation_model=service.operation_model(operation))


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + "é 0") for _ in range(rng.randrange(0, 6)))


def _value(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A random attribute value as moto's items give it (binary ones included: moto's walk does
    those)."""
    kinds = ["S", "N", "BOOL", "NULL", "SS", "NS", "B"] + (["M", "L"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "S":
        return {"S": _text(rng)}
    if kind == "N":
        return {"N": str(rng.randrange(-1000, 1000))}
    if kind == "BOOL":
        return {"BOOL": rng.random() < 0.5}
    if kind == "NULL":
        return {"NULL": True}
    if kind == "SS":
        return {"SS": sorted({_text(rng) + "x" for _ in range(rng.randrange(1, 4))})}
    if kind == "NS":
        return {"NS": sorted({str(rng.randrange(100)) for _ in range(rng.randrange(1, 4))})}
    if kind == "B":
        return {"B": "aGVsbG8="}
    if kind == "M":
        return {"M": {_text(rng) + str(n): _value(rng, depth + 1) for n in range(rng.randrange(0, 4))}}
    return {"L": [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]}


def _item(rng: random.Random) -> dict[str, Any]:
    return {f"a{n}": _value(rng) for n in range(rng.randrange(1, 8))}


def _both(operation: str, result: dict[str, Any]) -> tuple[Any, Any]:
    patched = _serializer(operation, own=False).serialize(json.loads(json.dumps(result)))
    own = _serializer(operation, own=True).serialize(json.loads(json.dumps(result)))
    return json.loads(patched["body"]), json.loads(own["body"])


@pytest.mark.parametrize("seed", range(20))
def test_query_and_get_answers_are_the_same_as_moto_writes_them(seed: int) -> None:
    rng = random.Random(seed)
    items = [_item(rng) for _ in range(rng.randrange(0, 6))]
    query = {"Items": items, "Count": len(items), "ScannedCount": len(items), "LastEvaluatedKey": _item(rng)}
    patched, own = _both("Query", query)
    assert patched == own and len(own["Items"]) == len(items)
    if items:
        patched, own = _both("GetItem", {"Item": items[0]})
        assert patched == own and own["Item"]
    patched, own = _both("BatchGetItem", {"Responses": {"table": items}, "UnprocessedKeys": {}})
    assert patched == own


def test_plain_values_are_written_as_they_are_and_others_are_left_to_moto() -> None:
    plain = {"M": {"list": {"L": [{"S": "a"}, {"N": "1"}, {"BOOL": False}, {"SS": ["x"]}]}, "none": {"NULL": True}}}
    assert attribute_serializer.plain_attribute_value(plain) == plain
    for other in (
        {"B": "aGk="},
        {"S": 1},
        {"S": "a", "N": "1"},
        {},
        {"M": {"b": {"BS": []}}},
        {"L": [{"X": "y"}]},
        "S",
    ):
        assert attribute_serializer.plain_attribute_value(other) is attribute_serializer._NOT_PLAIN, other
    # and a value left to moto is still written as moto writes it
    patched, own = _both("GetItem", {"Item": {"b": {"B": "aGk="}, "m": {"M": {"b": {"B": "aGk="}}}}})
    assert patched == own
