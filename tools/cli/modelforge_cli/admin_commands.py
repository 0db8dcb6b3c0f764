"""The admin commands of `modelforge` (`enrollments`, `nodes`, `work`): their parsers, and one
runner that turns every failure into one line on stderr and a documented exit code."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from . import enrollments_cli, nodes_cli, work_cli
from .admin_api import EXIT_ERROR, AdminApi, CommandFailed

COMMANDS = ("enrollments", "nodes", "work")


def register(commands: Any) -> None:
    enrollments_cli.register(commands)
    nodes_cli.register(commands)
    work_cli.register(commands)


def run(args: argparse.Namespace) -> int:
    try:
        api = AdminApi.from_args(args)
        return int(args.admin_handler(api, args))
    except CommandFailed as failure:
        code = failure.exit_code
        if getattr(failure, "not_found", False):
            code = 1  # no such id: that is the answer
        print(f"modelforge: {failure.message}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("modelforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`modelforge nodes list | head`): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        print(f"modelforge: unexpected answer from the API ({type(error).__name__}: {error})", file=sys.stderr)
        return EXIT_ERROR
