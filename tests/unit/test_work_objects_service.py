"""work_objects: an item's input and result bytes for admins, against the in-memory stores: the
input as stored, the result from its sealed copy and only once succeeded, each refused with its
own code when the item, the object or the room for it is missing."""

from __future__ import annotations

import pytest
from chalicelib.domain.errors import Conflict, NotFound, TooLarge
from chalicelib.domain.records import WorkItem
from chalicelib.services import work, work_objects

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import work_record

WORK_ID = "work_" + "1" * 32


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _item(status: str, result: dict[str, object] | None = None) -> WorkItem:
    return work_record(WORK_ID, status=status, attempts=1, epoch=1, result=result)


def _succeeded(stores: MemoryStores, body: bytes) -> WorkItem:
    key = work.sealed_key(WORK_ID, 1)
    stores.objects.put(key, body, "application/json")
    item = _item("succeeded", {"sha256": "b" * 64, "size": len(body), "key": key})
    stores.work.seed(item)
    return item


def test_the_input_is_read_as_stored(stores: MemoryStores) -> None:
    item = _item("queued")
    stores.work.seed(item)
    stores.objects.put(item.input_key, b'{"n":1}', "application/json")
    assert work_objects.read_input(stores, WORK_ID) == b'{"n":1}'


def test_the_result_is_read_from_the_sealed_copy_not_the_upload(stores: MemoryStores) -> None:
    _succeeded(stores, b'{"text":"checked"}')
    stores.objects.upload(work.result_key(WORK_ID, 1), b'{"text":"replaced"}')
    assert work_objects.read_result(stores, WORK_ID) == b'{"text":"checked"}'


@pytest.mark.parametrize("status", ["queued", "leased", "dead", "cancelled"])
def test_a_result_before_success_is_not_ready(stores: MemoryStores, status: str) -> None:
    stores.work.seed(_item(status))
    with pytest.raises(Conflict) as raised:
        work_objects.read_result(stores, WORK_ID)
    assert raised.value.code == "result_not_ready"


@pytest.mark.parametrize("read", [work_objects.read_input, work_objects.read_result])
def test_an_unknown_or_malformed_work_id_is_work_not_found(stores: MemoryStores, read) -> None:  # type: ignore[no-untyped-def]
    for work_id in (WORK_ID, "../etc/passwd"):
        with pytest.raises(NotFound) as raised:
            read(stores, work_id)
        assert raised.value.code == "work_not_found"


def test_an_expired_object_is_not_found_by_its_own_code(stores: MemoryStores) -> None:
    stores.work.seed(_item("succeeded", {"sha256": "b" * 64, "size": 2, "key": work.sealed_key(WORK_ID, 1)}))
    for read, code in ((work_objects.read_input, "input_not_found"), (work_objects.read_result, "result_not_found")):
        with pytest.raises(NotFound) as raised:
            read(stores, WORK_ID)
        assert raised.value.code == code


def test_a_result_over_the_read_limit_is_refused_not_served(stores: MemoryStores) -> None:
    _succeeded(stores, b"x" * (work_objects.MAX_READ_BYTES + 1))
    with pytest.raises(TooLarge) as raised:
        work_objects.read_result(stores, WORK_ID)
    assert raised.value.code == "result_too_large_to_read"
    _succeeded(stores, b"x" * work_objects.MAX_READ_BYTES)
    assert len(work_objects.read_result(stores, WORK_ID)) == work_objects.MAX_READ_BYTES
