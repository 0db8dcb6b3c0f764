"""The API's OpenAPI 3.1 document, built from one declarative list of operations.

Every route of ``app.py`` is one ``Operation`` here (a test checks both ways), with its security,
its request schema, its answers and every error code it can give, by status. Request bodies are the
protocol's own JSON Schemas (``modelforge_protocol.schemas`` and ``.work``; OpenAPI 3.1 uses JSON
Schema 2020-12), and the agent-facing answers combine the protocol's answer schemas with the full
answer, so the document cannot drift from what the control plane validates or what the agent reads.
The admin views (enrollment, node, work item, readiness) have no protocol schema and are written
here; the fuzz test (tests/integration/test_api_fuzz.py) checks every answer against them.

The protocol's patterns end in ``\\Z`` (Python's end of string). JSON Schema patterns are ECMA-262
regular expressions, where ``\\Z`` means a literal ``Z`` and ``$`` (without the multiline flag)
means the end of the input: the document writes ``$``, the same rule in the language JSON Schema
names.

Built on the first request for it, not at cold start: ``document()`` caches it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from modelforge_protocol import schemas
from modelforge_protocol import work as work_protocol
from modelforge_protocol.credentials import (
    ADMIN_TOKEN_HEADER,
    ENROLLMENT_ID_RE,
    ENROLLMENT_TOKEN_RE,
    NODE_ID_HEADER,
)
from modelforge_protocol.versions import CONTROL_PLANE_RELEASE, Component, Verdict

from chalicelib.api import console

OPENAPI_VERSION = "3.1.0"
#: Who may call an operation.
PUBLIC, ADMIN, NODE = "public", "admin", "node"
#: The largest page a list answers (app.MAX_PAGE; a unit test checks they agree).
MAX_PAGE = 100

# --- shared pieces of schema ---------------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
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


_TIME = {"type": "string", "format": "date-time", "description": "ISO 8601 in UTC with milliseconds"}
_ENROLLMENT_ID = {"type": "string", "pattern": ENROLLMENT_ID_RE.pattern}
_NODE_ID = portable({"type": "string", "pattern": schemas.NODE_ID_PATTERN})
_WORK_ID = portable({"type": "string", "pattern": work_protocol.WORK_ID_PATTERN})
_SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT = {"type": "integer", "minimum": 0}
_TEXT = {"type": "string"}
_PAGE_TOKEN = _nullable({"type": "string", "description": "pass as next_token for the next page; null on the last"})

#: Every field an error answer may carry (``code`` and ``message`` always; the rest for some codes).
_ERROR_FIELDS = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,63}$"},
                "message": _TEXT,
                "problems": {"type": "array", "items": _TEXT, "description": "invalid_request: each problem found"},
                "verdict": {"enum": [verdict.value for verdict in Verdict], "description": "protocol_incompatible"},
                "next_step": {**_TEXT, "description": "protocol_incompatible: what to do"},
                "retry_after_seconds": {"type": "integer", "minimum": 1, "description": "rate limits"},
            },
            "required": ["code", "message"],
            "additionalProperties": False,
        }
    },
    "required": ["error"],
    "additionalProperties": False,
}


def _both(protocol_answer: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """An answer the agent reads: the protocol's answer schema (what the agent validates; open for
    forward compatibility) and the whole answer as the control plane gives it."""
    return {"allOf": [portable(protocol_answer), full]}


ERROR = _both(schemas.ERROR_ANSWER, _ERROR_FIELDS)

_INVENTORY_VIEW = portable(
    {
        **schemas.INVENTORY,
        "properties": {**schemas.INVENTORY["properties"], "updated_at": _TIME},
        "required": [*schemas.INVENTORY["required"], "updated_at"],
    }
)

ENROLLMENT = _closed(
    {
        "enrollment_id": _ENROLLMENT_ID,
        "display_name": portable(schemas.CREATE_ENROLLMENT["properties"]["display_name"]),
        "status": {"enum": ["pending", "consumed", "expired", "revoked"]},
        "production_eligible": {"type": "boolean"},
        "created_at": _TIME,
        "expires_at": _TIME,
        "consumed_at": _nullable(_TIME),
        "revoked_at": _nullable(_TIME),
        "node_id": _nullable(_NODE_ID),
    }
)
MINTED_ENROLLMENT = {
    **ENROLLMENT,
    "properties": {
        **ENROLLMENT["properties"],
        "token": {
            "type": "string",
            "pattern": ENROLLMENT_TOKEN_RE.pattern,
            "description": "the single-use enrollment token: shown only in this answer",
        },
    },
    "required": [*ENROLLMENT["required"], "token"],
}

_LIVENESS = {"enum": ["pending", "online", "stale", "offline"]}
NODE_VIEW = _closed(
    {
        "node_id": _NODE_ID,
        "enrollment_id": _ENROLLMENT_ID,
        "display_name": _TEXT,
        "hostname": _TEXT,
        "status": {**_LIVENESS, "description": "computed from last_heartbeat_at at request time"},
        "last_heartbeat_at": _nullable(_TIME),
        "accelerator_mode": {"enum": list(schemas.ACCELERATOR_MODES)},
        "production_eligible": {"type": "boolean"},
        "agent_version": _TEXT,
        "protocol_version": {"type": "integer"},
        "protocol_verdict": {"enum": [verdict.value for verdict in Verdict]},
        "credential": _closed(
            {"state": {"enum": ["active", "revoked"]}, "issued_at": _TIME, "revoked_at": _nullable(_TIME)}
        ),
        "health": _nullable(portable(schemas.HEALTH)),
        "telemetry": _nullable(
            _closed({"reported_at": _TIME, "gpus": {"type": "array", "items": portable(schemas.GPU_TELEMETRY)}})
        ),
        "inventory": _nullable(_INVENTORY_VIEW),
        "duplicate_suspected": {"type": "array", "items": _NODE_ID, "description": "other nodes reporting its GPUs"},
        "duplicate_suspected_since": _nullable(_TIME),
        "liveness_hold": _nullable(
            _closed({"reason": {"const": "mass_stale_held"}, "since": _TIME, "detail": {}, "meaning": _TEXT})
        ),
        "created_at": _TIME,
    }
)

READINESS_CHECKS = (
    "connection",
    "inventory_age",
    "protocol_compatibility",
    "agent_health",
    "telemetry_age",
    "identity_unique",
    "worker",
)
READINESS = _closed(
    {
        "node_id": _nullable(_NODE_ID),
        "enrollment_id": _ENROLLMENT_ID,
        "ready": {"type": "boolean"},
        "status": {**_LIVENESS, "description": "absent while no node has enrolled with the enrollment"},
        "checked_at": {**_TIME, "description": "absent while no node has enrolled with the enrollment"},
        "checks": {
            "type": "array",
            "items": _closed(
                {
                    "name": {"enum": list(READINESS_CHECKS)},
                    "ok": {"type": "boolean"},
                    "detail": _TEXT,
                    "next_step": _nullable({**_TEXT, "description": "what to do when the check fails"}),
                }
            ),
        },
    },
    required=["node_id", "enrollment_id", "ready", "checks"],
)

_WORK_STATUS = {"enum": list(work_protocol.WORK_STATES)}
_SUBMIT = work_protocol.SUBMIT_WORK["properties"]
WORK_ITEM = _closed(
    {
        "work_id": _WORK_ID,
        "capability": portable(_SUBMIT["capability"]),
        "status": _WORK_STATUS,
        "attempts": _COUNT,
        "max_attempts": portable(_SUBMIT["max_attempts"]),
        "lease_seconds": portable(_SUBMIT["lease_seconds"]),
        "epoch": _COUNT,
        "node_id": _nullable({**_NODE_ID, "description": "the holder while leased, the last holder once done"}),
        "lease_expires_at": _nullable(_TIME),
        "created_at": _TIME,
        "updated_at": _TIME,
        "finished_at": _nullable(_TIME),
        "input": _closed({"sha256": _SHA256, "size": _COUNT}),
        "errors": {
            "type": "array",
            "items": _closed(
                {
                    "attempt": _COUNT,
                    "epoch": _COUNT,
                    "node_id": _nullable(_NODE_ID),
                    "reason": _TEXT,
                    "retryable": {"type": "boolean"},
                    "at": _TIME,
                }
            ),
        },
        "result": _nullable(
            _closed({"sha256": _SHA256, "size": _COUNT, "url": {**_TEXT, "description": "presigned GET, 1 hour"}})
        ),
    }
)


ENROLLED = _both(
    schemas.ENROLL_ANSWER,
    _closed(
        {
            "node_id": _NODE_ID,
            "enrollment_id": _ENROLLMENT_ID,
            "display_name": _TEXT,
            "production_eligible": {"type": "boolean"},
            "heartbeat_interval_seconds": {"type": "integer", "minimum": 1},
            "replayed": {"type": "boolean", "description": "true for the same agent's retry after a lost answer"},
            "auth": _closed(
                {"scheme": {"const": "Bearer"}, "credential": _TEXT, "node_id_header": {"const": NODE_ID_HEADER}}
            ),
        }
    ),
)
HEARTBEAT_ANSWER = _both(
    schemas.HEARTBEAT_ANSWER,
    _closed(
        {
            "node_id": _NODE_ID,
            "status": _LIVENESS,
            "heartbeat_interval_seconds": {"type": "integer", "minimum": 1},
            "work_waiting": {"type": "boolean"},
        }
    ),
)
INVENTORY_ANSWER = _both(schemas.INVENTORY_ANSWER, _closed({"node_id": _NODE_ID, "inventory": _INVENTORY_VIEW}))
CLAIM_ANSWER = _both(
    work_protocol.CLAIM_ANSWER,
    _closed(
        {
            "work_id": _WORK_ID,
            "capability": portable(_SUBMIT["capability"]),
            "epoch": {"type": "integer", "minimum": 1},
            "lease_seconds": portable(_SUBMIT["lease_seconds"]),
            "lease_expires_at": _TIME,
            "input_url": {**_TEXT, "description": "presigned GET of the input (a bearer secret)"},
            "result_upload_url": {**_TEXT, "description": "presigned PUT for this epoch's result (a bearer secret)"},
        }
    ),
)
LEASE_ANSWER = _both(
    work_protocol.LEASE_ANSWER,
    _closed({"work_id": _WORK_ID, "status": _WORK_STATUS, "epoch": _COUNT, "lease_expires_at": _nullable(_TIME)}),
)

HEALTH_ANSWER = _closed(
    {
        "status": {"const": "ok"},
        "release": _TEXT,
        "agent_protocol_version": {"type": "integer"},
        "worker_protocol_version": {"type": "integer"},
    }
)
COMPATIBILITY_ANSWER = _closed(
    {
        "component": {"enum": [component.value for component in Component]},
        "verdict": {"enum": [verdict.value for verdict in Verdict]},
        "next_step": _TEXT,
        "accepted_protocol_versions": _closed({"oldest": {"type": "integer"}, "newest": {"type": "integer"}}),
    }
)
OPENAPI_ANSWER = {"type": "object", "required": ["openapi", "info", "paths"], "description": "this document"}
_SETTINGS_FIELDS = list(schemas.NODE_AGENT_SETTINGS["properties"])
NODE_AGENT_SETTINGS_CHECK = _closed(
    {
        "ok": {"type": "boolean", "description": "true when there is no problem; settings are then given"},
        "release": {**_TEXT, "description": "the release the image rules are checked against (image tags' spelling)"},
        "problems": {
            "type": "array",
            "items": _closed({"field": {"enum": _SETTINGS_FIELDS}, "message": _TEXT}),
            "description": "what is missing or wrong, each naming the request field it is about",
        },
        "settings": {
            "type": "array",
            "items": _closed({"name": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}, "value": _TEXT}),
            "description": "the node's .env, in order (empty while there are problems); never a secret",
        },
    }
)

#: Named schemas of the document: the protocol's request schemas, as the control plane validates them.
COMPONENT_SCHEMAS: dict[str, Any] = {
    "CreateEnrollment": portable(schemas.CREATE_ENROLLMENT),
    "Enroll": portable(schemas.ENROLL),
    "Heartbeat": portable(schemas.HEARTBEAT),
    "ReplaceInventory": portable(schemas.REPLACE_INVENTORY),
    "NodeAgentSettings": portable(schemas.NODE_AGENT_SETTINGS),
    "Empty": portable(schemas.EMPTY),
    "SubmitWork": portable(work_protocol.SUBMIT_WORK),
    "RenewWork": portable(work_protocol.RENEW_WORK),
    "CompleteWork": portable(work_protocol.COMPLETE_WORK),
    "FailWork": portable(work_protocol.FAIL_WORK),
    "Error": ERROR,
    "Enrollment": ENROLLMENT,
    "MintedEnrollment": MINTED_ENROLLMENT,
    "Node": NODE_VIEW,
    "Readiness": READINESS,
    "WorkItem": WORK_ITEM,
    "Enrolled": ENROLLED,
    "HeartbeatAnswer": HEARTBEAT_ANSWER,
    "InventoryAnswer": INVENTORY_ANSWER,
    "ClaimAnswer": CLAIM_ANSWER,
    "LeaseAnswer": LEASE_ANSWER,
    "HealthAnswer": HEALTH_ANSWER,
    "CompatibilityAnswer": COMPATIBILITY_ANSWER,
    "OpenApiDocument": OPENAPI_ANSWER,
    "NodeAgentSettingsCheck": NODE_AGENT_SETTINGS_CHECK,
}
#: Where each request schema comes from (a unit test compares them with the protocol's).
REQUEST_SCHEMA_SOURCES: dict[str, Any] = {
    "CreateEnrollment": schemas.CREATE_ENROLLMENT,
    "Enroll": schemas.ENROLL,
    "Heartbeat": schemas.HEARTBEAT,
    "ReplaceInventory": schemas.REPLACE_INVENTORY,
    "NodeAgentSettings": schemas.NODE_AGENT_SETTINGS,
    "Empty": schemas.EMPTY,
    "SubmitWork": work_protocol.SUBMIT_WORK,
    "RenewWork": work_protocol.RENEW_WORK,
    "CompleteWork": work_protocol.COMPLETE_WORK,
    "FailWork": work_protocol.FAIL_WORK,
}

# --- the operations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    description: str
    #: the body's schema; None: no body
    schema: dict[str, Any] | None = None
    #: the body's media types (the console's files are not JSON)
    media_types: tuple[str, ...] = ("application/json",)
    #: headers the answer always carries, by name
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Parameter:
    name: str
    where: str  # "path" or "query"
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Operation:
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


def _path_id(name: str, schema: dict[str, Any], description: str) -> Parameter:
    return Parameter(name, "path", schema, description, required=True)


_PAGE = (
    Parameter(
        "limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}, f"page size (default {MAX_PAGE})"
    ),
    Parameter("next_token", "query", {"type": "string"}, "the next_token of the previous page"),
)
_ENROLLMENT_PARAMETER = _path_id("enrollment_id", _ENROLLMENT_ID, "an enrollment id")
_NODE_PARAMETER = _path_id("node_id", _NODE_ID, "a node id")
_WORK_PARAMETER = _path_id("work_id", _WORK_ID, "a work id")
#: Every console answer carries these (chalicelib/api/console.py).
_CONSOLE_HEADERS = {
    name: {"required": True, "schema": {"const": value}} for name, value in console.SECURITY_HEADERS.items()
}
_CONSOLE_BODY = {"type": "string"}
_LEASE_REFUSALS = {404: ("work_not_found",), 409: ("work_cancelled", "work_finished", "lease_lost")}
_AGENT_BODY = {400: ("protocol_incompatible",)}

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "GET", "/api/v1/health", "getHealth", "Liveness of the API and the protocol versions it speaks", "public", PUBLIC,
        answers={200: Answer("the API answers", _ref("HealthAnswer"))},
    ),
    Operation(
        "GET", "/api/v1/compatibility", "getCompatibility", "Judge a component's protocol version", "public", PUBLIC,
        parameters=(
            Parameter("component", "query", {"enum": [c.value for c in Component]}, "which component", required=True),
            Parameter(
                "protocol_version", "query", {"type": "string"},
                "the version to judge, in decimal digits (missing, or anything else: the verdict is UNKNOWN)",
            ),
        ),
        answers={200: Answer("the verdict and what to do about it", _ref("CompatibilityAnswer"))},
    ),
    Operation(
        "GET", "/api/v1/openapi.json", "getOpenApi", "This document", "public", PUBLIC,
        answers={200: Answer("the OpenAPI 3.1 document of this API", _ref("OpenApiDocument"))},
    ),
    Operation(
        "POST", "/api/v1/admin/node-enrollments", "createEnrollment", "Mint a single-use enrollment token",
        "enrollments", ADMIN, request="CreateEnrollment",
        answers={201: Answer("the enrollment, with its token (shown only here)", _ref("MintedEnrollment"))},
    ),
    Operation(
        "GET", "/api/v1/admin/node-enrollments", "listEnrollments", "List enrollments", "enrollments", ADMIN,
        parameters=_PAGE,
        answers={200: Answer("a page of enrollments", _closed({"enrollments": {"type": "array", "items": _ref("Enrollment")}, "next_token": _PAGE_TOKEN}))},
    ),
    Operation(
        "GET", "/api/v1/admin/node-enrollments/{enrollment_id}", "getEnrollment", "Show an enrollment", "enrollments", ADMIN,
        parameters=(_ENROLLMENT_PARAMETER,),
        answers={200: Answer("the enrollment (never its token)", _ref("Enrollment"))},
        refusals={404: ("enrollment_not_found",)},
    ),
    Operation(
        "POST", "/api/v1/admin/node-enrollments/{enrollment_id}/revoke", "revokeEnrollment",
        "Revoke an unused enrollment token", "enrollments", ADMIN, request="Empty", body_optional=True,
        parameters=(_ENROLLMENT_PARAMETER,),
        answers={200: Answer("the revoked enrollment", _ref("Enrollment"))},
        refusals={404: ("enrollment_not_found",), 409: ("enrollment_consumed", "enrollment_revoked")},
        description="A consumed token cannot be revoked (`enrollment_consumed`): revoke the node's credential instead.",
    ),
    Operation(
        "POST", "/api/v1/admin/node-agent-settings/check", "checkNodeAgentSettings",
        "Check a node's agent settings and render its .env (the console's Enroll node wizard)", "enrollments", ADMIN,
        request="NodeAgentSettings",
        answers={200: Answer("every problem by field, or the node's .env settings in order", _ref("NodeAgentSettingsCheck"))},
        description="The image is checked against this release: a pasted `images.modelforge-node-agent` manifest "
        "entry with the rules of `modelforge release manifest` (exact tag, RootFS layers, architecture, every OCI "
        "label; the image/config ID is ignored), or a registry reference pinned by `@sha256:` digest. Problems are "
        "an answer (200, `ok: false`), not an error. Never takes or returns a token.",
    ),
    Operation(
        "GET", "/api/v1/admin/nodes", "listNodes", "List nodes", "nodes", ADMIN, parameters=_PAGE,
        answers={200: Answer("a page of nodes", _closed({"nodes": {"type": "array", "items": _ref("Node")}, "next_token": _PAGE_TOKEN}))},
    ),
    Operation(
        "GET", "/api/v1/admin/nodes/{node_id}", "getNode", "Show a node", "nodes", ADMIN,
        parameters=(_NODE_PARAMETER,),
        answers={200: Answer("the node", _ref("Node"))},
        refusals={404: ("node_not_found",)},
    ),
    Operation(
        "GET", "/api/v1/admin/nodes/{node_id}/readiness", "getNodeReadiness", "Is this node ready to serve, and if not, why",
        "nodes", ADMIN,
        parameters=(
            _path_id(
                "node_id", {"type": "string", "pattern": "^(node|enr)_[0-9a-f]{32}$"},
                "a node id, or the id of the enrollment the node used (followed to its node)",
            ),
        ),
        answers={200: Answer("each check, with the next step of those that fail", _ref("Readiness"))},
        refusals={404: ("node_not_found", "enrollment_not_found")},
    ),
    Operation(
        "POST", "/api/v1/admin/nodes/{node_id}/revoke-credential", "revokeNodeCredential",
        "Revoke a node's credential (the node must enroll again)", "nodes", ADMIN, request="Empty", body_optional=True,
        parameters=(_NODE_PARAMETER,),
        answers={200: Answer("the node, its credential revoked", _ref("Node"))},
        refusals={404: ("node_not_found",), 409: ("credential_already_revoked",)},
    ),
    Operation(
        "POST", "/api/v1/agent/enroll", "enroll", "Consume an enrollment token and become a node", "agent", PUBLIC,
        request="Enroll",
        answers={
            201: Answer("enrolled", _ref("Enrolled")),
            200: Answer("the same agent's retry after a lost answer: the same node, replayed true", _ref("Enrolled")),
        },
        refusals={
            **_AGENT_BODY,
            401: ("enrollment_token_unknown",),
            409: ("enrollment_token_consumed",),
            410: ("enrollment_token_expired", "enrollment_token_revoked"),
        },
        description="Authenticated by the enrollment token in the body; the credential and idempotency key are "
        "the agent's own, persisted before it calls.",
    ),
    Operation(
        "POST", "/api/v1/agent/heartbeat", "heartbeat", "Report liveness, health and telemetry", "agent", NODE,
        request="Heartbeat",
        answers={200: Answer("recorded", _ref("HeartbeatAnswer"))},
        refusals={**_AGENT_BODY, 409: ("heartbeat_conflict",)},
    ),
    Operation(
        "POST", "/api/v1/agent/inventory", "replaceInventory", "Replace the node's inventory", "agent", NODE,
        request="ReplaceInventory",
        answers={200: Answer("replaced", _ref("InventoryAnswer"))},
        refusals={**_AGENT_BODY, 409: ("inventory_conflict",), 429: ("inventory_rate_limited",)},
    ),
    Operation(
        "POST", "/api/v1/admin/work", "submitWork", "Submit work", "work", ADMIN, request="SubmitWork",
        answers={
            201: Answer("queued", _ref("WorkItem")),
            200: Answer("a retry with the same idempotency_key and the same work: the same item", _ref("WorkItem")),
        },
        refusals={400: ("invalid_input",), 409: ("idempotency_key_reused",)},
        description=f"The body may be up to {work_protocol.MAX_SUBMIT_BODY_BYTES} bytes (every other operation: "
        f"{schemas.MAX_BODY_BYTES}). `ocr` takes `{{\"image_base64\": <PNG or JPEG>}}`; `diagnostic.echo` any object.",
    ),
    Operation(
        "GET", "/api/v1/admin/work", "listWork", "List work", "work", ADMIN,
        parameters=(
            *_PAGE,
            Parameter("status", "query", dict(_WORK_STATUS), "only work in this state"),
            Parameter("capability", "query", portable(_SUBMIT["capability"]), "only work of this capability"),
        ),
        answers={200: Answer("a page of work items", _closed({"work": {"type": "array", "items": _ref("WorkItem")}, "next_token": _PAGE_TOKEN}))},
    ),
    Operation(
        "GET", "/api/v1/admin/work/{work_id}", "getWork", "Show a work item", "work", ADMIN,
        parameters=(_WORK_PARAMETER,),
        answers={200: Answer("the work item", _ref("WorkItem"))},
        refusals={404: ("work_not_found",)},
    ),
    Operation(
        "POST", "/api/v1/admin/work/{work_id}/cancel", "cancelWork", "Cancel queued or leased work", "work", ADMIN,
        request="Empty", body_optional=True, parameters=(_WORK_PARAMETER,),
        answers={200: Answer("the cancelled item", _ref("WorkItem"))},
        refusals={404: ("work_not_found",), 409: ("work_finished", "work_conflict")},
    ),
    Operation(
        "GET", "/console", "getConsole", "The web console's page", "console", PUBLIC,
        answers={
            200: Answer("the page (at /console/)", _CONSOLE_BODY, ("text/html",), _CONSOLE_HEADERS),
            308: Answer(
                "/console without its slash: sent to /console/ (relative Location: console/)",
                None,
                headers={**_CONSOLE_HEADERS, "Location": {"required": True, "schema": {"const": "console/"}}},
            ),
        },
        description="Static, served by the same function as the API; it calls the admin API of the same origin.",
    ),
    Operation(
        "GET", "/console/{name}", "getConsoleFile", "One of the web console's files", "console", PUBLIC,
        parameters=(_path_id("name", {"enum": sorted(console.ASSETS)}, "a file of the console (a fixed list)"),),
        answers={200: Answer("the file", _CONSOLE_BODY, ("text/javascript", "text/css"), _CONSOLE_HEADERS)},
        refusals={404: ("console_file_not_found",)},
    ),
    Operation(
        "POST", "/api/v1/agent/work/claim", "claimWork", "Lease the oldest claimable work item", "agent", NODE,
        request="Empty", body_optional=True,
        answers={200: Answer("leased to this node", _ref("ClaimAnswer")), 204: Answer("nothing claimable")},
        refusals={409: ("node_not_online",)},
    ),
    Operation(
        "POST", "/api/v1/agent/work/{work_id}/renew", "renewLease", "Extend the lease", "agent", NODE,
        request="RenewWork", parameters=(_WORK_PARAMETER,),
        answers={200: Answer("renewed", _ref("LeaseAnswer"))},
        refusals=_LEASE_REFUSALS,
    ),
    Operation(
        "POST", "/api/v1/agent/work/{work_id}/complete", "completeWork", "Finish the work with its uploaded result",
        "agent", NODE, request="CompleteWork", parameters=(_WORK_PARAMETER,),
        answers={200: Answer("succeeded", _ref("LeaseAnswer"))},
        refusals={
            **_LEASE_REFUSALS,
            409: (*_LEASE_REFUSALS[409], "result_missing", "result_checksum_mismatch"),
            413: ("result_too_large",),
        },
    ),
    Operation(
        "POST", "/api/v1/agent/work/{work_id}/fail", "failWork", "Give the work up (re-queued while attempts remain)",
        "agent", NODE, request="FailWork", parameters=(_WORK_PARAMETER,),
        answers={200: Answer("re-queued or dead", _ref("LeaseAnswer"))},
        refusals=_LEASE_REFUSALS,
    ),
)  # fmt: skip

SECURITY_SCHEMES = {
    "AdminToken": {
        "type": "apiKey",
        "in": "header",
        "name": ADMIN_TOKEN_HEADER,
        "description": "the admin token (compared as SHA-256, in constant time)",
    },
    "NodeCredential": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "mfn.<secret>",
        "description": "the node credential the agent sent at enrollment; always with NodeId",
    },
    "NodeId": {
        "type": "apiKey",
        "in": "header",
        "name": NODE_ID_HEADER,
        "description": "the node id the enrollment answered; always with NodeCredential",
    },
}
_SECURITY: dict[str, list[dict[str, list[str]]]] = {
    PUBLIC: [],
    ADMIN: [{"AdminToken": []}],
    NODE: [{"NodeCredential": [], "NodeId": []}],
}

DESCRIPTION = f"""The ModelForge control plane's API (see docs/API.md).

Every error is `{{"error": {{"code": "<stable_code>", "message": "<what to do>"}}}}` with a 4xx status
(5xx only for faults of the control plane itself). Each operation lists every code it can answer, by
status. Request bodies are one JSON object of at most {schemas.MAX_BODY_BYTES} bytes (work submission:
{work_protocol.MAX_SUBMIT_BODY_BYTES}); unknown fields are refused.

Outside the operations: an unknown path answers 404 `not_found`; a method a path does not have
answers 405 `method_not_allowed` with an `Allow` header (`modelforge local up`; the deployed API
Gateway answers both with 404 `not_found`, see docs/ARCHITECTURE.md). The gateway also answers 429
`throttled`, other 4xx `request_refused` and 5xx `gateway_error`; the local server answers a body it
cannot frame with 400 `invalid_content_length`, 411 `length_required` or 501 `not_implemented`, and
503 `server_busy` beyond its connection limit."""


def _parameter(parameter: Parameter) -> dict[str, Any]:
    return {
        "name": parameter.name,
        "in": parameter.where,
        "required": parameter.required,
        "description": parameter.description,
        "schema": parameter.schema,
    }


def _error_answer(status: int, codes: tuple[str, ...]) -> dict[str, Any]:
    narrowed = {"properties": {"error": {"properties": {"code": {"enum": list(codes)}}}}}
    answer: dict[str, Any] = {
        "description": ", ".join(f"`{code}`" for code in codes),
        "content": {"application/json": {"schema": {"allOf": [_ref("Error"), narrowed]}}},
    }
    if status == 429:
        answer["headers"] = {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "string", "pattern": "^[0-9]+$"}}
        }
    return answer


def _error_name(status: int, codes: tuple[str, ...]) -> str:
    """The shared answer of one status and set of codes (operations that refuse alike share it)."""
    return "-".join((str(status), *codes))


def _operation(operation: Operation) -> dict[str, Any]:
    body: dict[str, Any] = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        "tags": [operation.tag],
        "security": _SECURITY[operation.security],
    }
    if operation.description:
        body["description"] = operation.description
    if operation.parameters:
        body["parameters"] = [_parameter(parameter) for parameter in operation.parameters]
    if operation.request is not None:
        body["requestBody"] = {
            "required": not operation.body_optional,
            "content": {"application/json": {"schema": _ref(operation.request)}},
        }
    responses: dict[str, Any] = {}
    for status, answer in sorted(operation.answers.items()):
        entry: dict[str, Any] = {"description": answer.description}
        if answer.headers:
            entry["headers"] = copy.deepcopy(answer.headers)
        if answer.schema is not None:
            entry["content"] = {media_type: {"schema": answer.schema} for media_type in answer.media_types}
        responses[str(status)] = entry
    for status, codes in operation.errors().items():
        responses[str(status)] = {"$ref": f"#/components/responses/{_error_name(status, codes)}"}
    body["responses"] = responses
    return body


def build() -> dict[str, Any]:
    """The whole document, built afresh."""
    paths: dict[str, dict[str, Any]] = {}
    errors: dict[str, Any] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation)
        for status, codes in operation.errors().items():
            errors[_error_name(status, codes)] = _error_answer(status, codes)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "ModelForge control plane",
            "version": CONTROL_PLANE_RELEASE,
            "description": DESCRIPTION,
        },
        "tags": [
            {"name": "public", "description": "no authentication"},
            {"name": "enrollments", "description": "admin: single-use enrollment tokens"},
            {"name": "nodes", "description": "admin: enrolled nodes"},
            {"name": "work", "description": "admin: the work queue"},
            {"name": "agent", "description": "the node agent"},
            {
                "name": "console",
                "description": "the web console's static files (no authentication; it asks for the admin token)",
            },
        ],
        "paths": paths,
        "components": {
            "schemas": copy.deepcopy(COMPONENT_SCHEMAS),
            "responses": dict(sorted(errors.items())),
            "securitySchemes": copy.deepcopy(SECURITY_SCHEMES),
        },
    }


@lru_cache(maxsize=1)
def _cached() -> dict[str, Any]:
    return build()


def document() -> dict[str, Any]:
    """The document (built once per process, on the first request for it)."""
    return _cached()
