"""`local up --data-dir`: state kept as a snapshot (not a request log), restored without a
traceback, the state log neither re-shipped nor lost across a restart, one process per data dir,
and nothing touched before the ports and the lock are known to be free."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from modelforge_local_stack import provision

from tests.conftest import ADMIN_TOKEN
from tests.support.api import AgentIdentity, ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import cli_command, free_port, local_up_command, run_to_exit, start_local_up
from tests.support.snapshots import TABLE_VARS, bucket_objects, scan_table, state_log_objects

ENV = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}

#: A first run whose stream poller ships only on demand: state of every kind (an enrolled node that
#: heartbeats, a pending token, queued work with its input object), every event shipped, then one
#: more transition whose event is still unshipped when the stack stops. Prints what the test needs.
_FIRST_RUN = """
import json, sys
from pathlib import Path
from modelforge_local_stack.local_stack import LocalOptions, LocalStack
from modelforge_cli.api_client import ControlPlane
from tests.support.snapshots import TABLE_VARS, bucket_objects, scan_table

stack = LocalStack(
    LocalOptions(port=0, data_dir=Path(sys.argv[1]), stream_interval_seconds=3600, sweep_interval_seconds=3600)
)
stack.start()
try:
    cp = ControlPlane(stack.api_url, sys.argv[2])
    node = cp.enrolled_node(display_name="survivor")
    assert cp.heartbeat(node).status_code == 200
    pending = cp.mint(display_name="still pending")
    work = cp.submit_work("diagnostic.echo", {"kept": True})
    assert work.status_code == 201, work.text
    stack.drain_state_log()
    cp.mint(display_name="unshipped")  # its event stays in the outbox: the poller is asleep
    names, url = stack.names, stack.aws_endpoint_url
    tables = {var: scan_table(url, names[var]) for var in TABLE_VARS}
    objects = {key: body.decode() for key, body in bucket_objects(url, names["MODELFORGE_STATE_LOG_BUCKET"]).items()}
finally:
    stack.stop()
print(json.dumps({"node": vars(node), "pending_token": pending["token"], "work_id": work.json()["work_id"],
                  "tables": tables, "objects": objects}))
"""


def _shipped_counts(output: str) -> tuple[int, int]:
    shipped = present = 0
    for line in output.splitlines():
        if '"state_log_shipped"' in line:
            entry = json.loads(line)
            shipped, present = shipped + entry["shipped"], present + entry["already_present"]
    return shipped, present


def _sorted(items: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(item, sort_keys=True) for item in items)


def test_a_restart_restores_the_snapshot_without_tracebacks_and_ships_each_event_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    first = run_to_exit([sys.executable, "-c", _FIRST_RUN, str(data_dir), ADMIN_TOKEN], ENV, timeout=120)
    assert first.returncode == 0, first.stderr
    before = json.loads(first.stdout.splitlines()[-1])
    assert sorted(path.name for path in data_dir.iterdir()) == ["local-up.lock", "objects", "snapshot.json"]
    assert (data_dir.stat().st_mode & 0o777) == 0o700
    assert ((data_dir / "snapshot.json").stat().st_mode & 0o777) == 0o600

    # --verbose: each state-log shipment is a routine line, at debug without it
    with start_local_up(tmp_path / "restart.log", "--data-dir", str(data_dir), "--verbose", env=ENV) as running:
        names = provision.resource_names("modelforge")
        # the tables are exactly what they were (the sweep has not run: its first run is a minute away)
        for var in TABLE_VARS:
            assert _sorted(scan_table(running.emulator_url, names[var])) == _sorted(before["tables"][var]), var
        # the event left unshipped is shipped now, and nothing shipped before is shipped again
        bucket = names["MODELFORGE_STATE_LOG_BUCKET"]
        outbox = {item["event_id"]["S"] for item in scan_table(running.emulator_url, names["MODELFORGE_OUTBOX_TABLE"])}
        wait_until(
            lambda: len(state_log_objects(running.emulator_url, bucket)) == len(outbox),
            30,
            "the unshipped event shipped",
        )
        after = {key: body.decode() for key, body in bucket_objects(running.emulator_url, bucket).items()}
        assert {key: after[key] for key in before["objects"]} == before["objects"]
        assert len(after) == len(before["objects"]) + 1
        assert _shipped_counts(running.output()) == (1, 0)
        # and the restored stack works as before: the node's credential, the pending token, the work
        cp = ControlPlane(running.api_url, ADMIN_TOKEN)
        node = AgentIdentity(**before["node"])
        assert cp.heartbeat(node).status_code == 200
        assert cp.enroll(before["pending_token"], AgentIdentity()).status_code == 201
        assert cp.work(before["work_id"])["status"] == "queued"
        # new events ship as ever
        wait_until(
            lambda: _shipped_counts(running.output())[0] >= 4, 30, "the new events shipped", detail=running.output
        )
        output = running.output()
        assert "restored 7 tables" in output and "1 state-log event still to ship" in output
    assert running.returncode == 0
    assert "Traceback" not in running.output()
    assert _shipped_counts(running.output())[1] == 0


#: moto's request recorder, as local up --data-dir used it before snapshots: every request, the
#: stream poller's included, appended to aws-requests.jsonl.
_OLD_RECORDING = """
import os, sys
os.environ["MOTO_ENABLE_RECORDING"] = "True"
os.environ["MOTO_RECORDER_FILEPATH"] = sys.argv[1] + "/aws-requests.jsonl"
from modelforge_local_stack.local_stack import LocalOptions, LocalStack
from modelforge_cli.api_client import ControlPlane
stack = LocalStack(LocalOptions(port=0, sweep_interval_seconds=3600))
stack.start()
try:
    cp = ControlPlane(stack.api_url, sys.argv[2])
    node = cp.enrolled_node(display_name="recorded")
    for _ in range(3):
        assert cp.heartbeat(node).status_code == 200
    stack.drain_state_log()
finally:
    stack.stop()
print(node.node_id)
"""


def test_a_data_dir_of_the_old_request_recording_is_migrated_once_without_tracebacks(tmp_path: Path) -> None:
    data_dir = tmp_path / "old"
    data_dir.mkdir(mode=0o700)
    recorded = run_to_exit([sys.executable, "-c", _OLD_RECORDING, str(data_dir), ADMIN_TOKEN], ENV, timeout=120)
    assert recorded.returncode == 0, recorded.stderr
    node_id = recorded.stdout.split()[-1]
    recording = data_dir / "aws-requests.jsonl"
    assert "DynamoDBStreams" in recording.read_text()  # the stream reads that used to fail on replay
    with start_local_up(tmp_path / "migrate.log", "--data-dir", str(data_dir), env=ENV) as running:
        assert ControlPlane(running.api_url, ADMIN_TOKEN).node(node_id)["display_name"] == "recorded"
    assert running.returncode == 0
    output = running.output()
    assert "migrated" in output and "Traceback" not in output
    assert not recording.exists() and (data_dir / "snapshot.json").is_file()


def test_a_second_local_up_on_the_same_data_dir_refuses_naming_the_lock_and_the_process(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    with start_local_up(tmp_path / "first.log", "--data-dir", str(data_dir), env=ENV) as first:
        ControlPlane(first.api_url, ADMIN_TOKEN).mint()
        files = {path: path.read_bytes() for path in data_dir.rglob("*") if path.is_file()}
        second = run_to_exit(local_up_command("--data-dir", str(data_dir)), ENV)
        assert second.returncode == 1
        lock = data_dir / "local-up.lock"
        assert f"pid {first.process.pid}" in second.stderr and str(lock) in second.stderr, second.stderr
        assert "--data-dir" in second.stderr and "Traceback" not in second.stderr
        assert "ready" not in second.stdout
        assert {path: path.read_bytes() for path in data_dir.rglob("*") if path.is_file()} == files
        assert json.loads(lock.read_text())["pid"] == first.process.pid
        assert ControlPlane(first.api_url, ADMIN_TOKEN).mint()  # the first one serves on
    assert first.returncode == 0
    assert lock.read_text() == ""  # a stopped stack's lock file names nobody


@pytest.mark.parametrize("option", ["--port", "--emulator-port"])
def test_a_port_in_use_is_named_with_its_option_before_anything_is_touched(tmp_path: Path, option: str) -> None:
    data_dir, token_file = tmp_path / "state", tmp_path / "admin-token"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = (
            ("--port", str(port)) if option == "--port" else ("--port", str(free_port()), "--emulator-port", str(port))
        )
        command = cli_command("local", "up", *ports, "--data-dir", str(data_dir), "--admin-token-file", str(token_file))
        done = run_to_exit(command, {"MODELFORGE_ADMIN_TOKEN": ""})
    assert done.returncode == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr and f"{option} PORT" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not data_dir.exists() and not token_file.exists()


@pytest.mark.slow
def test_the_restart_benchmark_runs_for_a_few_seconds_and_prints_its_figures(tmp_path: Path) -> None:
    from tests.conftest import repo_root

    done = run_to_exit(
        [sys.executable, str(repo_root() / "bench" / "local_restart.py"), "--minutes", "0.05"], timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = done.stdout[done.stdout.index("RESULT") :]
    for label in (
        "time to ready, first start",
        "time to ready, restart",
        "data dir at the end",
        "growth over the second half",
    ):
        assert label in figures, figures
    assert "tracebacks: first run 0, restart 0" in figures and "the node heartbeat again" in figures
    size = int(re.search(r"data dir after the stop: +([\d,]+) bytes", figures).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 0 < size < 200_000, figures


def test_a_snapshot_that_cannot_be_read_stops_the_start_in_one_line_and_is_left_as_it_was(tmp_path: Path) -> None:
    """The restore runs in the emulator's own process; its error is local up's one line, exit 1."""
    data_dir = tmp_path / "state"
    data_dir.mkdir(mode=0o700)
    snapshot = data_dir / "snapshot.json"
    snapshot.write_bytes(b"{not json")
    done = run_to_exit(local_up_command("--data-dir", str(data_dir)), ENV)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        f"modelforge: cannot read {snapshot} (JSONDecodeError): move the data dir aside to start afresh"
    ), done.stderr
    assert "ready" not in done.stdout
    assert snapshot.read_bytes() == b"{not json"
