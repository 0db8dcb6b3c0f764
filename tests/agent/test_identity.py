from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from modelforge_node_agent.exit_codes import IDENTITY_REFUSED, exit_for
from modelforge_node_agent.failures import IdentityRefused
from modelforge_node_agent.identity import StateVolume, StateVolumeError, new_identity, root_filesystem_warning

URL = "https://cp.internal"


def test_identity_round_trips_with_private_modes(tmp_path: Path) -> None:
    volume = StateVolume(tmp_path / "state")
    volume.prepare()
    identity = new_identity(URL)
    volume.save(identity)
    enrolled = volume.enrolled_as(identity, "node_" + "a" * 32)
    assert volume.load() == enrolled
    assert stat.S_IMODE(os.stat(volume.path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(volume.identity_path).st_mode) == 0o600
    assert [p.name for p in volume.path.iterdir()] == ["identity.json"]  # no temp files left behind


def test_identity_missing_file_means_no_identity(tmp_path: Path) -> None:
    assert StateVolume(tmp_path).load() is None


@pytest.mark.parametrize(
    "content",
    [b"{", b"[]", b'{"format_version": 1}', b'{"format_version": 9, "control_plane_url": "x"}'],
)
def test_identity_corrupt_file_is_an_error_naming_the_file(tmp_path: Path, content: bytes) -> None:
    volume = StateVolume(tmp_path)
    volume.identity_path.write_bytes(content)
    volume.identity_path.chmod(0o600)  # private, so the refusal is about the content
    with pytest.raises(IdentityRefused) as error:
        volume.load()
    assert str(volume.identity_path) in error.value.message and exit_for(error.value).code == IDENTITY_REFUSED
    assert "corrupt" in error.value.message


def test_identity_with_a_malformed_credential_is_corrupt(tmp_path: Path) -> None:
    volume = StateVolume(tmp_path)
    data = {"format_version": 1, "control_plane_url": URL, "credential": "x", "idempotency_key": "y", "node_id": None}
    volume.identity_path.write_text(json.dumps(data))
    volume.identity_path.chmod(0o600)
    with pytest.raises(IdentityRefused) as error:
        volume.load()
    assert "corrupt" in error.value.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; covered by the read-only file test below")
def test_state_volume_unwritable_directory_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(StateVolumeError):
        StateVolume(locked).prepare()


def test_state_volume_that_is_a_file_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(StateVolumeError) as error:
        StateVolume(not_a_dir).prepare()
    assert str(not_a_dir) in error.value.message


def test_state_volume_on_an_overlay_root_is_warned_about(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l\n"
        "40 22 8:1 /data /mnt/user/appdata rw,relatime - ext4 /dev/sda1 rw\n"
    )
    warning = root_filesystem_warning(Path("/var/lib/modelforge"), mountinfo)
    assert warning and "/var/lib/modelforge" in warning and "overlay" in warning
    assert root_filesystem_warning(Path("/mnt/user/appdata/agent"), mountinfo) is None


def test_state_volume_on_a_plain_root_filesystem_is_fine(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n")
    assert root_filesystem_warning(Path("/var/lib/modelforge"), mountinfo) is None
