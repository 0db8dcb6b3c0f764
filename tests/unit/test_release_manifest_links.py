"""`modelforge release manifest` never writes through a link (issue 21, second security pass 7):
a file or link planted at one of its output names, the tarball's ``.partial`` included, before
the run or while it runs, is refused with exit 2 in one line and left as it is, and so is the file
it points to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from modelforge_cli import release_manifest
from modelforge_cli.cli import main
from modelforge_protocol.release_bundle import bundle_file_name, manifest_file_name

from tests.support.image_tarballs import release_images, write_docker_save

OUTPUT_NAMES = [bundle_file_name(), manifest_file_name(), "SHA256SUMS", bundle_file_name() + ".partial"]
THEIRS = b"a file the link points to"


def _plant(out: Path, name: str, victim: Path, dangling: bool) -> None:
    if not dangling:
        victim.write_bytes(THEIRS)
    out.mkdir(exist_ok=True)
    (out / name).symlink_to(victim)


def _assert_untouched(out: Path, name: str, victim: Path, dangling: bool, err: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelforge: ") and name in lines[0], err
    assert (out / name).is_symlink() and (out / name).readlink() == victim
    assert not victim.exists() if dangling else victim.read_bytes() == THEIRS
    leftovers = [path.name for path in out.iterdir() if path.name.endswith((".tmp", ".partial")) and path.name != name]
    assert leftovers == []


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("name", OUTPUT_NAMES)
def test_a_link_planted_before_the_run_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, dangling: bool
) -> None:
    source = write_docker_save(tmp_path / "images.tar", release_images())
    out, victim = tmp_path / "bundle", tmp_path / "victim"
    _plant(out, name, victim, dangling)
    assert main(["release", "manifest", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "exists (a link); remove it or choose another --out folder" in err
    _assert_untouched(out, name, victim, dangling, err)
    assert sorted(path.name for path in out.iterdir()) == [name]


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("name", OUTPUT_NAMES)
def test_a_link_planted_while_the_bundle_is_written_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, dangling: bool
) -> None:
    source = write_docker_save(tmp_path / "images.tar", release_images())
    out, victim = tmp_path / "bundle", tmp_path / "victim"
    select = release_manifest.select_release_images

    def select_then_plant(*args: Any, **kwargs: Any) -> Any:
        selected = select(*args, **kwargs)  # after the names were checked, before any is written
        _plant(out, name, victim, dangling)
        return selected

    monkeypatch.setattr(release_manifest, "select_release_images", select_then_plant)
    assert main(["release", "manifest", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "appeared while the bundle was written" in err and "nothing was written through it" in err
    _assert_untouched(out, name, victim, dangling, err)
