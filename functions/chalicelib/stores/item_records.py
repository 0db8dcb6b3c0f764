"""Between PynamoDB items and records: the stores' one conversion, both ways."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from pynamodb.models import Model

R = TypeVar("R")
M = TypeVar("M", bound=Model)


def record_of(item: Model, record_type: type[R]) -> R:
    """The record holding ``item``'s attributes (absent ones are None)."""
    values: dict[str, Any] = {}
    for spec in fields(record_type):  # type: ignore[arg-type]
        value = getattr(item, spec.name, None)
        if isinstance(value, float) and value.is_integer() and spec.type in ("int", "int | None"):
            value = int(value)
        values[spec.name] = value
    return record_type(**values)


def item_of(record: Any, model: type[M]) -> M:
    """The item to write for ``record`` (None attributes are left out)."""
    attributes = model.get_attributes()
    values = {spec.name: getattr(record, spec.name) for spec in fields(record)}
    hash_key = model._hash_key_attribute().attr_name
    range_key = model._range_key_attribute()
    keys = [values.pop(hash_key)]
    if range_key is not None:
        keys.append(values.pop(range_key.attr_name))
    present = {name: value for name, value in values.items() if value is not None and name in attributes}
    return model(*keys, **present)
