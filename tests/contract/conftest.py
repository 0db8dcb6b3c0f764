"""The contract suite runs every test against both implementations of the store contract: the
in-memory fakes and the DynamoDB stores on one embedded emulator per session (tables per module,
emptied before each test). See docs/TESTING.md, "Store guards"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from modelforge_local_stack import emulator

from tests.support.emulators import bare_emulator
from tests.support.store_backends import Backend, DynamoBackend, MemoryBackend, dynamodb_tables


@pytest.fixture(scope="session")
def contract_emulator() -> Iterator[emulator.Emulator]:
    with bare_emulator() as running:
        yield running


@pytest.fixture(scope="module")
def dynamodb_backend(contract_emulator: emulator.Emulator) -> Iterator[DynamoBackend]:
    with dynamodb_tables(contract_emulator.endpoint_url) as names:
        yield DynamoBackend(contract_emulator.endpoint_url, names)


@pytest.fixture(params=["memory", "dynamodb"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each store implementation in turn, empty."""
    if request.param == "memory":
        return MemoryBackend()
    dynamodb: DynamoBackend = request.getfixturevalue("dynamodb_backend")
    dynamodb.clear()
    return dynamodb
