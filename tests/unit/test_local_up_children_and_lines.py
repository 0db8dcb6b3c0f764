"""`local up`'s decisions about its children and its terminal, without processes: what a child's
environment holds, which routine lines an idle stack keeps at debug, and the line that says where
the console and the admin CLI are."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from modelforge_local_stack import children, terminal_lines
from modelforge_protocol.child_processes import inherited

from tests.support.processes import wait_until_exec

PARENT = {
    "PATH": "/usr/bin",
    "HOME": "/home/dev",
    "LANG": "C.UTF-8",
    "MODELFORGE_ADMIN_TOKEN": "secret-admin-token",
    "MODELFORGE_ADMIN_TOKEN_SHA256": "ab" * 32,
    "AWS_SECRET_ACCESS_KEY": "local",
    "GITHUB_TOKEN": "ghp_secret",
    "MODELFORGE_WORKER_SLOTS": "2",
    "MODELFORGE_AGENT_HOSTNAME": "mine",
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "90",
}


def test_a_childs_environment_is_the_process_basics_its_own_settings_and_what_local_up_sets() -> None:
    worker = children.environment(children.WORKER, {"MODELFORGE_WORKER_LISTEN": "unix:///w.sock"}, PARENT)
    assert worker == {
        "PATH": "/usr/bin",
        "HOME": "/home/dev",
        "LANG": "C.UTF-8",
        "MODELFORGE_WORKER_SLOTS": "2",
        "MODELFORGE_WORKER_LISTEN": "unix:///w.sock",
    }
    agent = children.environment(children.AGENT, {"MODELFORGE_AGENT_HOSTNAME": "set"}, PARENT)
    assert agent["MODELFORGE_AGENT_HOSTNAME"] == "set" and "MODELFORGE_WORKER_SLOTS" not in agent
    for env in (worker, agent):
        assert "secret-admin-token" not in env.values() and "GITHUB_TOKEN" not in env
        assert not [name for name in env if name.startswith(("MODELFORGE_ADMIN", "AWS_", "MODELFORGE_NODE_"))]


def test_inherited_keeps_only_named_variables() -> None:
    assert inherited(PARENT, names=("GITHUB_TOKEN",)) == {
        "PATH": "/usr/bin",
        "HOME": "/home/dev",
        "LANG": "C.UTF-8",
        "GITHUB_TOKEN": "ghp_secret",
    }


def test_running_in_finds_no_process_for_a_folder_nobody_uses(tmp_path: Path) -> None:
    assert children.running_in(tmp_path, children.WORKER) == []


@pytest.fixture
def api_log() -> Iterator[logging.Logger]:
    logger, root = logging.getLogger("modelforge.api"), logging.getLogger("modelforge")
    level = root.level
    yield logger
    terminal_lines.quiet_routine_lines(quiet=False)
    root.setLevel(level)


def _kept(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object) -> logging.LogRecord | None:
    record = logger.makeRecord(logger.name, level, __file__, 1, "line", (), None, extra={"event": event, **fields})
    return record if logger.filter(record) else None


def test_routine_lines_are_debug_unless_verbose_or_debug_is_on(api_log: logging.Logger) -> None:
    logging.getLogger("modelforge").setLevel(logging.INFO)
    terminal_lines.quiet_routine_lines()
    for event in ("http_request", "state_log_shipped"):
        assert _kept(api_log, event) is None
    assert _kept(logging.getLogger("modelforge.local.http"), "connection_timeout") is None
    assert _kept(api_log, "channel_connected") is not None  # anything else as it is
    # a sweep that changed nothing is routine; one that moved a node or a lease is not
    idle = {"transitioned": 0, "leases_expired": 0, "leases_released": 0, "nodes_removed": 0, "held": False}
    assert _kept(api_log, "sweep_finished", **idle) is None
    for change in ("transitioned", "leases_expired", "leases_released", "nodes_removed", "held"):
        assert _kept(api_log, "sweep_finished", **{**idle, change: 1}) is not None
    assert _kept(api_log, "http_request", logging.WARNING) is not None
    logging.getLogger("modelforge").setLevel(logging.DEBUG)  # MODELFORGE_LOG_LEVEL=DEBUG
    shown = _kept(api_log, "http_request")
    assert shown is not None and shown.levelname == "DEBUG"
    logging.getLogger("modelforge").setLevel(logging.INFO)
    terminal_lines.quiet_routine_lines(quiet=False)  # --verbose
    shown = _kept(api_log, "http_request")
    assert shown is not None and shown.levelname == "INFO"


def test_the_where_line_names_the_console_and_the_cli_in_the_venv_with_its_url_and_token_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("python", "modelforge", "activate"):
        (venv_bin / name).touch()
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("MODELFORGE_API_URL", raising=False)
    # local up puts the file's token into its own environment: the line still names the file
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", "from-the-file")
    line = terminal_lines.where_line("http://127.0.0.1:8001", tmp_path / ".modelforge" / "admin-token")
    assert line == (
        "console at http://127.0.0.1:8001/console/; admin CLI: MODELFORGE_API_URL=http://127.0.0.1:8001 "
        "MODELFORGE_ADMIN_TOKEN=$(cat .modelforge/admin-token) .venv/bin/modelforge nodes list "
        "(or source .venv/bin/activate, then modelforge)"
    )
    default = terminal_lines.where_line("http://127.0.0.1:8000", None)
    assert default == (
        "console at http://127.0.0.1:8000/console/; admin CLI: .venv/bin/modelforge nodes list "
        "(or source .venv/bin/activate, then modelforge)"
    )


def test_running_in_finds_an_agent_whose_state_folder_is_relative_to_its_working_directory(tmp_path: Path) -> None:
    (tmp_path / "agent-state").mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "modelforge_node_agent.main"],
        env={"MODELFORGE_AGENT_STATE_VOLUME": "agent-state"},
        cwd=tmp_path,
    )
    try:
        wait_until_exec(other.pid)
        assert children.running_in(tmp_path / "agent-state", children.AGENT) == [other.pid]
        assert children.running_in(tmp_path / "agent-state", children.WORKER) == []  # another module
        assert children.running_in(tmp_path / "elsewhere", children.AGENT) == []
    finally:
        other.kill()
        other.wait()
