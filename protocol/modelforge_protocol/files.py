"""Files that are either wholly written or not there at all, and survive a power cut once written.

The bytes go to a new temporary file in the target's folder (created exclusively, never through
a link), are flushed and fsynced, then renamed over the target; the folder is fsynced so the
rename itself is durable. A failure removes the temporary file and raises the ``OSError``.

Output that must never replace what is already there (a release bundle's files) is made with
``create_new`` (a new file, refused if anything, a link included, has the name) and put in place
with ``rename_new`` (refused likewise), or ``atomic_file(..., replace=False)``.
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


def create_new(path: Path, *, mode: int = 0o600) -> BinaryIO:
    """A binary handle on a file created at ``path`` with exactly ``mode``.

    ``FileExistsError`` if anything has that name: a file, a folder or a link (dangling or not),
    which is never followed (``O_EXCL | O_NOFOLLOW``).
    """
    fd = os.open(path, _CREATE, mode)
    handle = os.fdopen(fd, "wb")
    try:
        os.fchmod(handle.fileno(), mode)
    except BaseException:
        handle.close()
        raise
    return handle


def rename_new(source: Path, target: Path) -> None:
    """Move ``source`` to ``target`` in one step, ``FileExistsError`` if anything (a link included)
    has the name ``target`` already: a hard link, then the old name removed (same folder)."""
    os.link(source, target)
    os.unlink(source)


@contextlib.contextmanager
def atomic_file(
    path: Path, *, mode: int = 0o600, sync_directory: bool = True, replace: bool = True
) -> Iterator[BinaryIO]:
    """A binary handle whose bytes replace ``path`` when the block ends without an exception.

    ``mode`` is the file's permission bits, set before anything is written. An exception in the
    block (the caller's way to abandon the write) leaves ``path`` as it was. ``sync_directory``
    False: the caller fsyncs the folder once after several writes (``fsync_directory``).
    ``replace`` False: ``FileExistsError`` instead of replacing anything at ``path`` (``rename_new``).
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
        if replace:
            os.replace(temporary, path)
        else:
            rename_new(temporary, path)
        if sync_directory:
            fsync_directory(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write(
    path: Path, data: bytes, *, mode: int = 0o600, sync_directory: bool = True, replace: bool = True
) -> None:
    """Replace ``path`` with ``data``, durably and all at once (see ``atomic_file``)."""
    with atomic_file(path, mode=mode, sync_directory=sync_directory, replace=replace) as handle:
        handle.write(data)
