"""Commands other distributions add to `modelforge`, as plugins extend the ``aws`` command.

A distribution names each of its commands in the ``modelforge.commands`` entry-point group: the
entry point's name is the command word and its object is a `Command`. The module it names must be
cheap to import (argparse, nothing more): `modelforge --help` and every other command load it to
show the command's help line. Only when its own command runs does `add_arguments` build the rest
of its parser and `run` carry it out, importing whatever they need then.

The local stack (modelforge-local-stack) adds ``local``, ``log`` and ``infra`` this way. Without
it, those words answer with the one line that says how to install it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points

GROUP = "modelforge.commands"
LOCAL_STACK = "modelforge-local-stack"
#: the commands the local stack adds, each with its help line, for when it is not installed
LOCAL_STACK_COMMANDS = {
    "local": "run the control plane on this machine",
    "log": "the S3 state log",
    "infra": "deployment artefacts",
}


@dataclass(frozen=True)
class Command:
    """One top-level command of `modelforge` that a plugin adds."""

    help: str
    #: builds the command's parser below its word (its subcommands and options)
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: runs the parsed command; the exit status
    run: Callable[[argparse.Namespace], int]


Loader = Callable[[], Command]


def installed() -> Iterator[tuple[str, Loader]]:
    """Each plugin command's word and a loader for its `Command` (loading imports its module)."""
    for entry_point in entry_points(group=GROUP):
        yield entry_point.name, entry_point.load


def not_installed_message(command: str) -> str:
    return f"modelforge: `{command}` comes with the local stack, which is not installed: pip install {LOCAL_STACK}"
