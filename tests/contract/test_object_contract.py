"""The object store contract (``stores.contract.ObjectStore``) on both implementations: the
in-memory fake and ``S3ObjectStore`` on the embedded emulator's S3. What ``complete`` and the
admin reads rely on: ``copy`` copies the bytes as they are now (a later write to the source leaves
the copy alone) and says when there is no source; ``read`` gives the bytes, the size instead when
over the limit, None when absent; ``digest`` agrees."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from chalicelib.stores.contract import ObjectStore
from chalicelib.stores.object_store import S3ObjectStore
from modelforge_local_stack import emulator

from tests.support.emulators import CLIENT_OPTIONS
from tests.support.journal import Journal, MemoryObjectStore


@pytest.fixture(scope="module")
def s3_bucket(contract_emulator: emulator.Emulator) -> Iterator[tuple[Any, str]]:
    client = boto3.client("s3", endpoint_url=contract_emulator.endpoint_url, **CLIENT_OPTIONS)
    bucket = f"objects-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    yield client, bucket


@pytest.fixture(params=["memory", "s3"])
def objects(request: pytest.FixtureRequest) -> ObjectStore:
    if request.param == "memory":
        return MemoryObjectStore(Journal())
    client, bucket = request.getfixturevalue("s3_bucket")
    return S3ObjectStore(lambda: client, bucket)


def _key(name: str) -> str:
    return f"work-results/{secrets.token_hex(6)}/{name}"


def test_copy_keeps_the_bytes_as_they_were(objects: ObjectStore) -> None:
    source, copy = _key("1.json"), _key("sealed.json")
    objects.put(source, b'{"checked":true}', "application/json")
    assert objects.copy(source, copy) is True
    objects.put(source, b'{"replaced":true}', "application/json")
    assert objects.read(copy, 1024) == b'{"checked":true}'
    assert objects.digest(copy, 1024) == (hashlib.sha256(b'{"checked":true}').hexdigest(), 16)


def test_copy_of_nothing_says_so_and_makes_nothing(objects: ObjectStore) -> None:
    copy = _key("sealed.json")
    assert objects.copy(_key("absent.json"), copy) is False
    assert objects.read(copy, 1024) is None and objects.digest(copy, 1024) is None


def test_read_gives_the_bytes_up_to_the_limit_and_the_size_beyond(objects: ObjectStore) -> None:
    key = _key("1.json")
    objects.put(key, b"x" * 10, "application/json")
    assert objects.read(key, 10) == b"x" * 10
    assert objects.read(key, 9) == 10
    assert objects.read(_key("absent.json"), 10) is None
