"""State-log events: what a transition changed, written to the outbox in its own transaction.

An event is JSON with a time-ordered id and a list of changes in DynamoDB's attribute-value
format, so ``modelforge log replay`` can apply them to empty tables without knowing the
domain. Only transitions are logged; heartbeat telemetry is not.
"""

from __future__ import annotations

import itertools
import json
import secrets
from datetime import UTC, datetime
from typing import Any

from pynamodb.models import Model

from chalicelib.config.resources import STATE_LOG_PREFIX
from chalicelib.domain.records import Event
from chalicelib.stores.models import MODELS_BY_LOGICAL_NAME, OutboxModel

_LOGICAL_NAME = {model: name for name, model in MODELS_BY_LOGICAL_NAME.items()}


def put_change(item: Model) -> dict[str, Any]:
    """The item was written whole."""
    return {"table": _LOGICAL_NAME[type(item)], "op": "put", "item": item.serialize()}


def update_change(
    model: type[Model],
    key: str,
    values: dict[str, Any],
    *,
    add: dict[str, Any] | None = None,
    delete: dict[str, Any] | None = None,
    set_if_absent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Named attributes of one item were changed: ``values`` set (None removes the attribute),
    ``add``/``delete`` add to or take from sets and numbers (DynamoDB ADD/DELETE, no read), and
    ``set_if_absent`` sets only what the item does not have yet (``if_not_exists``)."""
    hash_key = model._hash_key_attribute()
    change: dict[str, Any] = {
        "table": _LOGICAL_NAME[model],
        "op": "update",
        "key": {hash_key.attr_name: {hash_key.attr_type: key}},
        "set": _serialized(model, {name: value for name, value in values.items() if value is not None}),
        "remove": sorted(_stored_name(model, name) for name, value in values.items() if value is None),
    }
    for part, given in (("add", add), ("delete", delete), ("set_if_absent", set_if_absent)):
        if given:
            change[part] = _serialized(model, given)
    return change


def _stored_name(model: type[Model], name: str) -> str:
    """The name the table stores an attribute under (``attr_name``: a short one where each byte of
    the node item counts), which replay writes back."""
    return str(model.get_attributes()[name].attr_name)


def _serialized(model: type[Model], values: dict[str, Any]) -> dict[str, Any]:
    attributes = model.get_attributes()
    return {
        attributes[name].attr_name: {attributes[name].attr_type: attributes[name].serialize(value)}
        for name, value in values.items()
    }


def delete_change(item: Model) -> dict[str, Any]:
    """The item was deleted."""
    model = type(item)
    key = {name: value for name, value in item.serialize(null_check=False).items() if name in _key_names(model)}
    return {"table": _LOGICAL_NAME[model], "op": "delete", "key": key}


def _key_names(model: type[Model]) -> set[str]:
    names = {model._hash_key_attribute().attr_name}
    range_key = model._range_key_attribute()
    if range_key is not None:
        names.add(range_key.attr_name)
    return names


_order = itertools.count()


def new_event_id(now: float) -> str:
    """Time-ordered id: milliseconds, then this process's event counter, then a random suffix.

    The counter orders events made in the same millisecond by one function instance (the events
    of one transaction, or an enrollment and the duplicate flag it led to); instances are ordered
    by their clocks (see docs/ARCHITECTURE.md for the limit of that).
    """
    return f"{int(now * 1000):013d}-{next(_order):010d}-{secrets.token_hex(6)}"


def outbox_item(
    *,
    event_type: str,
    now: float,
    subject: dict[str, str],
    changes: list[dict[str, Any]],
    retention_seconds: int,
) -> OutboxModel:
    event_id = new_event_id(now)
    payload = {
        "event_id": event_id,
        "type": event_type,
        "occurred_at": round(now, 3),
        "subject": subject,
        "changes": changes,
    }
    return OutboxModel(
        event_id,
        event_type=event_type,
        occurred_at=round(now, 3),
        payload=json.dumps(payload, sort_keys=True, separators=(",", ":")),
        expires_at=datetime.fromtimestamp(int(now) + retention_seconds, tz=UTC),
    )


def event_item(event: Event, changes: list[dict[str, Any]], retention_seconds: int) -> OutboxModel:
    """The outbox item of ``event``, recording ``changes``."""
    return outbox_item(
        event_type=event.type,
        now=event.at,
        subject=event.subject,
        changes=changes,
        retention_seconds=retention_seconds,
    )


def state_log_key(event_id: str) -> str:
    return f"{STATE_LOG_PREFIX}{event_id}.json"
