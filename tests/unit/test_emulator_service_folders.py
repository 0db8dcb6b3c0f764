"""The emulator reads moto's list of services once (service_folders): same answer, no disk."""

from __future__ import annotations

import os

import pytest
from modelforge_local_stack import service_folders


def test_the_service_list_is_read_once_and_answered_the_same_from_then_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import backends

    path = os.path.dirname(backends.__file__)
    on_disk = sorted(
        name for name in os.listdir(path) if os.path.isdir(os.path.join(path, name)) and not name.startswith("__")
    )
    service_folders.make_service_list_read_once()
    service_folders.make_service_list_read_once()  # a second call changes nothing

    def no_disk(*args: object) -> list[str]:
        raise AssertionError("the service list was read from disk again")

    monkeypatch.setattr(os, "listdir", no_disk)
    assert list(backends.list_of_moto_modules()) == on_disk
    assert list(backends.list_of_moto_modules()) == on_disk  # a fresh iterator each time
    assert "dynamodb" in on_disk and "s3" in on_disk
