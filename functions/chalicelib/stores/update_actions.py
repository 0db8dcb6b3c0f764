"""PynamoDB update actions from plain values: the one way stores express an update.

``state_log.update_change`` records the same change for the state log; the two take the same
arguments. Kept apart so the heartbeat's hot path, which is never logged, does not load the
state-log module.
"""

from __future__ import annotations

from typing import Any

from pynamodb.models import Model


def update_actions(
    model: type[Model],
    values: dict[str, Any],
    *,
    add: dict[str, Any] | None = None,
    delete: dict[str, Any] | None = None,
    set_if_absent: dict[str, Any] | None = None,
) -> list[Any]:
    """The PynamoDB update actions that make the same change as ``update_change``."""
    attributes = model.get_attributes()
    actions: list[Any] = [
        attributes[name].remove() if value is None else attributes[name].set(value) for name, value in values.items()
    ]
    actions += [attributes[name].add(value) for name, value in (add or {}).items()]
    actions += [attributes[name].delete(value) for name, value in (delete or {}).items()]
    actions += [attributes[name].set(attributes[name] | value) for name, value in (set_if_absent or {}).items()]
    return actions
