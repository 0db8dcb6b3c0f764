"""The local API server checks the caller's secret from the headers before it reads a body.

Real sockets on 127.0.0.1: each request declares a large body and sends only its headers, so an
answer can only come from a server that did not wait for the body. Memory is measured on a real
`modelforge local up` process, as the security probe measured it (forty unauthenticated
connections each sending 5 MiB of ``POST /api/v1/admin/work``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelforge_protocol.work import MAX_SUBMIT_BODY_BYTES

from tests.conftest import ADMIN_TOKEN
from tests.support import raw_http
from tests.support.processes import RunningProcess, start_local_up

SUBMIT = b"POST /api/v1/admin/work HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
HEARTBEAT = b"POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
NODE_ID = b"X-ModelForge-Node-Id: node_" + b"0" * 32 + b"\r\n"


def _head(start: bytes, length: int, *headers: bytes) -> bytes:
    return start + b"".join(headers) + b"Content-Length: %d\r\n\r\n" % length


def _answer_without_the_body(url: str, head: bytes) -> tuple[raw_http.Answer, float]:
    """Send ``head`` only; the one answer and how long it took to come."""
    started = time.monotonic()
    with raw_http.connect(url) as sock:
        sock.sendall(head)
        answers = raw_http.split_answers(raw_http.read_until_closed(sock, within=5))
    assert len(answers) == 1, answers
    return answers[0], time.monotonic() - started


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        pytest.param((), 401, "admin_token_missing", id="no_token"),
        pytest.param((b"X-ModelForge-Admin-Token: " + b"x" * 43 + b"\r\n",), 403, "admin_token_invalid", id="wrong"),
        pytest.param((b"X-ModelForge-Admin-Token: \r\n",), 401, "admin_token_missing", id="empty"),
    ],
)
def test_an_admin_route_refuses_a_caller_without_the_admin_token_before_the_body_is_sent(
    stack: Any, headers: tuple[bytes, ...], status: int, code: str
) -> None:
    answer, elapsed = _answer_without_the_body(stack.api_url, _head(SUBMIT, MAX_SUBMIT_BODY_BYTES, *headers))
    assert (answer.status, answer.json()["error"]["code"]) == (status, code), answer
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["connection"] == "close"  # and read_until_closed saw it closed
    assert elapsed < 5


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        pytest.param((), "credential_missing", id="nothing"),
        pytest.param((NODE_ID,), "credential_missing", id="no_authorization"),
        pytest.param((NODE_ID, b"Authorization: Basic dXNlcjpwYXNz\r\n"), "credential_invalid", id="basic"),
        pytest.param((NODE_ID, b"Authorization: Bearer not-a-credential\r\n"), "credential_invalid", id="malformed"),
    ],
)
def test_a_node_route_refuses_a_caller_without_a_well_formed_credential_before_the_body_is_sent(
    stack: Any, headers: tuple[bytes, ...], code: str
) -> None:
    answer, _ = _answer_without_the_body(stack.api_url, _head(HEARTBEAT, 60000, *headers))
    assert (answer.status, answer.json()["error"]["code"]) == (401, code), answer
    assert answer.headers["connection"] == "close"


def test_expect_100_continue_is_answered_with_the_refusal_not_with_continue(stack: Any) -> None:
    answer, _ = _answer_without_the_body(
        stack.api_url, _head(SUBMIT, MAX_SUBMIT_BODY_BYTES, b"Expect: 100-continue\r\n")
    )
    assert (answer.status, answer.json()["error"]["code"]) == (401, "admin_token_missing"), answer


def test_the_admin_token_still_opens_the_route_and_its_body_is_read(stack: Any) -> None:
    body = b"{}"
    head = _head(SUBMIT, len(body), b"X-ModelForge-Admin-Token: " + ADMIN_TOKEN.encode() + b"\r\n")
    (answer,) = raw_http.exchange(stack.api_url, head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + body)
    # the app read the body and judged it: an invalid submission, not an authentication refusal
    assert answer.status == 400 and answer.json()["error"]["code"] == "invalid_request", answer


def test_a_public_route_is_not_refused_for_lacking_a_secret(stack: Any) -> None:
    """Enroll proves its secret in the body (the enrollment token): the app reads and judges it."""
    body = json.dumps({"enrollment_token": "mfe.x.y"}).encode()
    head = b"POST /api/v1/agent/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    (answer,) = raw_http.exchange(stack.api_url, _head(head + b"Connection: close\r\n", len(body)) + body)
    assert answer.status == 400, answer


@pytest.fixture(scope="module")
def split_local_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    folder: Path = tmp_path_factory.mktemp("auth-before-body")
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    with start_local_up(folder / "stdout.log", env=env, stderr_path=folder / "stderr.log") as running:
        yield running


def test_forty_unauthenticated_5_mib_submissions_at_once_leave_the_server_process_memory_flat(
    split_local_up: RunningProcess,
) -> None:
    """Before the check moved ahead of the body, these forty raised the server's RSS by ~185 MiB."""
    head = _head(SUBMIT, MAX_SUBMIT_BODY_BYTES)
    chunk = b" " * (1024 * 1024)
    answered: list[int] = []

    def unauthenticated() -> None:
        with raw_http.connect(split_local_up.api_url, timeout=20) as sock:
            try:
                sock.sendall(head)
                for _ in range(MAX_SUBMIT_BODY_BYTES // len(chunk)):
                    sock.sendall(chunk)
            except OSError:
                pass  # refused and closed mid-body: what a server that does not read it does
            try:
                raw = raw_http.read_until_closed(sock, within=20)
            except OSError:
                return
            answered.extend(answer.status for answer in raw_http.split_answers(raw))

    def forty() -> None:
        threads = [threading.Thread(target=unauthenticated) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    unauthenticated()  # warm up: threads, arenas and the app's first request
    before = raw_http.rss_bytes(split_local_up.process.pid)
    forty()
    growth = raw_http.rss_bytes(split_local_up.process.pid) - before
    assert growth < 30 * 1024 * 1024, f"RSS grew by {growth / 2**20:.1f} MiB over 40 unauthenticated 5 MiB bodies"
    assert answered and set(answered) == {401}, answered
    assert split_local_up.process.poll() is None
