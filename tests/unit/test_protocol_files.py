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


@pytest.mark.parametrize("dangling", [False, True])
def test_create_new_refuses_a_planted_link_and_never_writes_through_it(tmp_path: Path, dangling: bool) -> None:
    elsewhere = tmp_path / "elsewhere"
    if not dangling:
        elsewhere.write_bytes(b"theirs")
    (tmp_path / "out.partial").symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        files.create_new(tmp_path / "out.partial")
    assert elsewhere.read_bytes() == b"theirs" if not dangling else not elsewhere.exists()


def test_create_new_makes_a_file_with_exactly_the_mode(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        with files.create_new(tmp_path / "new", mode=0o644) as handle:
            handle.write(b"bytes")
    finally:
        os.umask(previous)
    assert (tmp_path / "new").read_bytes() == b"bytes"
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o644
    with pytest.raises(FileExistsError):
        files.create_new(tmp_path / "new")


@pytest.mark.parametrize("dangling", [False, True])
def test_rename_new_and_atomic_write_without_replace_refuse_any_name_taken(tmp_path: Path, dangling: bool) -> None:
    elsewhere = tmp_path / "elsewhere"
    if not dangling:
        elsewhere.write_bytes(b"theirs")
    target = tmp_path / "SHA256SUMS"
    target.symlink_to(elsewhere)
    (tmp_path / "source").write_bytes(b"ours")
    with pytest.raises(FileExistsError):
        files.rename_new(tmp_path / "source", target)
    with pytest.raises(FileExistsError):
        files.atomic_write(target, b"ours", replace=False)
    assert target.is_symlink() and (tmp_path / "source").read_bytes() == b"ours"
    assert elsewhere.read_bytes() == b"theirs" if not dangling else not elsewhere.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["SHA256SUMS", "source", *([] if dangling else ["elsewhere"])]
    )
    files.rename_new(tmp_path / "source", tmp_path / "moved")
    assert (tmp_path / "moved").read_bytes() == b"ours" and not (tmp_path / "source").exists()
