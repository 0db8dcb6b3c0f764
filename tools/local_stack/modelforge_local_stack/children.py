"""The child processes of `modelforge local up` (its runtime worker and its CPU agent): the folder
each works in, held by one local up at a time; a child left running there, found and named; and
each child started with its own settings only, dying with local up.

- **One local up per folder.** Each child's folder gets the lock file a data dir has
  (``persistence.DataDirLock``: ``flock``, our pid in it; not a data dir's rules), held while
  local up runs. A second
  local up on the folder is refused before it starts anything, naming the first one's pid.
- **Leftovers are named.** A start looks in ``/proc`` for a worker or agent process (its command
  line names the module) whose settings point into the folder: one left by a local up that was
  killed before children died with their parent, or started by hand. It refuses to share the
  folder with it, naming its pid and how to stop it.
- **Children die with local up** (``PR_SET_PDEATHSIG``, armed before the child runs: see
  ``modelforge_protocol.child_processes``); local up starts them from its main thread, which
  lives as long as it does. Each runs in its own process group, so a Ctrl-C reaches local up
  alone, which stops them in turn.
- **Only their own environment.** A child gets ``PROCESS_ENVIRONMENT``, its own component's
  ``MODELFORGE_*`` settings and what local up sets for it: never the admin token or anything else
  of local up's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelforge_protocol.child_processes import die_with_parent_before_exec, inherited

from .persistence import DataDirInUse, DataDirLock

_PROC = Path("/proc")


@dataclass(frozen=True)
class Kind:
    """What a child is: its name in messages, the module it runs, the prefix of its settings."""

    what: str
    module: str
    prefix: str


WORKER = Kind("runtime worker", "modelforge_runtime_worker.main", "MODELFORGE_WORKER_")
AGENT = Kind("node agent", "modelforge_node_agent.main", "MODELFORGE_AGENT_")
#: the embedded AWS emulator in a process of its own (``emulator_host.OwnProcess``; no settings)
EMULATOR = Kind("AWS emulator", "modelforge_local_stack.emulator_host", "MODELFORGE_EMULATOR_")


class FolderInUse(Exception):
    """A child's folder is used by another local up or by a process left running; the message
    names its pid and what to do."""


def environment(kind: Kind, settings: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: what every process keeps, its component's own settings
    from ``environ`` (this process's), then ``settings`` (what local up sets for it)."""
    own = os.environ if environ is None else environ
    return {**inherited(own, prefixes=(kind.prefix,)), **settings}


def start(
    kind: Kind, env: Mapping[str, str], *, args: Sequence[str] = (), pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """Run ``python -m <module> [args]`` with exactly ``env`` (and ``pass_fds`` kept open in it),
    dying with this process. Call it from the main thread: the kernel's signal follows the thread
    that forked the child."""
    return subprocess.Popen(
        [sys.executable, "-m", kind.module, *args],
        env=dict(env),
        pass_fds=tuple(pass_fds),
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent_before_exec(),  # one system call in the child, looked up before the fork
        # its own process group: a Ctrl-C on the terminal reaches local up alone, which stops each
        # child in turn (SIGTERM), rather than every process of the tree at once (a slot process of
        # the worker printed a KeyboardInterrupt traceback)
        process_group=0,
    )


def how_it_ended(returncode: int) -> str:
    """A child's exit status in words: ``was killed by signal 9``, ``exited with status 1``."""
    return f"was killed by signal {-returncode}" if returncode < 0 else f"exited with status {returncode}"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, or another user's
        return None


def _points_into(value: str, folder: Path, cwd: Path | None) -> bool:
    path = Path(value.removeprefix("unix://"))
    if not path.is_absolute():
        if cwd is None:
            return False
        path = cwd / path
    path = Path(os.path.normpath(path))
    return path == folder or folder in path.parents


def _settings(process: Path) -> Iterator[str]:
    """The values of the ``MODELFORGE_*`` variables a process (its ``/proc`` entry) started with."""
    environ = _read(process / "environ") or b""
    for entry in environ.split(b"\0"):
        name, _, value = entry.decode(errors="replace").partition("=")
        if name.startswith("MODELFORGE_") and value:
            yield value


def running_in(folder: Path, kind: Kind, proc: Path = _PROC) -> list[int]:
    """The pids of ``kind`` processes (other than this one) whose settings point into ``folder``."""
    folder = Path(os.path.normpath(folder.resolve()))
    module = kind.module.encode()
    found = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        command = _read(entry / "cmdline")
        if not command or module not in command.split(b"\0"):
            continue
        try:
            cwd: Path | None = Path(os.readlink(entry / "cwd"))
        except OSError:
            cwd = None
        if any(_points_into(value, folder, cwd) for value in _settings(entry)):
            found.append(int(entry.name))
    return sorted(found)


def leftovers_message(folder: Path, kind: Kind, pids: list[int]) -> str:
    listed = ", ".join(str(pid) for pid in pids)
    return (
        f"a {kind.what} not started by this local up still runs in {folder} (pid {listed}), left by one that was "
        f"killed or started by hand; stop it with:  kill {' '.join(str(pid) for pid in pids)}  and start again "
        "(or give this local up its own folders: ./scripts/dev-up --data-dir D)"
    )


class ChildFolder:
    """The folder of one child, held by this local up from ``claim`` to ``release``."""

    def __init__(self, folder: Path, kind: Kind) -> None:
        self.folder, self.kind = folder, kind
        self._lock = DataDirLock(folder)

    def claim(self) -> None:
        """Create the folder (0700) and lock it; ``FolderInUse`` when another local up holds it or
        a process left running uses it (then nothing is held)."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the lock of a data dir, without a data dir's rules (its mode): the folder is the child's
        os.close(os.open(self._lock.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
        try:
            self._lock.acquire_existing()
        except DataDirInUse as error:
            who = f"pid {error.pid}" if error.pid else "a process that has not written its pid yet"
            raise FolderInUse(
                f"the {self.kind.what}'s folder {self.folder} is in use by another modelforge local up ({who}; "
                f"lock file {error.lock_path}): stop that one first, or give this one its own folders "
                "(./scripts/dev-up --data-dir D)"
            ) from None
        pids = running_in(self.folder, self.kind)
        if pids:
            self.release()
            raise FolderInUse(leftovers_message(self.folder, self.kind, pids))
        self._lock.describe()

    def release(self) -> None:
        self._lock.release()
