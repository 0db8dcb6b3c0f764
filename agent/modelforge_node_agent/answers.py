"""What the control plane answers, checked before the agent uses any of it.

An answer is parsed as strict JSON (no NaN, no infinities, at most ``MAX_ANSWER_DEPTH`` levels of
nesting) and validated against the shared answer schemas. Anything else is a ``MalformedAnswer``
whose reason names the failing field or rule, never a value from the body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from modelforge_protocol import schemas, strict_json, work


class MalformedAnswer(Exception):
    """The answer is not what the protocol allows; ``reason`` never quotes the body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _validator(schema: Mapping[str, Any]) -> Draft202012Validator:
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


#: Compiled once, at import.
ENROLL_ANSWER = _validator(schemas.ENROLL_ANSWER)
HEARTBEAT_ANSWER = _validator(schemas.HEARTBEAT_ANSWER)
INVENTORY_ANSWER = _validator(schemas.INVENTORY_ANSWER)
ERROR_ANSWER = _validator(schemas.ERROR_ANSWER)
CLAIM_ANSWER = _validator(work.CLAIM_ANSWER)
LEASE_ANSWER = _validator(work.LEASE_ANSWER)
WORKER_STATUS = _validator(work.WORKER_STATUS)
WORKER_RUN_ANSWER = _validator(work.WORKER_RUN_ANSWER)


def parse(raw: bytes, *, max_bytes: int = schemas.MAX_ANSWER_BYTES, max_depth: int = schemas.MAX_ANSWER_DEPTH) -> Any:
    """Strict JSON: at most ``max_bytes`` (``MAX_ANSWER_BYTES``), ``max_depth`` (``MAX_ANSWER_DEPTH``)
    deep, finite numbers. Larger limits are for work documents (inputs, the worker's results)."""
    try:
        return strict_json.loads(raw, max_depth=max_depth, max_bytes=max_bytes)
    except (strict_json.RefusedConstant, strict_json.RefusedNumber) as refused:
        raise MalformedAnswer(refused.reason) from None
    except strict_json.StrictJsonError as refused:  # larger than, nested deeper than, not JSON
        raise MalformedAnswer(f"answer {refused.reason}") from None


def _where(error: Any) -> str:
    """The failing field's path and rule: names from our schema, never a value from the body."""
    path = ".".join(str(part) for part in error.absolute_path) or "answer"
    return f"{path} fails {error.validator}"


def validated(
    validator: Draft202012Validator, raw: bytes, *, max_bytes: int = schemas.MAX_ANSWER_BYTES
) -> dict[str, Any]:
    """The parsed answer if it matches the schema, else ``MalformedAnswer``."""
    return check(validator, parse(raw, max_bytes=max_bytes))


def check(validator: Draft202012Validator, answer: Any) -> dict[str, Any]:
    """``answer`` (already parsed) if it matches the schema, else ``MalformedAnswer``."""
    error = best_match(validator.iter_errors(answer))
    if error is not None:
        raise MalformedAnswer(_where(error))
    return answer  # type: ignore[no-any-return]


def clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))
