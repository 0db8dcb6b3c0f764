"""What a route declares about itself: an ``Operation`` of the OpenAPI document.

``app.py`` registers each route with ``endpoint(operation)``: the operation's method and path are the
route's, and the same object is the route's entry in the document (``openapi.build`` reads it back
from the app's routes). The operations themselves are data, in ``operations.py``.

Also here: the small pieces of schema that declarations and the document's schemas share. They are
plain data, cheap at cold start; the document itself is built on its first request (``openapi.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol import schemas
from modelforge_protocol import work as work_protocol
from modelforge_protocol.credentials import ENROLLMENT_ID_RE

#: Who may call an operation.
PUBLIC, ADMIN, NODE = "public", "admin", "node"

# --- shared pieces of schema ---------------------------------------------------------------------


def ref(name: str) -> dict[str, str]:
    """A named schema of the document (``openapi.COMPONENT_SCHEMAS``)."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An answer object with exactly these fields (all present unless ``required`` says otherwise)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


def portable(schema: Any) -> Any:
    """A deep copy of a protocol schema with Python's ``\\Z`` written as ECMA-262's ``$``."""
    if isinstance(schema, dict):
        copied = {key: portable(value) for key, value in schema.items()}
        pattern = copied.get("pattern")
        if isinstance(pattern, str) and pattern.endswith("\\Z"):
            copied["pattern"] = pattern[:-2] + "$"
        return copied
    if isinstance(schema, list):
        return [portable(value) for value in schema]
    return copy.deepcopy(schema)


ENROLLMENT_ID = {"type": "string", "pattern": ENROLLMENT_ID_RE.pattern}
NODE_ID = portable({"type": "string", "pattern": schemas.NODE_ID_PATTERN})
WORK_ID = portable({"type": "string", "pattern": work_protocol.WORK_ID_PATTERN})
WORK_STATUS = {"enum": list(work_protocol.WORK_STATES)}
PAGE_TOKEN = nullable({"type": "string", "description": "pass as next_token for the next page; null on the last"})

# --- the declaration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One answer an operation documents: its description, body schema, media types and headers."""

    description: str
    #: the body's schema; None: no body
    schema: dict[str, Any] | None = None
    #: the body's media types (the console's files are not JSON)
    media_types: tuple[str, ...] = ("application/json",)
    #: headers the answer always carries, by name
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Parameter:
    """A path or query parameter of an operation."""

    name: str
    where: str  # "path" or "query"
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Operation:
    """One route's declaration: its method and path, and its entry in the OpenAPI document."""

    method: str
    path: str
    operation_id: str
    summary: str
    tag: str
    security: str
    #: the request body's component schema (None: the operation reads no body)
    request: str | None = None
    #: whether an empty body counts as ``{}``
    body_optional: bool = False
    parameters: tuple[Parameter, ...] = ()
    answers: dict[int, Answer] = field(default_factory=dict)
    #: error codes of this operation's own, by status (the common ones are added by ``errors``)
    refusals: dict[int, tuple[str, ...]] = field(default_factory=dict)
    description: str = ""

    def query_names(self) -> set[str]:
        """The query parameters the operation takes (the route refuses any other)."""
        return {parameter.name for parameter in self.parameters if parameter.where == "query"}

    def errors(self) -> dict[int, tuple[str, ...]]:
        """Every error code this operation can answer, by status."""
        found: dict[int, list[str]] = {}

        def add(status: int, *codes: str) -> None:
            bucket = found.setdefault(status, [])
            bucket.extend(code for code in codes if code not in bucket)

        # every request: the app's validation, the body limit and Chalice's content-type check
        add(400, "invalid_request")
        if self.request is not None:
            add(400, "invalid_json")
        add(413, "payload_too_large")
        add(415, "unsupported_media_type")
        if self.security == ADMIN:
            add(401, "admin_token_missing")
            add(403, "admin_token_invalid")
        elif self.security == NODE:
            add(401, "credential_missing", "credential_invalid", "credential_revoked")
        for status, codes in self.refusals.items():
            add(status, *codes)
        add(429, "throttled")  # API Gateway's throttling, in the deployed stack
        add(500, "internal_error", "configuration_invalid")
        return {status: tuple(codes) for status, codes in sorted(found.items())}


def path_id(name: str, schema: dict[str, Any], description: str) -> Parameter:
    return Parameter(name, "path", schema, description, required=True)


# --- a route's view carries its operation --------------------------------------------------------

_ATTRIBUTE = "openapi_operation"


def declare(view: Callable[..., Any], operation: Operation) -> Callable[..., Any]:
    """Mark ``view`` as the handler of ``operation`` (what ``declared`` reads back)."""
    setattr(view, _ATTRIBUTE, operation)
    return view


def declared(view: Callable[..., Any]) -> Operation | None:
    """The operation ``view`` was registered for, or None for a route registered without one."""
    found = getattr(view, _ATTRIBUTE, None)
    return found if isinstance(found, Operation) else None
