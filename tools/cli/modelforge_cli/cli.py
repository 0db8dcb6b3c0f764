"""`modelforge`: run the control plane locally, operate it through the admin API (enrollments, nodes,
work), and rebuild state from the state log."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Container, Sequence

from . import admin_commands, plugins, release_cli, tables

EXIT_OK, EXIT_ERROR, EXIT_CONFIG = 0, 1, 2
#: where the plugin commands go in the listing: these before the admin commands, the rest after
_LEADING = ("local", "log")


def build_parser(expand: Container[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. A plugin command (plugins.py) gets its own parser only where `expand`
    is None or names it, else just its help line: the parser of `local` imports the AWS emulator."""
    parser = argparse.ArgumentParser(prog="modelforge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    loaders = dict(plugins.installed())
    trailing = [name for name in [*plugins.LOCAL_STACK_COMMANDS, *loaders] if name not in _LEADING]
    for name in _LEADING:
        _add_plugin(commands, name, loaders, expand)
    # the admin API commands (enrollments, nodes, work): admin_commands.py and its modules
    admin_commands.register(commands)
    # the release bundle (manifest, verify, check-container): release_cli.py and its modules
    release_cli.register(commands)

    token = commands.add_parser("admin-token", help="admin token helpers")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    token_commands.add_parser("new", help="print a new random admin token (stdout) and its SHA-256 (stderr)")
    for name in dict.fromkeys(trailing):
        _add_plugin(commands, name, loaders, expand)
    return parser


def _add_plugin(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    loaders: dict[str, plugins.Loader],
    expand: Container[str] | None,
) -> None:
    if name not in loaders:
        # not installed: the word still parses, whatever follows it, and answers how to install it
        missing = commands.add_parser(
            name, help=f"{plugins.LOCAL_STACK_COMMANDS[name]} (needs {plugins.LOCAL_STACK})", add_help=False
        )
        missing.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        missing.set_defaults(plugin_missing=name)
        return
    command = loaders[name]()
    sub = commands.add_parser(name, help=command.help)
    if expand is None or name in expand:
        command.add_arguments(sub)
    sub.set_defaults(plugin_run=command.run)


def _command_word(argv: Sequence[str]) -> str | None:
    """The top-level command `argv` names (`modelforge` itself has no option that takes a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    # a node controls much of what is printed: no control character of it reaches the terminal
    with tables.printable_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    word = _command_word(words)
    args = build_parser(expand=() if word is None else (word,)).parse_args(words)
    if getattr(args, "plugin_missing", None):
        print(plugins.not_installed_message(args.plugin_missing), file=sys.stderr)
        return EXIT_CONFIG
    if getattr(args, "plugin_run", None):
        return int(args.plugin_run(args))
    if args.command == "admin-token":
        from .admin_token import run_new

        return run_new()
    if args.command == "release":
        return release_cli.run(args)
    return admin_commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
