"""The local API server survives hostile clients: real sockets on 127.0.0.1, real TLS.

Deadline and connection-cap tests run their own ``ApiServer`` in this process (the session
stack's app, a 1 s connection timeout, a few connection slots); framing tests use the session
stack's server with its defaults; memory and logging are measured on a real
`modelforge local up` process whose stderr is kept apart from its stdout.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from modelforge_protocol.schemas import MAX_BODY_BYTES

from tests.conftest import ADMIN_TOKEN
from tests.support import raw_http
from tests.support.pki import write_server_pki
from tests.support.polling import wait_until
from tests.support.processes import RunningProcess, start_local_up
from tests.support.raw_http import closed_within, exchange, read_until_closed, split_answers

TIMEOUT = 1.0
#: the serve loop checks deadlines about twice a second; a loaded machine gets some slack
CLOSED_BY = TIMEOUT + 2.5
HEALTH = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HEALTH_CLOSE = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
SLOW_HEAD = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/api/v1/health", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def _error(answer: raw_http.Answer, status: int, code: str) -> None:
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == code and isinstance(error["message"], str) and error["message"]


class _Server:
    def __init__(self, app: Any, **options: Any) -> None:
        from modelforge_local_stack.http_server import ApiServer, ServerThread

        self.thread = ServerThread(ApiServer("127.0.0.1", 0, app, **options))
        self.thread.start()
        host, port = self.thread.server.server_address[:2]
        self.url = f"{'https' if options.get('tls') else 'http'}://{host}:{port}"


@pytest.fixture()
def small_server(stack: Any) -> Iterator[_Server]:
    server = _Server(stack.app_module.app, connection_timeout_seconds=TIMEOUT, max_connections=4)
    yield server
    server.thread.stop()


@pytest.fixture()
def tls_server(stack: Any, tmp_path: Path) -> Iterator[tuple[_Server, Path]]:
    from modelforge_local_stack.http_server import tls_context

    cert_file, key_file, ca_file = write_server_pki(tmp_path, "127.0.0.1")
    tls = tls_context(cert_file, key_file)
    server = _Server(stack.app_module.app, tls=tls, connection_timeout_seconds=TIMEOUT, max_connections=4)
    yield server, ca_file
    server.thread.stop()


@pytest.fixture(scope="module")
def split_local_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """`modelforge local up` with its defaults, stderr in a file of its own."""
    with _split_local_up(tmp_path_factory.mktemp("hardened-local-up")) as running:
        yield running


def _split_local_up(folder: Path, *args: str) -> RunningProcess:
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN}
    return start_local_up(folder / "stdout.log", *args, env=env, stderr_path=folder / "stderr.log")


# --- deadlines ------------------------------------------------------------------------------


@pytest.mark.parametrize("after_a_request", [False, True], ids=["fresh", "keep_alive"])
def test_idle_connection_is_closed_within_the_timeout(small_server: _Server, after_a_request: bool) -> None:
    with raw_http.connect(small_server.url) as sock:
        if after_a_request:
            sock.sendall(HEALTH)
            sock.settimeout(10)
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200"), first
        elapsed = closed_within(sock, CLOSED_BY)
    assert elapsed is not None, f"an idle connection was still open after {CLOSED_BY}s"


def test_slow_sender_trickling_header_bytes_is_closed_within_the_timeout(small_server: _Server) -> None:
    """A byte every 0.1 s never trips a per-read timeout; the whole-request deadline does."""
    with raw_http.connect(small_server.url) as sock:
        sock.sendall(SLOW_HEAD)
        elapsed = closed_within(sock, CLOSED_BY, trickle=b"a")
    assert elapsed is not None, f"a trickling sender was still connected after {CLOSED_BY}s"


def test_slow_sender_trickling_a_body_is_closed_within_the_timeout(
    small_server: _Server,
) -> None:
    head = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += b"X-ModelForge-Admin-Token: " + ADMIN_TOKEN.encode() + b'\r\nContent-Length: 60000\r\n\r\n{"a":"'
    with raw_http.connect(small_server.url) as sock:
        sock.sendall(head)
        elapsed = closed_within(sock, CLOSED_BY, trickle=b"a")
    assert elapsed is not None, f"a trickling body was still being read after {CLOSED_BY}s"


def test_connection_slots_taken_by_slow_senders_refuse_newcomers_fast_and_recover_after_the_timeout(
    small_server: _Server,
) -> None:
    """Four slots: three stalled senders leave room for a normal request; a fourth fills the
    server, so a newcomer is answered 503 at once; after the timeout, service is back."""
    stalled = [raw_http.connect(small_server.url) for _ in range(3)]
    try:
        for sock in stalled:
            sock.sendall(SLOW_HEAD)
        assert requests.get(small_server.url + "/api/v1/health", timeout=10).status_code == 200
        server = small_server.thread.server
        # the health client has hung up; its slot is free once its handler has seen that
        wait_until(lambda: server.open_connections == 3, CLOSED_BY, "the health connection's slot to be released")
        stalled.append(raw_http.connect(small_server.url))
        stalled[-1].sendall(SLOW_HEAD)
        wait_until(lambda: server.open_connections == 4, CLOSED_BY, "the fourth stalled sender to take the last slot")
        started = time.monotonic()
        with raw_http.connect(small_server.url) as newcomer:  # answered before it sends anything
            answers = split_answers(read_until_closed(newcomer, within=TIMEOUT))
        # before any stalled sender's deadline could free a slot: refused, not queued behind them
        assert time.monotonic() - started < TIMEOUT
        assert len(answers) == 1, answers
        _error(answers[0], 503, "server_busy")
        assert answers[0].headers["connection"] == "close"
        wait_until(
            lambda: _healthy(small_server.url),
            CLOSED_BY,
            "service to recover after the stalled senders' deadline",
            interval=0.05,
        )
    finally:
        for sock in stalled:
            sock.close()


# --- request size and framing ---------------------------------------------------------------


def test_declared_body_over_the_api_limit_is_refused_413_before_the_body_is_sent(stack: Any) -> None:
    request = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    request += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1)
    answers = exchange(stack.api_url, request, within=5)  # no body follows: the old server waited for it
    assert len(answers) == 1
    _error(answers[0], 413, "payload_too_large")
    assert answers[0].headers["connection"] == "close"


def test_thirty_oversized_bodies_leave_the_server_process_memory_flat(split_local_up: RunningProcess) -> None:
    """Each client advertises and sends 10 MB; the server must refuse without buffering it."""
    advertised = 10 * 1024 * 1024
    head = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % advertised
    chunk = b" " * (1024 * 1024)

    def oversized() -> None:
        with raw_http.connect(split_local_up.api_url, timeout=10) as sock:
            try:
                sock.sendall(head)
                for _ in range(advertised // len(chunk)):
                    sock.sendall(chunk)
                read_until_closed(sock, within=10)
            except OSError:
                pass  # refused and closed mid-body: what a bounded server does

    for _ in range(3):  # warm up: threads, arenas and the app's first request
        oversized()
    before = raw_http.rss_bytes(split_local_up.process.pid)
    for _ in range(30):
        oversized()
    growth = raw_http.rss_bytes(split_local_up.process.pid) - before
    assert growth < 20 * 1024 * 1024, f"RSS grew by {growth / 2**20:.1f} MiB over 30 oversized requests"


@pytest.mark.parametrize(
    ("coding", "status", "code"),
    [
        ("chunked", 411, "length_required"),
        ("gzip, chunked", 411, "length_required"),
        ("gzip", 501, "not_implemented"),
        ("", 400, "invalid_transfer_encoding"),  # names no coding: malformed, not an unknown coding
        (" , ", 400, "invalid_transfer_encoding"),
    ],
)
def test_transfer_encoding_is_refused_and_the_body_is_never_parsed_as_a_request(
    stack: Any, coding: str, status: int, code: str
) -> None:
    smuggled = HEALTH
    request = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request += f"Transfer-Encoding: {coding}\r\n\r\n".encode()
    request += b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled)
    answers = exchange(stack.api_url, request)
    assert [answer.status for answer in answers] == [status], answers
    _error(answers[0], status, code)
    assert answers[0].headers["connection"] == "close"


def test_head_answer_has_headers_only(stack: Any) -> None:
    """The next answer on the connection must start right after the HEAD answer's headers."""
    with raw_http.connect(stack.api_url) as sock:
        sock.sendall(HEALTH.replace(b"GET", b"HEAD", 1) + HEALTH_CLOSE)
        raw = read_until_closed(sock)
    head_answer, separator, rest = raw.partition(b"\r\n\r\n")
    assert separator and head_answer.startswith(b"HTTP/1.1 "), raw[:300]
    assert rest.startswith(b"HTTP/1.1 200"), f"the HEAD answer carried a body: {rest[:200]!r}"
    head, get = split_answers(raw, head_only=(True,))
    assert head.body == b"" and get.status == 200 and get.json()


@pytest.mark.parametrize(
    "lengths",
    [
        pytest.param([b"\xb2"], id="superscript_two"),  # '²'.isdigit() is True; int('²') raises
        pytest.param([b"\xb9\xb2"], id="superscript_one_two"),
        pytest.param([b"+5"], id="sign"),
        pytest.param([b"0x10"], id="hex"),
        pytest.param([b"1_0"], id="underscore"),
        pytest.param([b"5, 5"], id="list"),
        pytest.param([b"1234567890"], id="ten_digits"),
        pytest.param([b"-1"], id="negative"),
        pytest.param([b"2", b"3"], id="two_different_headers"),
    ],
)
def test_invalid_content_length_is_refused_400(stack: Any, lengths: list[bytes]) -> None:
    request = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request += b"".join(b"Content-Length: %s\r\n" % length for length in lengths) + b"\r\n{}"
    answers = exchange(stack.api_url, request)
    assert len(answers) == 1, answers
    _error(answers[0], 400, "invalid_content_length")
    assert answers[0].headers["connection"] == "close"


def test_repeated_identical_content_length_is_accepted(stack: Any) -> None:
    body = json.dumps({"display_name": "twice", "expires_in_seconds": 900}).encode()
    request = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request += b"X-ModelForge-Admin-Token: " + ADMIN_TOKEN.encode() + b"\r\nConnection: close\r\n"
    request += b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s" % (len(body), len(body), body)
    answers = exchange(stack.api_url, request)
    assert [answer.status for answer in answers] == [201], answers


# --- logging --------------------------------------------------------------------------------


def test_client_resets_log_one_json_line_each_and_no_traceback(split_local_up: RunningProcess) -> None:
    resets = 5
    for _ in range(resets):
        sock = raw_http.connect(split_local_up.api_url)
        sock.sendall(HEALTH)  # one full exchange: the server's thread now waits for the next request
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        # an admin's request (a caller without the token is refused before its body is read): the
        # server is reading its body when the client resets
        head = b"POST /api/v1/admin/node-enrollments HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
        sock.sendall(head + b"X-ModelForge-Admin-Token: " + ADMIN_TOKEN.encode() + b"\r\n\r\n{")
        raw_http.reset(sock)
    wait_until(
        lambda: sum('"connection_error"' in line for line in split_local_up.stderr_lines()) >= resets,
        10,
        f"{resets} connection_error lines",
        interval=0.05,
        detail=lambda: "\n".join(split_local_up.stderr_lines()[-40:]),
    )
    lines = split_local_up.stderr_lines()
    assert not [line for line in lines if "Traceback" in line or line.startswith("  File ")], "\n".join(lines[-40:])
    parsed = [json.loads(line) for line in lines]  # every stderr line is one JSON object
    events = [entry for entry in parsed if entry.get("event") == "connection_error"]
    assert len(events) == resets, lines[-40:]
    for event in events:
        assert event["client"] == "127.0.0.1" and event["error"] == "ConnectionResetError"
        assert ADMIN_TOKEN not in json.dumps(event)


# --- TLS ------------------------------------------------------------------------------------


def test_tls_idle_connection_after_the_handshake_is_closed_within_the_timeout(
    tls_server: tuple[_Server, Path],
) -> None:
    server, ca_file = tls_server
    with (
        raw_http.connect(server.url) as raw,
        raw_http.tls_client(ca_file).wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        elapsed = closed_within(sock, CLOSED_BY)
    assert elapsed is not None, f"an idle TLS connection was still open after {CLOSED_BY}s"


@pytest.mark.parametrize("sent", [b"", b"\x16\x03\x01\x02\x00\x01"], ids=["nothing", "half_a_client_hello"])
def test_tls_client_that_never_finishes_the_handshake_is_closed_within_the_timeout(
    tls_server: tuple[_Server, Path], sent: bytes
) -> None:
    server, _ = tls_server
    with raw_http.connect(server.url) as sock:
        sock.sendall(sent)
        elapsed = closed_within(sock, CLOSED_BY)
    assert elapsed is not None, f"an unfinished TLS handshake was still open after {CLOSED_BY}s"


def test_tls_server_still_serves_while_a_handshake_is_stalled(tls_server: tuple[_Server, Path]) -> None:
    server, ca_file = tls_server
    with raw_http.connect(server.url):
        assert requests.get(server.url + "/api/v1/health", verify=str(ca_file), timeout=10).status_code == 200


# --- the command line -----------------------------------------------------------------------


def test_local_up_connection_timeout_and_max_connections_flags_reach_the_server(tmp_path: Path) -> None:
    # --verbose: an idle connection closed is a routine line, at debug without it
    with _split_local_up(tmp_path, "--connection-timeout", "1", "--max-connections", "1", "--verbose") as running:
        holder = raw_http.connect(running.api_url)
        with holder:
            holder.sendall(SLOW_HEAD)
            with raw_http.connect(running.api_url) as newcomer:
                answers = split_answers(read_until_closed(newcomer, within=5))
            assert [answer.status for answer in answers] == [503]
            assert closed_within(holder, CLOSED_BY) is not None
        wait_until(lambda: _healthy(running.api_url), CLOSED_BY, "service to recover", interval=0.05)
    assert running.returncode == 0
    events = [json.loads(line) for line in running.stderr_lines()]
    assert any(entry.get("event") == "connection_timeout" for entry in events)
    assert any(entry.get("event") == "server_busy" for entry in events)


@pytest.fixture()
def one_invocation_server(stack: Any) -> Iterator[_Server]:
    server = _Server(stack.app_module.app, connection_timeout_seconds=TIMEOUT, max_invocations=1)
    yield server
    server.thread.stop()


def test_a_request_waits_for_the_app_while_its_invocations_are_taken_and_is_answered_after(
    one_invocation_server: _Server,
) -> None:
    """One invocation at once: while the test holds it, a request is read but not run; it is
    answered once the place is free."""
    server = one_invocation_server.thread.server
    answers: list[int] = []
    with server.invocations.turn() as admitted:
        assert admitted
        client = threading.Thread(
            target=lambda: answers.append(
                requests.get(one_invocation_server.url + "/api/v1/health", timeout=10).status_code
            )
        )
        client.start()
        wait_until(lambda: server.invocations.waiting == 1, 10, "the request to wait for the app")
        assert answers == []
    client.join(10)
    assert answers == [200]
    assert server.invocations.running == 0 and server.invocations.waiting == 0


def test_a_request_that_waits_too_long_for_the_app_gets_503_server_busy_and_the_server_recovers(
    one_invocation_server: _Server,
) -> None:
    from modelforge_local_stack.invocation_gate import InvocationGate

    server = one_invocation_server.thread.server
    server.invocations = InvocationGate(1, max_wait_seconds=0.2)
    with server.invocations.turn():
        answer = requests.get(one_invocation_server.url + "/api/v1/health", timeout=10)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    assert answer.json()["error"]["code"] == "server_busy"
    assert "busy" in answer.json()["error"]["message"]
    assert requests.get(one_invocation_server.url + "/api/v1/health", timeout=10).status_code == 200
