"""A bare embedded emulator for tests of the emulator itself (no tables, no control plane)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from modelforge_local_stack import emulator

#: Credentials moto accepts; the emulator never checks them.
CLIENT_OPTIONS = {"region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@contextmanager
def bare_emulator() -> Iterator[emulator.Emulator]:
    """A serialising emulator on an ephemeral 127.0.0.1 port, stopped afterwards. moto's state is
    per process, not per emulator: name each table or bucket uniquely."""
    running = emulator.Emulator(port=0)
    running.start()
    try:
        yield running
    finally:
        running.stop()
