"""The agent does not trust what the control plane answers: every answer is size-capped, parsed
strictly, validated against the shared answer schemas and read under one whole-request deadline.
A bad answer is a logged, backed-off transient failure: never a crash, a hot loop, a persisted
identity, or a log line quoting the body. Real sockets on 127.0.0.1; injected stop and clock."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import trustme
from modelforge_node_agent.control_plane import ENROLL, HEARTBEAT
from modelforge_node_agent.exit_codes import IDENTITY_REFUSED, PROTOCOL_INCOMPATIBLE, exit_for
from modelforge_node_agent.failures import Refused

from tests.agent.fake_control_plane import (
    ENROLLED,
    NODE_ID,
    ONLINE,
    FakeServer,
    RecordingStop,
    Reply,
    fake_server,
    json_reply,
    real_agent,
)
from tests.support.polling import wait_until

HUGE_BYTES = 300 * 1024 * 1024
#: What the kernel's socket buffers on loopback can hold beyond what the agent reads (generous).
SOCKET_BUFFERS = 32 * 1024 * 1024


def _heartbeat_answer(interval: str) -> bytes:
    return (
        b'{"node_id": "' + NODE_ID.encode() + b'", "status": "online", "work_waiting": false, '
        b'"heartbeat_interval_seconds": ' + interval.encode() + b"}"
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


# --- the interval the control plane asks for ---------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "waits"),
    [("1e308", [3600, 3600, 3600]), ("0", [1, 1, 1]), ("-1", [1, 1, 1]), ("0.001", [1, 1, 1]), ("7200", [3600] * 3)],
)
def test_agent_interval_out_of_range_is_clamped_to_1_to_3600_seconds(
    tmp_path: Path, interval: str, waits: list[float]
) -> None:
    stop = RecordingStop(limit=3)
    with fake_server({HEARTBEAT: json_reply(200, _heartbeat_answer(interval))}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, stop)
        agent.run()
    assert stop.waits == waits
    assert plane.paths() == [ENROLL, HEARTBEAT, HEARTBEAT, HEARTBEAT]  # one request per wait: no hot loop


@pytest.mark.parametrize(
    "interval", ['"abc"', '"nan"', "NaN", "Infinity", "-Infinity", "1e400", "true", "null", '"15"']
)
def test_agent_interval_that_is_not_a_finite_number_is_an_invalid_answer_backed_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, interval: str
) -> None:
    stop = RecordingStop(limit=3)
    with fake_server({HEARTBEAT: json_reply(200, _heartbeat_answer(interval))}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, stop)
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()
    assert stop.waits == [1, 2, 4]  # the backoff, not a hot loop
    assert plane.paths() == [ENROLL, HEARTBEAT, HEARTBEAT, HEARTBEAT]
    assert _warnings(caplog)[0].startswith("InvalidAnswer (HTTP 200) on POST /api/v1/agent/heartbeat (backoff 1s…16s)")
    assert "abc" not in caplog.text and "nan" not in caplog.text  # the reason names rules, never values


# --- the enroll answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        {**ENROLLED, "node_id": "../../../etc/evil"},
        {**ENROLLED, "node_id": NODE_ID + "\n"},
        {**ENROLLED, "node_id": 7},
        {key: value for key, value in ENROLLED.items() if key != "node_id"},
        {**ENROLLED, "heartbeat_interval_seconds": "abc"},
        [ENROLLED],
        "enrolled",
    ],
    ids=["path-traversal", "trailing-newline", "number", "missing", "interval-text", "array", "string"],
)
def test_agent_malformed_enroll_answer_is_retried_and_never_persisted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, answer: object
) -> None:
    stop = RecordingStop(limit=2)
    with fake_server({ENROLL: json_reply(201, answer)}) as plane:
        agent, state = real_agent(tmp_path, plane.url, stop)
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()  # no crash: stopped while backing off
    identity = state.load()  # and the next start does not exit 4 either
    assert identity is not None and identity.node_id is None
    assert plane.paths() == [ENROLL, ENROLL] and stop.waits == [1, 2]
    assert _warnings(caplog)[0].startswith("InvalidAnswer (HTTP 201) on POST /api/v1/agent/enroll (backoff 1s…16s)")
    assert "evil" not in caplog.text and "abc" not in caplog.text


def test_agent_malformed_enroll_answer_then_a_good_one_enrolls(tmp_path: Path) -> None:
    evil = json_reply(201, {**ENROLLED, "node_id": "../../../etc/evil"})
    with fake_server({ENROLL: [evil, json_reply(201, ENROLLED)]}) as plane:
        agent, state = real_agent(tmp_path, plane.url, RecordingStop(limit=2))
        agent.run()
    identity = state.load()
    assert identity is not None and identity.node_id == NODE_ID
    assert plane.paths() == [ENROLL, ENROLL, HEARTBEAT]


def test_agent_answer_nested_too_deep_is_an_invalid_answer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    deep = b'{"node_id": "' + NODE_ID.encode() + b'", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with fake_server({ENROLL: json_reply(201, deep)}) as plane:
        agent, state = real_agent(tmp_path, plane.url, RecordingStop(limit=1))
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()
    assert "nested deeper than 32 levels" in caplog.text
    identity = state.load()
    assert identity is not None and identity.node_id is None


# --- error answers (4xx) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        {"error": {"code": 401}},
        {"error": {"code": "credential_invalid\nFAKE LOG LINE"}},
        {"error": "credential_invalid"},
        {"message": "Unauthorized"},
        {"error": {"code": "protocol_incompatible", "verdict": "TOO_OLD", "next_step": "x" * 5000}},
        {"error": {"code": "protocol_incompatible", "verdict": "TOO_OLD", "next_step": "upgrade\x1b[2J"}},
    ],
    ids=["code-number", "code-newline", "error-string", "no-error", "next-step-long", "next-step-control"],
)
def test_agent_malformed_error_answer_is_an_invalid_answer_not_a_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, answer: object
) -> None:
    stop = RecordingStop(limit=2)
    with fake_server({HEARTBEAT: json_reply(401, answer)}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, stop)
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()  # not an exit: the answer cannot be trusted to mean what it says
    assert stop.waits == [1, 2]
    assert _warnings(caplog)[0].startswith("InvalidAnswer (HTTP 401) on POST /api/v1/agent/heartbeat (backoff 1s…16s)")
    assert "FAKE LOG LINE" not in caplog.text and "xxxxx" not in caplog.text


@pytest.mark.parametrize(
    ("status", "error", "exit_code", "words"),
    [
        (
            401,
            {"code": "credential_invalid", "message": "no", "extra": [1, 2]},
            IDENTITY_REFUSED,
            "HTTP 401 credential_invalid",
        ),
        (
            400,
            {"code": "protocol_incompatible", "verdict": "TOO_OLD", "next_step": "Upgrade the node agent."},
            PROTOCOL_INCOMPATIBLE,
            "Upgrade the node agent.",
        ),
    ],
)
def test_agent_well_formed_error_answer_still_stops_with_its_exit_code(
    tmp_path: Path, status: int, error: dict[str, object], exit_code: int, words: str
) -> None:
    with fake_server({HEARTBEAT: json_reply(status, {"error": error})}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, RecordingStop(limit=3))
        with pytest.raises(Refused) as stopped:
            agent.run()
    stops = exit_for(stopped.value)
    assert stops.code == exit_code and words in stops.message


def test_agent_answer_with_extra_fields_is_accepted_and_the_connection_kept_alive(tmp_path: Path) -> None:
    extra = {**ONLINE, "future_field": {"nested": [1, 2, 3]}, "hint": "x" * 1000}
    with fake_server({HEARTBEAT: json_reply(200, extra)}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, RecordingStop(limit=3))
        agent.run()
    assert plane.paths() == [ENROLL, HEARTBEAT, HEARTBEAT, HEARTBEAT]
    assert len({request.client_port for request in plane.seen}) == 1  # one kept-alive connection


# --- size cap ---------------------------------------------------------------------------------


class HugeAnswer:
    """Streams 300 MB of JSON whitespace, with or without advertising it; counts what it sent."""

    def __init__(self, advertise: bool) -> None:
        self.advertise = advertise
        self.sent = 0
        self.done = threading.Event()

    def __call__(self, handler: BaseHTTPRequestHandler) -> None:
        chunk = b" " * (1024 * 1024)
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            if self.advertise:
                handler.send_header("Content-Length", str(HUGE_BYTES))
            handler.send_header("Connection", "close")
            handler.end_headers()
            for _ in range(HUGE_BYTES // len(chunk)):
                handler.wfile.write(chunk)
                self.sent += len(chunk)
        except OSError:
            pass  # the agent hung up: that is the point
        finally:
            handler.close_connection = True
            self.done.set()


@pytest.mark.parametrize("advertise", [True, False], ids=["content-length", "unannounced"])
def test_agent_huge_answer_is_refused_after_at_most_the_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, advertise: bool
) -> None:
    huge = HugeAnswer(advertise)
    with fake_server({HEARTBEAT: huge}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, RecordingStop(limit=1))
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()
        assert huge.done.wait(20), "the fake kept sending: the agent did not hang up"
    assert huge.sent < SOCKET_BUFFERS, f"the agent let the server send {huge.sent} bytes"
    assert _warnings(caplog) == [
        "InvalidAnswer (HTTP 200) on POST /api/v1/agent/heartbeat (backoff 1s…16s): answer larger than 262144 bytes"
    ]


def test_agent_compressed_answer_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gzip_reply = json_reply(200, b"\x1f\x8b\x08\x00" + b"\x00" * 16, {"Content-Encoding": "gzip"})
    with fake_server({HEARTBEAT: gzip_reply}) as plane:
        agent, _ = real_agent(tmp_path, plane.url, RecordingStop(limit=1))
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            agent.run()
    assert plane.seen[1].headers.get("Accept-Encoding") == "identity"
    assert (
        "InvalidAnswer (HTTP 200) on POST /api/v1/agent/heartbeat (backoff 1s…16s): answer is compressed" in caplog.text
    )


# --- the whole-request deadline ---------------------------------------------------------------


def _trickle(stopping: threading.Event, where: str) -> Reply:
    """One byte every 0.2 s: each read is quick, so per-read timeouts never fire."""
    body = b'{"node_id": "' + NODE_ID.encode() + b'", "status": "online"}'
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )

    def reply(handler: BaseHTTPRequestHandler) -> None:
        slow, fast = (head, b"") if where == "headers" else (body, head)
        handler.close_connection = True
        try:
            handler.wfile.write(fast)
            for position in range(len(slow)):
                if stopping.wait(0.2):
                    return
                handler.wfile.write(slow[position : position + 1])
            if where == "headers":
                handler.wfile.write(body)
        except OSError:
            return

    return reply


def _deadline_timers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "modelforge-request-deadline"]


@pytest.mark.parametrize("where", ["headers", "body"])
def test_agent_trickling_answer_ends_at_the_request_deadline_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    server = FakeServer()
    server.replies[HEARTBEAT] = _trickle(server.stopping, where)
    try:
        agent, _ = real_agent(
            tmp_path, server.url, RecordingStop(limit=1), MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS="1"
        )
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            started = time.monotonic()
            agent.run()
            elapsed = time.monotonic() - started
    finally:
        server.close()
    assert elapsed < 2.5, f"one heartbeat took {elapsed:.1f} s with a 1 s request deadline"
    assert _warnings(caplog) == ["DeadlineExceeded on POST /api/v1/agent/heartbeat (backoff 1s…16s)"]
    wait_until(lambda: not _deadline_timers(), 5, "every deadline timer thread to end with its request", interval=0.01)


def test_agent_trickling_answer_over_tls_ends_at_the_request_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Over TLS the socket object is wrapped (and detached): the deadline must still reach it."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = FakeServer(tls=server_context)
    server.replies[HEARTBEAT] = _trickle(server.stopping, "body")
    try:
        agent, _ = real_agent(
            tmp_path,
            server.url,
            RecordingStop(limit=1),
            MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS="1",
            MODELFORGE_AGENT_CA_CERT_PATH=str(ca_file),
        )
        with caplog.at_level(logging.WARNING, logger="modelforge"):
            started = time.monotonic()
            agent.run()
            elapsed = time.monotonic() - started
    finally:
        server.close()
    assert [request.path for request in server.seen] == [ENROLL, HEARTBEAT]  # enrolled over TLS first
    assert elapsed < 2.5, f"one heartbeat took {elapsed:.1f} s with a 1 s request deadline"
    assert _warnings(caplog) == ["DeadlineExceeded on POST /api/v1/agent/heartbeat (backoff 1s…16s)"]


def test_agent_requests_leave_no_deadline_threads_behind(tmp_path: Path) -> None:
    with fake_server() as plane:
        agent, _ = real_agent(tmp_path, plane.url, RecordingStop(limit=20))
        agent.run()
    assert len(plane.seen) == 21
    wait_until(lambda: not _deadline_timers(), 5, "every deadline timer thread to end with its request", interval=0.01)
