"""What every child process of the worker does first: die with its parent.

A slot process, and the image decoder a slot starts, must never outlive the process that started
it: a worker that is killed (SIGKILL, an out-of-memory kill) or a slot killed at its job's deadline
takes its children with it. On Linux the kernel sends the child SIGKILL when its parent thread
exits (``PR_SET_PDEATHSIG``); elsewhere the parent's own kill and timeout are the bound.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Arm SIGKILL on the parent's death; exit at once if the parent is already gone."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's timeout and kill still bound it
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9 (how a child that was killed ended); the number for one Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
