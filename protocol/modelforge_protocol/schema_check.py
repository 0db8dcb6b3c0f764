"""A standard-library check of a value against the protocol's schemas, for a component that
does not carry ``jsonschema`` (the runtime worker).

It knows the keywords the schemas in ``schemas.py`` and ``work.py`` use, with JSON Schema's
meaning, and refuses a schema with any other keyword (``UnsupportedSchema``), so it is never
silently more permissive than ``jsonschema``. Each ``Violation`` names the field's path and the
rule, never the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_KNOWN = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "maxProperties",
        "items",
        "maxItems",
        "uniqueItems",
        "anyOf",
        "oneOf",
    }
)


class UnsupportedSchema(ValueError):
    """The schema uses a keyword this check does not implement."""


@dataclass(frozen=True)
class Violation:
    """``path``: the field (for ``required``, the missing one); ``keyword``: the rule it breaks."""

    path: tuple[str | int, ...]
    keyword: str


def _is(value: Any, type_name: str) -> bool:
    if isinstance(value, bool) and type_name in ("integer", "number"):
        return False
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[type_name])


def violations(schema: Mapping[str, Any], value: Any, path: tuple[str | int, ...] = ()) -> list[Violation]:
    """Every rule of ``schema`` that ``value`` breaks, outermost first (none: it matches)."""
    unknown = set(schema) - _KNOWN
    if unknown:
        raise UnsupportedSchema(f"schema keywords not supported: {', '.join(sorted(unknown))}")
    found: list[Violation] = []
    if "type" in schema and not _is(value, schema["type"]):
        return [Violation(path, "type")]  # nothing else applies to a value of another type
    if "enum" in schema and value not in schema["enum"]:
        found.append(Violation(path, "enum"))
    if isinstance(value, str):
        found += _string(schema, value, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        found += _number(schema, value, path)
    elif isinstance(value, dict):
        found += _object(schema, value, path)
    elif isinstance(value, list):
        found += _array(schema, value, path)
    if "anyOf" in schema and all(violations(option, value, path) for option in schema["anyOf"]):
        found.append(Violation(path, "anyOf"))
    if "oneOf" in schema and sum(not violations(option, value, path) for option in schema["oneOf"]) != 1:
        found.append(Violation(path, "oneOf"))
    return found


def _string(schema: Mapping[str, Any], value: str, path: tuple[str | int, ...]) -> list[Violation]:
    found = []
    if "minLength" in schema and len(value) < schema["minLength"]:
        found.append(Violation(path, "minLength"))
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        found.append(Violation(path, "maxLength"))
    if "pattern" in schema and not re.search(schema["pattern"], value):
        found.append(Violation(path, "pattern"))
    return found


def _number(schema: Mapping[str, Any], value: float, path: tuple[str | int, ...]) -> list[Violation]:
    found = []
    if "minimum" in schema and value < schema["minimum"]:
        found.append(Violation(path, "minimum"))
    if "maximum" in schema and value > schema["maximum"]:
        found.append(Violation(path, "maximum"))
    return found


def _object(schema: Mapping[str, Any], value: dict[str, Any], path: tuple[str | int, ...]) -> list[Violation]:
    found = [Violation((*path, name), "required") for name in schema.get("required", ()) if name not in value]
    properties: Mapping[str, Any] = schema.get("properties", {})
    if schema.get("additionalProperties", True) is False and set(value) - set(properties):
        found.append(Violation(path, "additionalProperties"))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        found.append(Violation(path, "maxProperties"))
    for name, subschema in properties.items():
        if name in value:
            found += violations(subschema, value[name], (*path, name))
    return found


def _identity(value: Any) -> str:
    """Equal JSON values spell the same (``1`` and ``1.0`` are equal; ``true`` and ``1`` are not)."""

    def plain(item: Any) -> Any:
        if isinstance(item, float) and item.is_integer():
            return int(item)
        if isinstance(item, dict):
            return {key: plain(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [plain(inner) for inner in item]
        return item

    return json.dumps(plain(value), sort_keys=True)


def _array(schema: Mapping[str, Any], value: list[Any], path: tuple[str | int, ...]) -> list[Violation]:
    found = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        found.append(Violation(path, "maxItems"))
    if schema.get("uniqueItems") and len({_identity(item) for item in value}) != len(value):
        found.append(Violation(path, "uniqueItems"))
    if "items" in schema:
        for index, item in enumerate(value):
            found += violations(schema["items"], item, (*path, index))
    return found
