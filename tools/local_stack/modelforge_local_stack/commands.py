"""The local stack's commands for `modelforge`: ``local up``, ``log replay`` and ``infra package``,
named in the ``modelforge.commands`` entry-point group (tools/local_stack/pyproject.toml).

`modelforge` imports this module for every command, to list these: it imports argparse and the
plugin contract only. Each command's own modules (the emulator, chalice, boto3) load when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from modelforge_cli.plugins import LOCAL_STACK_COMMANDS, Command

EXIT_OK, EXIT_ERROR = 0, 1


def _add_local(parser: argparse.ArgumentParser) -> None:
    from . import local_up

    local_commands = parser.add_subparsers(dest="local_command", required=True)
    up = local_commands.add_parser("up", help="serve the control plane on a local AWS emulator until Ctrl-C")
    local_up.add_arguments(up)


def _run_local(args: argparse.Namespace) -> int:
    from . import local_up

    return local_up.run(args)


def _add_log(parser: argparse.ArgumentParser) -> None:
    from . import replay

    log_commands = parser.add_subparsers(dest="log_command", required=True)
    replay.add_arguments(log_commands.add_parser("replay", help="rebuild empty tables from the state log"))


def _run_log(args: argparse.Namespace) -> int:
    from . import replay

    return replay.run(args)


def _add_infra(parser: argparse.ArgumentParser) -> None:
    infra_commands = parser.add_subparsers(dest="infra_command", required=True)
    package = infra_commands.add_parser("package", help="build deployment.zip and the CloudFormation template")
    package.add_argument("out_dir", type=Path, help="folder to write deployment.zip and sam.json into")
    package.add_argument("--stage", default="dev", help="the Chalice stage to package (default dev)")


def _run_infra(args: argparse.Namespace) -> int:
    import subprocess

    from .infra import package

    try:
        packaged = package(args.out_dir, args.stage)
    except subprocess.CalledProcessError as error:
        print(f"modelforge: chalice package failed with exit code {error.returncode}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote {packaged.template} and {packaged.bundle}")
    if packaged.bytecode.skipped:
        print(f"modelforge: no bytecode in the bundle ({packaged.bytecode.skipped}): a cold start compiles the "
              "sources; package with the functions' Python for a faster one", file=sys.stderr)  # fmt: skip
    else:
        print(f"added compiled bytecode for {packaged.bytecode.compiled} modules (no compiling at cold start)")
    return EXIT_OK


LOCAL = Command(help=LOCAL_STACK_COMMANDS["local"], add_arguments=_add_local, run=_run_local)
LOG = Command(help=LOCAL_STACK_COMMANDS["log"], add_arguments=_add_log, run=_run_log)
INFRA = Command(help=LOCAL_STACK_COMMANDS["infra"], add_arguments=_add_infra, run=_run_infra)
