from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from modelforge_protocol import files


def test_atomic_write_replaces_the_file_with_the_mode_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    files.atomic_write(target, b"new", mode=0o640)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(path.name for path in tmp_path.iterdir()) == ["state.json"]


def test_atomic_write_default_mode_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        files.atomic_write(tmp_path / "secret", b"x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600


def test_atomic_file_exception_in_block_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), files.atomic_file(target) as handle:
        handle.write(b"half")
        raise RuntimeError("changed while copied")
    assert target.read_bytes() == b"old"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.onnx"]


def test_atomic_write_missing_folder_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        files.atomic_write(tmp_path / "missing" / "file", b"x")


def test_atomic_write_batch_without_directory_sync_writes_each_file(tmp_path: Path) -> None:
    for name in ("a", "b"):
        files.atomic_write(tmp_path / name, name.encode(), sync_directory=False)
    files.fsync_directory(tmp_path)
    assert [(path.name, path.read_bytes()) for path in sorted(tmp_path.iterdir())] == [("a", b"a"), ("b", b"b")]


def test_temporary_name_is_hidden_fresh_and_beside_the_target(tmp_path: Path) -> None:
    target = tmp_path / "file"
    first, second = files.temporary_name(target), files.temporary_name(target)
    assert first.parent == tmp_path and first.name.startswith(".file.") and first != second


def test_atomic_write_target_that_is_a_link_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    link = tmp_path / "state"
    link.symlink_to(outside)
    files.atomic_write(link, b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new" and outside.read_bytes() == b"keep"
