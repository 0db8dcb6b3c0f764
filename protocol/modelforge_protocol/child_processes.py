"""What a process that starts children gives them: death with their parent, and an environment
built from names, never a copy of its own.

``die_with_parent`` arms ``PR_SET_PDEATHSIG``: on Linux the kernel sends the child SIGKILL when
its parent *thread* exits (the thread that forked it, not the whole process), so a parent that is
killed (SIGKILL, an out-of-memory kill) takes its children with it. A parent forks from a thread
that lives as long as it does (its main thread). Elsewhere it does nothing: the parent's own stop
is the bound. ``die_with_parent_before_exec`` is the same for ``subprocess.Popen(preexec_fn=...)``.

``inherited`` picks what a child keeps of its parent's environment: ``PROCESS_ENVIRONMENT`` (what
finds the interpreter, its packages and libraries, the locale, a home and a temporary folder) and
the names it is given. A secret of the parent (an admin token) reaches no child that is not given
its name.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable, Iterable, Mapping

_PR_SET_PDEATHSIG = 1

#: What every child keeps of its parent's environment (when set). Nothing else is passed on.
PROCESS_ENVIRONMENT = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "LD_LIBRARY_PATH",
)


def _prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):  # not Linux
        return None
    return prctl


def _arm(prctl: Callable[..., int] | None, parent: int) -> None:
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def die_with_parent(parent: int | None = None) -> None:
    """Arm SIGKILL on the parent's death; exit at once if the parent (``parent``, the current one
    when None) is already gone."""
    _arm(_prctl(), os.getppid() if parent is None else parent)


def die_with_parent_before_exec() -> Callable[[], None]:
    """For ``subprocess.Popen(preexec_fn=...)``, called in the parent (the thread that starts the
    child, which it must outlive): everything is looked up here, so the forked child only makes
    the one system call before it runs the program (which keeps the signal)."""
    prctl, parent = _prctl(), os.getpid()
    return lambda: _arm(prctl, parent)


def inherited(environ: Mapping[str, str], names: Iterable[str] = (), prefixes: Iterable[str] = ()) -> dict[str, str]:
    """``PROCESS_ENVIRONMENT``, ``names`` and the names starting with one of ``prefixes``, from
    ``environ`` where set: the start of a child's environment."""
    wanted = {*PROCESS_ENVIRONMENT, *names}
    starts = tuple(prefixes)
    return {name: value for name, value in environ.items() if name in wanted or (starts and name.startswith(starts))}
