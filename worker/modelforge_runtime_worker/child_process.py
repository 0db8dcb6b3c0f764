"""What every child process of the worker does first: die with its parent.

A slot process, and the image decoder a slot starts, must never outlive the process that started
it: a worker that is killed (SIGKILL, an out-of-memory kill) or a slot killed at its job's deadline
takes its children with it. On Linux the kernel sends the child SIGKILL when its parent thread
exits (``PR_SET_PDEATHSIG``); elsewhere the parent's own kill and timeout are the bound.
"""

from __future__ import annotations

import signal

# one helper for every process of the project that starts children (local up's too)
from modelforge_protocol.child_processes import die_with_parent

__all__ = ["die_with_parent", "signal_name"]


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9 (how a child that was killed ended); the number for one Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
