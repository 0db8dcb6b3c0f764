"""The emulator's Query reads only the items under the asked key, as DynamoDB does.

moto answers a Query by sorting every item of the table (``Table.all_items()``) and then keeping
those whose key matches, so one Query costs O(n log n) in the table's size, with Python-level
comparisons. DynamoDB reads only the key's partition. On a work table holding a thousand items
a claim's Query held the emulator's lock about 60 ms, against 17 ms for its transaction, and that
(not the control plane) bounded claims under contention on the local stack (docs/SCALE.md).

Here each table keeps, per index it has been queried on, the keys of its items under each value
of the index's partition key, and a Query hands moto only those items. moto does everything else
as before: its own key checks, sort, pagination, filter and projection run on that smaller list,
so the answer is the same, item for item and in the same order. The table's own key needs no such
map: ``Table.items`` is already keyed by it.

The map is built on an index's first Query (one pass over the table) and kept on every path that
changes an item: ``Table.put_item`` (puts, batch writes, PartiQL, restores, an update's new item),
``Table.delete_item``, ``DynamoDBBackend.update_item`` (moto updates an item in place), and the
emulator's undo of a cancelled transaction (``touched``). A key the map holds wrongly costs
nothing (moto checks every item it is handed); a key it lacks would hide an item, so anything that
cannot be placed (an attribute of a type that cannot be a key) drops the table's maps, and the next
Query rebuilds them. ``tests/integration/test_emulator_key_index.py`` checks the answers against
moto's own Query after every kind of write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Where a table keeps its maps: {index name: _IndexKeys}.
_ATTRIBUTE = "_modelforge_key_index"
#: Guards the maps where requests run concurrently (an emulator built with ``serialize=False``).
_lock = threading.RLock()
#: The items a Query in progress on this thread may see, by table: handed to moto's query through
#: ``Table.all_items``, which moto's query calls once.
_candidates = threading.local()

#: The moto internals this module patches or reads (the emulator's canary test checks them).
MOTO_INTERNALS = (
    "moto.dynamodb.models.table.Table.query",
    "moto.dynamodb.models.table.Table.all_items",
    "moto.dynamodb.models.table.Table.put_item",
    "moto.dynamodb.models.table.Table.delete_item",
    "moto.dynamodb.models.table.Table.all_indexes",
    "moto.dynamodb.models.table.Table.get_item",
    "moto.dynamodb.models.DynamoDBBackend.update_item",
    "moto.dynamodb.models.DynamoDBBackend.get_table",
)

ItemKey = tuple[Any, Any]  # (hash key, range key or None), as moto's DynamoTypes


class _IndexKeys:
    """One index's map: the keys of the items under each value of its partition key."""

    def __init__(self, attributes: tuple[str, ...]) -> None:
        #: the index's partition key attributes, in schema order
        self.attributes = attributes
        self.keys_by_value: dict[tuple[Any, ...], set[ItemKey]] = {}
        self.value_by_key: dict[ItemKey, tuple[Any, ...]] = {}

    def place(self, key: ItemKey, item: Any) -> None:
        """Put ``key`` under the value ``item`` (None: no item) now has. Raises TypeError where a
        value cannot be a key (moto would still match it: the caller drops the maps)."""
        old = self.value_by_key.pop(key, None)
        if old is not None:
            keys = self.keys_by_value[old]
            keys.discard(key)
            if not keys:
                del self.keys_by_value[old]
        if item is None:
            return
        values = tuple(item.attrs.get(attribute) for attribute in self.attributes)
        if any(value is None for value in values):
            return  # not in the index: DynamoDB indexes an item only with every key attribute
        self.keys_by_value.setdefault(values, set()).add(key)  # TypeError on an unhashable value
        self.value_by_key[key] = values


def make_queries_read_only_their_key() -> None:
    """Patch moto (once per process): see the module's docstring."""
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    if getattr(Table.query, "_modelforge_patched", False):
        return
    _patch(Table, "query", _query)
    _patch(Table, "all_items", _all_items)
    _patch(Table, "put_item", _put_item)
    _patch(Table, "delete_item", _delete_item)
    _patch(DynamoDBBackend, "update_item", _update_item)


def touched(table: Any, hash_key: Any, range_key: Any) -> None:
    """Keep ``table``'s maps right after something other than moto's own writes changed the item
    at this key (the emulator's undo of a cancelled transaction)."""
    maps: dict[str, _IndexKeys] | None = table.__dict__.get(_ATTRIBUTE)
    if not maps:
        return
    key = (hash_key, range_key)
    item = table.get_item(hash_key, range_key) if range_key is not None or not table.range_key_attr else None
    with _lock:
        try:
            for index in maps.values():
                index.place(key, item)
        except TypeError:
            table.__dict__.pop(_ATTRIBUTE, None)


def _patch(owner: type, name: str, replacement: Callable[..., Any]) -> None:
    original = getattr(owner, name)

    def patched(*args: Any, **kwargs: Any) -> Any:
        return replacement(original, *args, **kwargs)

    patched.__name__ = name
    patched.__doc__ = replacement.__doc__
    patched.__wrapped__ = original  # type: ignore[attr-defined]  # moto's own, for the canary test
    patched._modelforge_patched = True  # type: ignore[attr-defined]
    setattr(owner, name, patched)


def _query(original: Callable[..., Any], table: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
    """moto's query, handed only the items under the asked key where the Query names one."""
    index_name = kwargs.get("index_name") if "index_name" in kwargs else (args[6] if len(args) > 6 else None)
    candidates = _candidates_for(table, hash_key, index_name, kwargs.get("hash_key_conditions"))
    if candidates is None:
        return original(table, hash_key, *args, **kwargs)
    with _handing(table, candidates):
        return original(table, hash_key, *args, **kwargs)


def _all_items(original: Callable[..., Any], table: Any) -> Any:
    """moto's all_items, or (inside a Query that names a key) that key's items in the same order."""
    handed: dict[int, list[Any]] | None = getattr(_candidates, "by_table", None)
    if handed is not None and id(table) in handed:
        return _in_table_order(handed[id(table)])
    return original(table)


def _in_table_order(items: list[Any]) -> list[Any]:
    """Sorted as moto's ``all_items`` sorts (by hash key, then range key)."""
    return sorted(items, key=lambda item: (item.hash_key, item.range_key) if item.range_key else item.hash_key)


@contextmanager
def _handing(table: Any, candidates: list[Any]) -> Iterator[None]:
    handed: dict[int, list[Any]] | None = getattr(_candidates, "by_table", None)
    if handed is None:
        handed = _candidates.by_table = {}
    handed[id(table)] = candidates
    try:
        yield
    finally:
        handed.pop(id(table), None)


def _candidates_for(
    table: Any, hash_key: Any, index_name: str | None, conditions: list[tuple[str, Any]] | None
) -> list[Any] | None:
    """The items a Query may match (a superset is fine), or None to let moto look at them all."""
    if not index_name:
        if hash_key is None:
            return None
        under = table.items.get(hash_key)
        if under is None:
            return []
        return list(under.values()) if table.range_key_attr else [under]
    index = next((each for each in table.all_indexes() if each.name == index_name), None)
    if index is None:
        return None  # moto answers with its own validation error
    attributes = tuple(entry["AttributeName"] for entry in index.schema if entry["KeyType"] == "HASH")
    asked = dict(conditions or [])
    if not attributes or any(attribute not in asked for attribute in attributes):
        return None
    with _lock:
        keys = _index_keys(table, index_name, attributes)
        if keys is None:
            return None
        try:
            found = list(keys.keys_by_value.get(tuple(asked[attribute] for attribute in attributes), ()))
        except TypeError:
            return None
    items = (table.get_item(hash_value, range_value) for hash_value, range_value in found)
    return [item for item in items if item is not None]


def _index_keys(table: Any, index_name: str, attributes: tuple[str, ...]) -> _IndexKeys | None:
    """The table's map for this index, built on first use (None where an item cannot be placed)."""
    maps: dict[str, _IndexKeys] = table.__dict__.setdefault(_ATTRIBUTE, {})
    keys = maps.get(index_name)
    if keys is not None and keys.attributes == attributes:
        return keys
    keys = _IndexKeys(attributes)
    try:
        for under in table.items.values():
            for item in under.values() if table.range_key_attr else (under,):
                keys.place((item.hash_key, item.range_key), item)
    except TypeError:
        return None
    maps[index_name] = keys
    return keys


def _put_item(original: Callable[..., Any], table: Any, *args: Any, **kwargs: Any) -> Any:
    item = original(table, *args, **kwargs)
    touched(table, item.hash_key, item.range_key)
    return item


def _delete_item(original: Callable[..., Any], table: Any, hash_key: Any, range_key: Any, *args: Any) -> Any:
    try:
        return original(table, hash_key, range_key, *args)
    finally:
        touched(table, hash_key, range_key)


def _update_item(
    original: Callable[..., Any], backend: Any, table_name: str, key: Any, *args: Any, **kwargs: Any
) -> Any:
    """moto updates the item in place: place its key again afterwards, whatever happened."""
    try:
        return original(backend, table_name, key, *args, **kwargs)
    finally:
        _touched_by_key(backend, table_name, key)


def _touched_by_key(backend: Any, table_name: str, key: Any) -> None:
    from moto.dynamodb.models.dynamo_type import DynamoType

    table = backend.tables.get(table_name)
    if table is None or not table.__dict__.get(_ATTRIBUTE):
        return
    try:
        hash_key = DynamoType(key[table.hash_key_attr])
        range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
    except (KeyError, TypeError):
        table.__dict__.pop(_ATTRIBUTE, None)  # a key not understood: rebuild on the next Query
        return
    touched(table, hash_key, range_key)
