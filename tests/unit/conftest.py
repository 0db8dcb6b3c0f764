"""Fixtures for the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from modelforge_local_stack import emulator

from tests.support.emulators import bare_emulator


@pytest.fixture()
def emulator_server() -> Iterator[emulator.Emulator]:
    """A bare embedded emulator (``tests.support.emulators.bare_emulator``)."""
    with bare_emulator() as running:
        yield running
