"""Request validation: JSON parsing, body limits and schema checks with safe messages."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import TYPE_CHECKING, Any

from modelforge_protocol import schemas, strict_json

from chalicelib.domain.errors import Invalid, TooLarge, invalid_request

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

_ASCII_DIGITS = re.compile(r"[0-9]{1,9}")


def parse_json_object(
    raw_body: bytes | None, *, allow_empty: bool = False, max_bytes: int = schemas.MAX_BODY_BYTES
) -> dict[str, Any]:
    """Decode a request body that must be one JSON object of at most ``max_bytes``.

    Strict JSON (``modelforge_protocol.strict_json``): NaN and Infinity are refused (they are
    not JSON, and every range check passes NaN), and so is nesting deeper than ``MAX_BODY_DEPTH``.
    """
    if raw_body is not None and len(raw_body) > max_bytes:
        raise TooLarge("payload_too_large", f"request body exceeds {max_bytes} bytes")
    if raw_body is None or raw_body.strip() == b"":
        if allow_empty:
            return {}
        raise invalid_request("request body must be a JSON object")
    try:
        parsed = strict_json.loads(raw_body, max_depth=schemas.MAX_BODY_DEPTH)
    except strict_json.StrictJsonError:
        raise Invalid("invalid_json", "request body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise invalid_request("request body must be a JSON object")
    _require_unicode(parsed)
    return parsed


def _require_unicode(parsed: dict[str, Any]) -> None:
    """Refuse strings (values or names) that cannot be encoded as UTF-8.

    JSON's escapes can spell a lone surrogate (``"\\ud800"``): it parses, but no UTF-8 store,
    log or answer can hold it (I-JSON, RFC 7493, forbids it for the same reason).
    """
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid(
            "invalid_json", "request body is not valid I-JSON: strings must be Unicode text (no unpaired surrogates)"
        ) from None


@cache
def _validator(schema_name: str) -> Draft202012Validator:
    # imported on the first request that validates a body, not at cold start
    from jsonschema import Draft202012Validator

    return Draft202012Validator(getattr(schemas, schema_name))


def _describe(error: ValidationError) -> str:
    """Say what is wrong and where, without echoing the offending value."""
    where = "/".join(str(part) for part in error.absolute_path) or "body"
    rule, expected = error.validator, error.validator_value
    if rule == "required":
        missing = [name for name in expected if name not in (error.instance or {})]
        return f"{where}: missing required field(s) {', '.join(missing)}"
    if rule == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        shown = ", ".join(name[:64] for name in unknown[:5])
        return f"{where}: unknown field(s) {shown}"
    templates = {
        "type": "must be of type {}",
        "minLength": "must be at least {} characters",
        "maxLength": "must be at most {} characters",
        "pattern": "has an invalid format",
        "minimum": "must be at least {}",
        "maximum": "must be at most {}",
        "maxItems": "must have at most {} items",
        "uniqueItems": "must not contain duplicates",
    }
    template = templates.get(str(rule), "is invalid")
    if rule == "enum":
        template = "must be one of " + ", ".join(str(choice) for choice in expected)
    return f"{where}: {template.format(expected)}"


def validate(body: dict[str, Any], schema_name: str) -> None:
    """Raise one invalid_request naming every problem (up to ten) in the body."""
    _raise_problems(_validator(schema_name), body, None)


def validate_with(document: Any, schema: dict[str, Any], where: str | None = None) -> None:
    """``validate`` for a schema given as data (the work queue's, in ``modelforge_protocol.work``);
    problems are named under ``where`` (a part of the body) when given."""
    from jsonschema import Draft202012Validator

    _raise_problems(Draft202012Validator(schema), document, where)


def _raise_problems(validator: Draft202012Validator, document: Any, where: str | None) -> None:
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        problems = [_describe(error) for error in errors[:10]]
        if where is not None:
            problems = [
                f"{where}/{problem}" if not problem.startswith("body:") else f"{where}:{problem[5:]}"
                for problem in problems
            ]
        raise invalid_request("; ".join(problems), problems=problems)


def validate_query(params: dict[str, str] | None, allowed: set[str]) -> dict[str, str]:
    params = dict(params or {})
    unknown = sorted(set(params) - allowed)
    if unknown:
        shown = ", ".join(name[:64] for name in unknown[:5])
        raise invalid_request(f"unknown query parameter(s) {shown}")
    return params


def require_unique(items: list[dict[str, Any]], field: str, where: str) -> None:
    """Refuse a list in which two entries share ``field`` (JSON Schema cannot say this)."""
    values = [item[field] for item in items]
    if len(set(values)) != len(values):
        raise invalid_request(f"{where}: each entry's {field} must be unique")


def validate_inventory(inventory: dict[str, Any], where: str = "inventory/gpus") -> None:
    require_unique(inventory["gpus"], "index", where)
    require_unique(inventory["gpus"], "uuid", where)


def ascii_int(raw: str | None, low: int, high: int) -> int | None:
    """An integer in [low, high] written with ASCII digits only, else None."""
    if raw is None or not _ASCII_DIGITS.fullmatch(raw):
        return None
    value = int(raw)
    return value if low <= value <= high else None
