"""What `modelforge local up` shows on its terminal besides its own messages: where things are once
everything has started, and the control plane's routine lines kept out of an idle terminal.

- **Where things are** (``where_line``): the console's URL and the command line of the admin CLI,
  which lives in the virtual environment (``.venv/bin/modelforge``) and is not on ``PATH`` until
  it is activated, with the token's file and the API URL the CLI needs.
- **Routine lines at debug** (``quiet_routine_lines``): one access line per request, one line per
  state-log shipment and one per idle connection closed are what an idle stack prints every few
  seconds. They are logged at debug: shown with ``--verbose`` (as info) or with
  ``MODELFORGE_LOG_LEVEL=DEBUG``. Warnings, errors and every other line are unchanged.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from pathlib import Path

#: The ``event`` of each routine line (the access log, the state log's shipping, the server's idle
#: connections).
ROUTINE_EVENTS = frozenset({"http_request", "state_log_shipped", "connection_timeout"})
#: A sweep's line is routine when the sweep changed nothing (its report's counts of what it did,
#: functions/chalicelib/services/sweep.py SweepReport): an idle stack sweeps every minute.
SWEEP_EVENT = "sweep_finished"
SWEEP_CHANGES = ("transitioned", "leases_expired", "leases_released", "nodes_removed", "held")
#: The loggers that write them (a logger's filter sees only its own records).
ROUTINE_LOGGERS = ("modelforge.api", "modelforge.local.http")
#: The admin CLI's API URL when MODELFORGE_API_URL is unset (modelforge_cli.admin_api).
CLI_DEFAULT_API_URL = "http://127.0.0.1:8000"


class RoutineAtDebug(logging.Filter):
    """Turns an info-level routine line into a debug one, kept only when the ``modelforge``
    logger is enabled for debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _routine(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger("modelforge").isEnabledFor(logging.DEBUG)


def _routine(record: logging.LogRecord) -> bool:
    event = getattr(record, "event", None)
    if event == SWEEP_EVENT:
        return not any(getattr(record, name, 0) for name in SWEEP_CHANGES)
    return event in ROUTINE_EVENTS


_FILTER = RoutineAtDebug()


def quiet_routine_lines(quiet: bool = True) -> None:
    """Routine lines at debug (``quiet``), or as they are (``--verbose``)."""
    for name in ROUTINE_LOGGERS:
        logger = logging.getLogger(name)
        if quiet:
            logger.addFilter(_FILTER)
        else:
            logger.removeFilter(_FILTER)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def cli_command() -> tuple[str, str | None]:
    """How to run ``modelforge`` from here, and how to put it on PATH (None: it is already)."""
    beside = Path(sys.executable).parent / "modelforge"
    on_path = shutil.which("modelforge")
    if not beside.exists() or (on_path is not None and Path(on_path).resolve() == beside.resolve()):
        return "modelforge", None
    activate = beside.with_name("activate")
    hint = f"source {shlex.quote(_shown(activate))}" if activate.exists() else None
    return shlex.quote(_shown(beside)), hint


def where_line(api_url: str, admin_token_file: Path | None) -> str:
    """One line: the console's URL, and a command line that lists the nodes with the admin CLI
    (``admin_token_file``: where the token it needs is, None when the user's environment gave it)."""
    command, activate = cli_command()
    settings = []
    if api_url != os.environ.get("MODELFORGE_API_URL", CLI_DEFAULT_API_URL):
        settings.append(f"MODELFORGE_API_URL={api_url}")
    if admin_token_file is not None:
        settings.append(f"MODELFORGE_ADMIN_TOKEN=$(cat {shlex.quote(_shown(admin_token_file))})")
    cli = " ".join([*settings, command, "nodes", "list"])
    on_path = f" (or {activate}, then modelforge)" if activate else ""
    return f"console at {api_url}/console/; admin CLI: {cli}{on_path}"
