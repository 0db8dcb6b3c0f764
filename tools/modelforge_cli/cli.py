"""`modelforge`: run the control plane locally, operate it through the admin API (enrollments, nodes,
work), and rebuild state from the state log."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import admin_commands, local_up, release_cli
from . import replay as replay_cli

EXIT_OK, EXIT_ERROR, EXIT_CONFIG = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelforge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="run the control plane on this machine")
    local_commands = local.add_subparsers(dest="local_command", required=True)
    up = local_commands.add_parser("up", help="serve the control plane on a local AWS emulator until Ctrl-C")
    local_up.add_arguments(up)

    log = commands.add_parser("log", help="the S3 state log")
    log_commands = log.add_subparsers(dest="log_command", required=True)
    replay = log_commands.add_parser("replay", help="rebuild empty tables from the state log")
    replay_cli.add_arguments(replay)
    # the admin API commands (enrollments, nodes, work): admin_commands.py and its modules
    admin_commands.register(commands)
    # the release bundle (manifest, verify, check-container): release_cli.py and its modules
    release_cli.register(commands)

    token = commands.add_parser("admin-token", help="admin token helpers")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    token_commands.add_parser("new", help="print a new random admin token (stdout) and its SHA-256 (stderr)")

    infra = commands.add_parser("infra", help="deployment artefacts")
    infra_commands = infra.add_subparsers(dest="infra_command", required=True)
    package = infra_commands.add_parser("package", help="build deployment.zip and the CloudFormation template")
    package.add_argument("out_dir", type=Path, help="folder to write deployment.zip and sam.json into")
    package.add_argument("--stage", default="dev", help="the Chalice stage to package (default dev)")
    return parser


def run_infra_package(args: argparse.Namespace) -> int:
    import subprocess

    from .infra import package

    try:
        template = package(args.out_dir, args.stage)
    except subprocess.CalledProcessError as error:
        print(f"modelforge: chalice package failed with exit code {error.returncode}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote {template} and {template.parent / 'deployment.zip'}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "local":
        return local_up.run(args)
    if args.command == "infra":
        return run_infra_package(args)
    if args.command == "admin-token":
        from .admin_token import run_new

        return run_new()
    if args.command == "release":
        return release_cli.run(args)
    if args.command in admin_commands.COMMANDS:
        return admin_commands.run(args)
    return replay_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
