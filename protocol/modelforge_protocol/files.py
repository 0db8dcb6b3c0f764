"""Files that are either wholly written or not there at all, and survive a power cut once written.

The bytes go to a new temporary file in the target's folder (created exclusively, never through
a link), are flushed and fsynced, then renamed over the target; the folder is fsynced so the
rename itself is durable. A failure removes the temporary file and raises the ``OSError``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def temporary_name(path: Path) -> Path:
    """A fresh hidden name next to ``path``: ``.<name>.<pid>.<random>.tmp``."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_directory(folder: Path) -> None:
    """Make the entries of ``folder`` (a rename, a new file) durable."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path, *, mode: int = 0o600, sync_directory: bool = True) -> Iterator[BinaryIO]:
    """A binary handle whose bytes replace ``path`` when the block ends without an exception.

    ``mode`` is the file's permission bits, set before anything is written. An exception in the
    block (the caller's way to abandon the write) leaves ``path`` as it was. ``sync_directory``
    False: the caller fsyncs the folder once after several writes (``fsync_directory``).
    """
    path = Path(path)
    temporary = temporary_name(path)
    fd = os.open(temporary, _CREATE, mode)
    try:
        with os.fdopen(fd, "wb") as handle:  # closes ``fd`` whatever happens next
            os.fchmod(handle.fileno(), mode)  # exactly ``mode``, whatever the umask
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        if sync_directory:
            fsync_directory(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, sync_directory: bool = True) -> None:
    """Replace ``path`` with ``data``, durably and all at once (see ``atomic_file``)."""
    with atomic_file(path, mode=mode, sync_directory=sync_directory) as handle:
        handle.write(data)
