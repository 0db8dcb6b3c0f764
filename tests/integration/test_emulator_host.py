"""The embedded emulator in a process of its own (``emulator_host.OwnProcess``, as `local up` runs
it): it serves and counts like the one in the stack's process, raises the same errors, gets no
secret of its parent, keeps the data dir's snapshots, and dies with its parent; and `local up`
stops, saying why, when it is gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from modelforge_local_stack.emulator import PortInUse
from modelforge_local_stack.emulator_host import EmulatorProcessError, InProcess, Keep, OwnProcess, _portable
from modelforge_local_stack.persistence import SNAPSHOT_FILE

from tests.conftest import ADMIN_TOKEN
from tests.support.api import ControlPlane
from tests.support.polling import wait_until
from tests.support.processes import descendants, start_local_up

REGION = "us-east-1"


def _dynamodb(url: str) -> object:
    # the emulator accepts any credentials; these are not secrets
    return boto3.client(
        "dynamodb", endpoint_url=url, region_name=REGION, aws_access_key_id="local", aws_secret_access_key="local"
    )


def _create_and_put(url: str, table: str) -> None:
    client: object = _dynamodb(url)
    client.create_table(  # type: ignore[attr-defined]
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.put_item(TableName=table, Item={"pk": {"S": "one"}})  # type: ignore[attr-defined]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by a parent that is gone too) is not alive
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    return state != "Z"


@pytest.fixture()
def own() -> Iterator[OwnProcess]:
    running = OwnProcess()
    yield running
    running.stop()


def test_it_serves_and_counts_writes_and_operations_as_the_in_process_one_does(own: OwnProcess) -> None:
    own.start()
    local = InProcess()
    local.start()
    try:
        for host in (own, local):
            _create_and_put(host.endpoint_url, "counted")
        assert own.changes() == local.changes() == 2
        assert own.operations() == local.operations() == {"CreateTable": 1, "PutItem": 1}
    finally:
        assert local.stop() is None
    pid = own.pid
    assert pid is not None and own.stop() is None
    assert own.pid is None and not _alive(pid)


def test_a_port_in_use_is_the_same_error_naming_the_option() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = OwnProcess(port=port)
        with pytest.raises(PortInUse) as raised:
            taken.bind()
    assert raised.value.port == port and "--emulator-port PORT" in str(raised.value)
    assert taken.pid is None  # the child that could not bind has exited and been reaped


def test_it_gets_no_secret_of_its_parent(own: OwnProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-the-child")
    own.bind()
    environ = Path(f"/proc/{own.pid}/environ").read_bytes()
    assert ADMIN_TOKEN.encode() not in environ and b"not-for-the-child" not in environ
    assert b"PATH=" in environ


def test_it_keeps_the_data_dir_and_the_next_one_restores_it(tmp_path: Path) -> None:
    keep = Keep(tmp_path / "data", None, REGION, snapshot_interval_seconds=3600)
    keep.data_dir.mkdir()
    first = OwnProcess()
    assert first.start(keep) is None  # nothing saved yet
    _create_and_put(first.endpoint_url, "kept")
    assert first.stop() is None
    assert (keep.data_dir / SNAPSHOT_FILE).is_file()
    second = OwnProcess()
    try:
        restored = second.start(keep)
        assert restored is not None and (restored.tables, restored.items) == (1, 1)
        item = _dynamodb(second.endpoint_url).get_item(TableName="kept", Key={"pk": {"S": "one"}})  # type: ignore[attr-defined]
        assert item["Item"] == {"pk": {"S": "one"}}
    finally:
        second.stop()


def test_a_child_that_is_gone_is_named_and_its_last_snapshot_is_reported_lost(tmp_path: Path) -> None:
    keep = Keep(tmp_path, None, REGION, snapshot_interval_seconds=3600)
    running = OwnProcess()
    running.start(keep)
    pid = running.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: running.exit_code() is not None, 10, "the child to exit")
    assert running.exit_code() == -signal.SIGKILL
    with pytest.raises(EmulatorProcessError, match=rf"pid {pid}\) exited \(code -9\) when asked to count its writes"):
        running.changes()
    lost = running.stop()
    assert isinstance(lost, EmulatorProcessError) and f"pid {pid}" in str(lost)


def test_it_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from modelforge_local_stack.emulator_host import OwnProcess\n"
            "own = OwnProcess(); own.start(); print(own.pid, flush=True); time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    wait_until(lambda: not _alive(child), 10, "the emulator's process to die with its parent")


def test_an_error_that_does_not_pickle_crosses_as_a_runtime_error_naming_it() -> None:
    class Local(Exception):  # a class defined in a function does not pickle
        pass

    crossed = _portable(Local("no way across"))
    assert type(crossed) is RuntimeError and str(crossed) == "Local: no way across"
    port_error = PortInUse("127.0.0.1", 1234, "--emulator-port")
    assert _portable(port_error) is port_error


def test_local_up_stops_saying_why_when_its_emulator_is_killed(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    with start_local_up(tmp_path / "up.log", "--data-dir", str(data_dir), env=env) as up:
        assert ControlPlane(up.api_url, ADMIN_TOKEN).mint()
        (emulator,) = [
            pid
            for pid in descendants(up.process.pid)
            if b"modelforge_local_stack.emulator_host" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        started = time.monotonic()
        os.kill(emulator, signal.SIGKILL)
        assert up.wait_exit(30) == 1
        assert time.monotonic() - started < 10
    output = up.output()
    assert "the AWS emulator's process was killed by signal 9: the control plane cannot serve without it" in output
    assert f"the data dir keeps its last snapshot ({data_dir})" in output
    # the stream poller may log a failed poll meanwhile (one JSON line); nothing is left uncaught
    assert not any(line.startswith("Traceback") for line in output.splitlines()), output
