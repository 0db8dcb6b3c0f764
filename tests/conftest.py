"""Shared fixtures: an in-process local stack, and real `modelforge local up` processes."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import ControlPlane
from tests.support.processes import RunningProcess, port_is_free, start_local_up

ADMIN_TOKEN = secrets.token_urlsafe(32)

#: Every entry point requires both liveness thresholds; tests use the documented defaults unless
#: a test sets its own (subprocesses inherit these).
os.environ.setdefault("MODELFORGE_NODE_STALE_AFTER_SECONDS", "60")
os.environ.setdefault("MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", "300")


def external_aws_endpoint() -> str | None:
    """``MODELFORGE_TEST_AWS_ENDPOINT_URL``: run the suite's control planes (the in-process stack and
    the `modelforge local up` process) against this AWS endpoint instead of the embedded emulator,
    e.g. LocalStack started with localstack/docker-compose.yml. Tests that count AWS calls skip."""
    return os.environ.get("MODELFORGE_TEST_AWS_ENDPOINT_URL") or None


@pytest.fixture(scope="session")
def admin_token() -> str:
    return ADMIN_TOKEN


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:  # noqa: F821
    """The control plane in this process (its emulator in a process of its own): same code as
    `modelforge local up`, with its emulator's request counters and the state-log poller within
    reach of the tests."""
    from modelforge_local_stack.local_stack import LocalOptions, LocalStack

    os.environ["MODELFORGE_ADMIN_TOKEN"] = ADMIN_TOKEN
    external = external_aws_endpoint()
    local = LocalStack(
        LocalOptions(
            port=0,
            sweep_interval_seconds=3600,
            stream_interval_seconds=0.2,
            aws_endpoint_url=external,
            emulator_process=True,  # as `local up` runs it: the tests, the API and moto use both cores
            # on a shared endpoint, tables of this session's own (the local_up process uses the
            # init hook's modelforge-* tables): neither sweeps nor lists the other's nodes
            resource_prefix=f"mftest-{secrets.token_hex(4)}" if external else "modelforge",
        )
    )
    local.start()
    yield local
    local.stop()


@pytest.fixture()
def counted_stack(stack):  # type: ignore[no-untyped-def]
    """The stack, when its AWS calls can be counted (the embedded emulator counts them)."""
    if stack.emulator is None:
        pytest.skip("AWS calls are counted by the embedded emulator only")
    return stack


@pytest.fixture()
def cp(stack) -> ControlPlane:  # type: ignore[no-untyped-def]
    return ControlPlane(stack.api_url, ADMIN_TOKEN)


@pytest.fixture(scope="session")
def local_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A real `modelforge local up` process, on the documented port 8000 when it is free."""
    log = tmp_path_factory.mktemp("local-up") / "local-up.log"
    # one of pytest-xdist's workers at most may take the documented port (they start together)
    first_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"
    port = 8000 if first_worker and port_is_free(8000) else None
    external = external_aws_endpoint()
    args = ("--aws-endpoint-url", external) if external else ()
    with start_local_up(log, *args, port=port, env={"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}) as running:
        yield running


@pytest.fixture()
def remote(local_up: RunningProcess) -> ControlPlane:
    return ControlPlane(local_up.api_url, ADMIN_TOKEN)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]
