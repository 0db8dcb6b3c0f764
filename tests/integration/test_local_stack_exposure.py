"""What the local stack exposes to other users and processes of the machine (docs/SECURITY.md, "The
local stack"): every listener of `modelforge local up` is bound to 127.0.0.1, and its data dir and
admin token file are its owner's only (0700/0600). A data dir open to others is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.conftest import ADMIN_TOKEN
from tests.support.processes import descendants, local_up_command, run_to_exit, start_local_up

ENV = {"MODELFORGE_ADMIN_TOKEN": ""}  # the token comes from the file, generated on the first start
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc/net/tcp* write them


def _listening_addresses(pid: int) -> list[str]:
    """``address:port`` (hex, as /proc/net/tcp* write them) of every TCP socket that ``pid`` or a
    process descended from it listens on."""
    inodes = set()
    for member in {pid, *descendants(pid)}:
        try:
            fds = list(Path(f"/proc/{member}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_every_listener_is_loopback_and_the_data_dir_and_token_file_are_the_owners_only(tmp_path: Path) -> None:
    data_dir, token_file = tmp_path / "state", tmp_path / "secrets" / "admin-token"
    args = ("--emulator-port", "0", "--channel-port", "0", "--data-dir", str(data_dir))
    with start_local_up(tmp_path / "up.log", *args, "--admin-token-file", str(token_file), env=ENV) as running:
        listening = _listening_addresses(running.process.pid)
        # the API and the push channel (local up's process), the AWS emulator (its own process)
        assert len(listening) >= 3, listening
        assert {address.split(":")[0] for address in listening} <= LOOPBACK, listening
    assert running.returncode == 0
    assert _mode(token_file) == 0o600 and _mode(token_file.parent) == 0o700
    assert _mode(data_dir) == 0o700
    written = list(data_dir.rglob("*"))
    assert any(path.name == "snapshot.json" for path in written), written
    for path in written:
        assert _mode(path) == (0o700 if path.is_dir() else 0o600), (path, oct(_mode(path)))


def test_a_data_dir_open_to_other_users_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    data_dir = tmp_path / "shared"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    done = run_to_exit(
        local_up_command("--emulator-port", "0", "--channel-port", "0", "--data-dir", str(data_dir)),
        {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN},
    )
    assert done.returncode == 1, done.stderr
    assert f"run chmod 700 {data_dir}" in done.stderr and "mode 0755" in done.stderr
    assert "Traceback" not in done.stderr and ADMIN_TOKEN not in done.stderr + done.stdout
    assert list(data_dir.iterdir()) == [] and _mode(data_dir) == 0o755
