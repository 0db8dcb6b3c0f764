"""The emulator writes DynamoDB attribute values into its answers in one step.

moto serializes every answer by walking the service model: for each attribute value of each item
it tries each of the ten members of ``AttributeValue`` (``S``, ``N``, ``B``, ``SS``, ``NS``, ``BS``,
``M``, ``L``, ``NULL``, ``BOOL``) through a generic attribute picker, with key aliases. On the local
stack's claim path that walk was a quarter of the emulator process's CPU time, more than the
transactions themselves (docs/SCALE.md).

An attribute value from moto's items is already what the wire carries: a one-key dict such as
``{"S": "text"}``, ``{"N": "12"}``, ``{"BOOL": true}``, ``{"SS": [...]}``, or a ``{"M": {...}}`` or
``{"L": [...]}`` of such values. Where a value is exactly that (plain strings, booleans, lists and
dicts, all the way down), it is written as it is, which is what moto's walk produces for it.
Anything else (a binary value, which moto base64-encodes on the way out, or any other shape) goes
through moto's walk as before. ``tests/unit/test_emulator_attribute_serializer.py`` checks the two
agree on random nested values and on the answers of real operations.
"""

from __future__ import annotations

from typing import Any

#: The moto internals this module patches or reads (the emulator's canary test checks them).
MOTO_INTERNALS = (
    "moto.core.serialize.BaseJSONSerializer._serialize_type_structure",
    "moto.core.serialize.ResponseSerializer.get_serialized_name",
)

#: The shape moto's DynamoDB model gives an attribute value.
SHAPE = "AttributeValue"
_STRINGS = frozenset({"S", "N"})
_FLAGS = frozenset({"BOOL", "NULL"})
_STRING_SETS = frozenset({"SS", "NS"})
#: Returned where a value is not a plain attribute value: moto's walk handles it.
_NOT_PLAIN = object()


def make_attribute_values_serialize_in_one_step() -> None:
    """Patch moto (once per process): see the module's docstring."""
    from moto.core.serialize import BaseJSONSerializer

    original = BaseJSONSerializer._serialize_type_structure
    if getattr(original, "_modelforge_patched", False):
        return

    def _serialize_type_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == SHAPE:
            plain = plain_attribute_value(value)
            if plain is not _NOT_PLAIN:
                serialized[self.get_serialized_name(shape, key)] = plain
                return
        original(self, serialized, value, shape, key)

    _serialize_type_structure.__wrapped__ = original  # type: ignore[attr-defined]  # moto's own
    _serialize_type_structure._modelforge_patched = True  # type: ignore[attr-defined]
    BaseJSONSerializer._serialize_type_structure = _serialize_type_structure  # type: ignore[method-assign]


def plain_attribute_value(value: Any) -> Any:
    """``value`` as the wire carries it, or ``_NOT_PLAIN`` where moto's walk must decide."""
    if type(value) is not dict or len(value) != 1:
        return _NOT_PLAIN
    ((kind, inner),) = value.items()
    if kind in _STRINGS:
        return value if type(inner) is str else _NOT_PLAIN
    if kind in _FLAGS:
        return value if type(inner) is bool else _NOT_PLAIN
    if kind in _STRING_SETS:
        return {kind: list(inner)} if type(inner) is list and all(type(each) is str for each in inner) else _NOT_PLAIN
    if kind == "M" and type(inner) is dict:
        return _plain_members(inner, kind)
    if kind == "L" and type(inner) is list:
        return _plain_list(inner)
    return _NOT_PLAIN


def _plain_members(members: dict[Any, Any], kind: str) -> Any:
    plain: dict[str, Any] = {}
    for name, member in members.items():
        if type(name) is not str:
            return _NOT_PLAIN
        converted = plain_attribute_value(member)
        if converted is _NOT_PLAIN:
            return _NOT_PLAIN
        plain[name] = converted
    return {kind: plain}


def _plain_list(entries: list[Any]) -> Any:
    plain = []
    for entry in entries:
        converted = plain_attribute_value(entry)
        if converted is _NOT_PLAIN:
            return _NOT_PLAIN
        plain.append(converted)
    return {"L": plain}
