"""How `local up` explains an exit of its CPU agent (``dev_agent.explain_exit``): every documented
exit status has a meaning and a next step, and an identity refused for belonging elsewhere gets
the address it belongs to and the one command that enrolls the agent again."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from modelforge_local_stack.dev_agent import AGENT_EXITS, explain_exit
from modelforge_node_agent import exit_codes

from tests.support.processes import wait_until_exec

API = "http://127.0.0.1:8001"


@pytest.mark.parametrize(
    "code",
    [
        exit_codes.OK,
        exit_codes.UNEXPECTED,
        exit_codes.CONFIGURATION_INVALID,
        exit_codes.PREFLIGHT_FAILED,
        exit_codes.PROTOCOL_INCOMPATIBLE,
    ],
)
def test_each_exit_status_says_its_meaning_and_the_next_step(tmp_path: Path, code: int) -> None:
    explained = explain_exit(code, tmp_path, API, None)
    meaning, next_step = AGENT_EXITS[code]
    assert explained.lines == [f"the CPU node agent exited with status {code}: {meaning}.", f"next: {next_step}"]
    assert explained.identity_to_move is None


def test_every_exit_code_of_the_agent_is_explained() -> None:
    documented = {value for name, value in vars(exit_codes).items() if name.isupper() and isinstance(value, int)}
    assert documented == set(AGENT_EXITS)


def test_a_signal_is_named(tmp_path: Path) -> None:
    assert explain_exit(-9, tmp_path, API, None).lines == [
        "the CPU node agent was killed by signal 9; restart local up to run it again"
    ]


def test_an_identity_of_another_control_plane_names_its_port_and_the_command_that_enrolls_again(tmp_path: Path) -> None:
    state = tmp_path / "agent state"  # a space: the command must still be one that runs
    state.mkdir()
    (state / "identity.json").write_text(
        json.dumps({"control_plane_url": "http://127.0.0.1:8000", "node_id": "node_" + "a" * 32})
    )
    explained = explain_exit(exit_codes.IDENTITY_REFUSED, state, API, None)
    text = "\n".join(explained.lines)
    assert "belongs to the control plane at http://127.0.0.1:8000, not to this one (http://127.0.0.1:8001)" in text
    assert "(--port 8000)" in text and explained.identity_to_move == state / "identity.json"
    (command,) = [line.split("run:  ", 1)[1] for line in explained.lines if "run:  " in line]
    assert shlex.split(command)[0] == "mv"
    subprocess.run(command, shell=True, check=True)
    assert not (state / "identity.json").exists() and (state / "identity.json.old").is_file()


def test_the_move_is_never_offered_while_another_agent_process_runs_on_the_state_folder(tmp_path: Path) -> None:
    """Moving the identity would take it from the node of that agent (another stack's, or one left
    running): its pid is named instead."""
    state = tmp_path / "agent-state"
    state.mkdir()
    (state / "identity.json").write_text(
        json.dumps({"control_plane_url": "http://127.0.0.1:8000", "node_id": "node_" + "a" * 32})
    )
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "modelforge_node_agent.main"],
        env={"MODELFORGE_AGENT_STATE_VOLUME": str(state)},
    )
    try:
        wait_until_exec(other.pid)
        explained = explain_exit(exit_codes.IDENTITY_REFUSED, state, API, None)
    finally:
        other.kill()
        other.wait()
    text = "\n".join(explained.lines)
    assert explained.identity_to_move is None and "mv " not in text
    assert f"(pid {other.pid})" in text and f"kill {other.pid}" in text
