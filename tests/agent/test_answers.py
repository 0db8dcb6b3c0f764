"""Strict parsing and validation of control-plane answers (the unit under the HTTP tests)."""

from __future__ import annotations

import pytest
from modelforge_node_agent import answers
from modelforge_node_agent.answers import MalformedAnswer
from modelforge_protocol import schemas

NODE_ID = "node_" + "e" * 32


@pytest.mark.parametrize("raw", [b"NaN", b"[Infinity]", b"-Infinity", b"1e400", b'{"a": -1e999}'])
def test_answers_parse_non_finite_numbers_is_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedAnswer):
        answers.parse(raw)


def test_answers_parse_depth_counts_brackets_outside_strings_only() -> None:
    at_limit = b"[" * schemas.MAX_ANSWER_DEPTH + b"]" * schemas.MAX_ANSWER_DEPTH
    assert answers.parse(at_limit) is not None
    with pytest.raises(MalformedAnswer, match="nested deeper"):
        answers.parse(b"[" + at_limit + b"]")
    brackets_in_text = b'{"a": "' + b"[{" * 1000 + b'\\"[[["}'
    assert answers.parse(brackets_in_text)["a"].startswith("[{")


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"1" * 5000, b'{"a": 1} {"b": 2}'])
def test_answers_parse_what_is_not_json_is_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedAnswer, match="not JSON"):
        answers.parse(raw)


def test_answers_parse_over_the_cap_is_malformed() -> None:
    with pytest.raises(MalformedAnswer, match="larger than"):
        answers.parse(b" " * (schemas.MAX_ANSWER_BYTES + 1))


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b'{"node_id": "../x"}', "node_id fails pattern"),
        (b"{}", "answer fails required"),
        (
            b'{"node_id": "' + NODE_ID.encode() + b'", "heartbeat_interval_seconds": true}',
            "heartbeat_interval_seconds fails type",
        ),
    ],
)
def test_answers_validated_reason_names_the_field_never_the_value(answer: bytes, reason: str) -> None:
    with pytest.raises(MalformedAnswer) as malformed:
        answers.validated(answers.ENROLL_ANSWER, answer)
    assert malformed.value.reason == reason


def test_answers_schemas_accept_what_the_control_plane_answers_today() -> None:
    enrolled = (
        b'{"node_id": "' + NODE_ID.encode() + b'", "enrollment_id": "enr_1", "display_name": "x", '
        b'"production_eligible": false, "heartbeat_interval_seconds": 15, "replayed": false, '
        b'"auth": {"scheme": "Bearer"}}'
    )
    assert answers.validated(answers.ENROLL_ANSWER, enrolled)["node_id"] == NODE_ID
    beat = (
        b'{"node_id": "'
        + NODE_ID.encode()
        + b'", "status": "stale", "heartbeat_interval_seconds": 15, "work_waiting": true}'
    )
    assert answers.validated(answers.HEARTBEAT_ANSWER, beat)["status"] == "stale"
    refused = (
        b'{"error": {"code": "protocol_incompatible", "message": "no\\nway", "verdict": "TOO_NEW", '
        b'"next_step": "Upgrade the control plane; see docs/COMPATIBILITY.md.", "problems": ["x"]}}'
    )
    assert answers.validated(answers.ERROR_ANSWER, refused)["error"]["verdict"] == "TOO_NEW"
