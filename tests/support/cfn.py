"""Reading a CloudFormation template as it would deploy: conditions decided, ``Fn::If`` resolved,
``AWS::NoValue`` removed, resources whose condition is false left out."""

from __future__ import annotations

from typing import Any

_NO_VALUE = object()


def resolve(template: dict[str, Any], conditions: dict[str, bool]) -> dict[str, Any]:
    """``template`` with every ``Fn::If`` on ``conditions`` resolved (each must be named there)."""
    resolved = _resolve(template, conditions)
    for section in ("Resources", "Outputs"):
        resolved[section] = {
            name: item
            for name, item in resolved.get(section, {}).items()
            if "Condition" not in item or conditions[item["Condition"]]
        }
    return resolved


def _resolve(value: Any, conditions: dict[str, bool]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"Fn::If"}:
            name, when_true, when_false = value["Fn::If"]
            return _resolve(when_true if conditions[name] else when_false, conditions)
        if value == {"Ref": "AWS::NoValue"}:
            return _NO_VALUE
        items = {key: _resolve(item, conditions) for key, item in value.items()}
        return {key: item for key, item in items.items() if item is not _NO_VALUE}
    if isinstance(value, list):
        return [item for item in (_resolve(entry, conditions) for entry in value) if item is not _NO_VALUE]
    return value
