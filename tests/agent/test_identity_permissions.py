"""The identity file and the state volume are checked as ssh checks its keys: open to group or
others, or a symbolic link, is refused (exit 4) with what to do; a loose real directory is
tightened to 0700 with a warning naming its old mode; a link's target is never chmod-ed."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from modelforge_node_agent.exit_codes import IDENTITY_REFUSED, exit_for
from modelforge_node_agent.failures import IdentityRefused
from modelforge_node_agent.identity import Identity, StateVolume, new_identity

URL = "https://cp.internal"
NODE_ID = "node_" + "d" * 32


def _enrolled_volume(tmp_path: Path) -> tuple[StateVolume, Identity]:
    volume = StateVolume(tmp_path / "state")
    volume.prepare()
    identity = volume.enrolled_as(new_identity(URL), NODE_ID)
    return volume, identity


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666], ids=oct)
def test_identity_file_open_to_group_or_others_is_refused_with_chmod_advice(tmp_path: Path, mode: int) -> None:
    volume, identity = _enrolled_volume(tmp_path)
    volume.identity_path.chmod(mode)  # as restored from a careless backup
    with pytest.raises(IdentityRefused) as refused:
        volume.load()
    message = refused.value.message
    assert exit_for(refused.value).code == IDENTITY_REFUSED
    assert f"identity file {volume.identity_path} has mode {mode:04o}" in message
    assert f"chmod 600 {volume.identity_path}" in message and "may have been exposed" in message
    assert identity.credential not in message and identity.idempotency_key not in message
    assert _mode(volume.identity_path) == mode  # refused, not silently "fixed"


def test_identity_file_with_mode_0600_or_0400_loads(tmp_path: Path) -> None:
    volume, identity = _enrolled_volume(tmp_path)
    assert volume.load() == identity
    volume.identity_path.chmod(0o400)
    assert volume.load() == identity


def test_identity_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    volume, _ = _enrolled_volume(tmp_path)
    real = tmp_path / "elsewhere.json"
    volume.identity_path.rename(real)
    volume.identity_path.symlink_to(real)
    with pytest.raises(IdentityRefused) as refused:
        volume.load()
    assert exit_for(refused.value).code == IDENTITY_REFUSED
    assert f"identity file {volume.identity_path} is a symbolic link" in refused.value.message


def test_identity_file_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    volume = StateVolume(tmp_path / "state")
    volume.prepare()
    volume.identity_path.mkdir(mode=0o700)
    with pytest.raises(IdentityRefused) as refused:
        volume.load()
    assert "not a regular file" in refused.value.message


def test_state_volume_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "real-state"
    target.mkdir()
    target.chmod(0o755)
    link = tmp_path / "state"
    link.symlink_to(target)
    with pytest.raises(IdentityRefused) as refused:
        StateVolume(link).prepare()
    assert exit_for(refused.value).code == IDENTITY_REFUSED
    assert f"state volume {link} is a symbolic link" in refused.value.message
    assert "MODELFORGE_AGENT_STATE_VOLUME" in refused.value.message
    assert _mode(target) == 0o755  # never chmod a link's target
    assert list(target.iterdir()) == []


def test_state_volume_looser_than_0700_is_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loose = tmp_path / "state"
    loose.mkdir()
    loose.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="modelforge"):
        StateVolume(loose).prepare()
    assert _mode(loose) == 0o700
    fixed = [record for record in caplog.records if getattr(record, "event", "") == "state_volume_mode_fixed"]
    assert len(fixed) == 1 and fixed[0].old_mode == "0755"  # type: ignore[attr-defined]
    assert f"state volume {loose} had mode 0755" in fixed[0].getMessage()


def test_state_volume_already_0700_is_left_alone_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    private = tmp_path / "state"
    private.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING, logger="modelforge"):
        StateVolume(private).prepare()
    assert _mode(private) == 0o700 and not caplog.records


def test_identity_save_never_persists_a_malformed_node_id(tmp_path: Path) -> None:
    volume, identity = _enrolled_volume(tmp_path)
    before = volume.identity_path.read_bytes()
    for node_id in ("../../../etc/evil", NODE_ID + "\n", ""):
        with pytest.raises(ValueError, match="malformed node id"):
            volume.enrolled_as(identity, node_id)
    assert volume.identity_path.read_bytes() == before
    assert sorted(path.name for path in volume.path.iterdir()) == ["identity.json"]


def test_agent_start_with_a_loose_identity_file_exits_4_and_connects_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from modelforge_node_agent.config import load_config
    from modelforge_node_agent.main import run_agent

    from tests.agent.fake_control_plane import SilentListener

    listener = SilentListener()
    try:
        volume = StateVolume(tmp_path / "state")
        volume.prepare()
        identity = volume.enrolled_as(new_identity(listener.url), NODE_ID)
        volume.identity_path.chmod(0o644)
        config = load_config(
            {
                "MODELFORGE_AGENT_CONTROL_PLANE_URL": listener.url,
                "MODELFORGE_AGENT_ACCELERATOR_MODE": "cpu",
                "MODELFORGE_AGENT_STATE_VOLUME": str(volume.path),
            }
        )
        with caplog.at_level(logging.ERROR, logger="modelforge"):
            assert run_agent(config) == IDENTITY_REFUSED
        assert listener.connections_waiting() == 0
    finally:
        listener.close()
    assert f"chmod 600 {volume.identity_path}" in caplog.text and identity.credential not in caplog.text
