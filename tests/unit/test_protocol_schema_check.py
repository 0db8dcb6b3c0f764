from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from modelforge_protocol import schemas, work
from modelforge_protocol.schema_check import UnsupportedSchema, Violation, violations

RUN = work.WORKER_RUN_REQUEST


def test_violations_matching_value_has_none() -> None:
    assert violations(RUN, {"capability": "ocr", "input": {}}) == []


def test_violations_wrong_type_stops_at_the_type() -> None:
    assert violations(RUN, []) == [Violation((), "type")]


def test_violations_missing_field_names_it_and_the_rule() -> None:
    assert violations(RUN, {"capability": "ocr"}) == [Violation(("input",), "required")]


def test_violations_nested_rules_name_the_field_path() -> None:
    found = violations(RUN, {"capability": "", "input": [], "extra": 1})
    assert found == [
        Violation((), "additionalProperties"),
        Violation(("capability",), "minLength"),
        Violation(("input",), "type"),
    ]


def test_violations_unknown_keyword_is_refused_not_ignored() -> None:
    with pytest.raises(UnsupportedSchema, match="if"):
        violations({"type": "object", "if": {}}, {})


def test_violations_booleans_are_not_integers() -> None:
    assert violations({"type": "integer"}, True) == [Violation((), "type")]
    assert violations({"type": "integer"}, 3.0) == []


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        (schemas.HEARTBEAT_ANSWER, {"next_heartbeat_seconds": 15, "node_id": "x"}),
        (schemas.HEARTBEAT_ANSWER, {"next_heartbeat_seconds": "15"}),
        (work.WORKER_STATUS, {"protocol_version": 1, "worker_version": "1.0", "healthy": True, "capabilities": []}),
        (work.WORKER_STATUS, {"protocol_version": 1, "worker_version": "", "healthy": 1, "capabilities": [{}]}),
        (work.WORKER_RUN_ANSWER, {"result": {}}),
        (work.WORKER_RUN_ANSWER, {"result": {}, "error": {"code": "x", "retryable": False}}),
        (work.WORKER_RUN_ANSWER, {"error": {"code": "Bad", "retryable": False}}),
        (work.COMPLETE_WORK, {"epoch": 1, "sha256": "0" * 64, "size": 3}),
        (work.COMPLETE_WORK, {"epoch": 0, "sha256": "0" * 63, "size": -1}),
        (RUN, {"capability": "ocr", "input": {"a": 1}}),
    ],
)
def test_violations_agree_with_jsonschema_on_the_protocol_schemas(schema: dict[str, Any], value: Any) -> None:
    assert (violations(schema, value) == []) == Draft202012Validator(schema).is_valid(value)


def test_violations_unique_items_compare_json_values() -> None:
    schema = {"type": "array", "uniqueItems": True}
    assert violations(schema, [1, 1.0]) == [Violation((), "uniqueItems")]
    assert violations(schema, [True, 1, {"a": 1}, {"a": 2}]) == []
    assert Draft202012Validator(schema).is_valid([True, 1]) and not Draft202012Validator(schema).is_valid([1, 1.0])
