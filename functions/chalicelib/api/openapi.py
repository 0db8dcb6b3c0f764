"""The API's OpenAPI 3.1 document, built from the operations the app's routes declare.

Each route of ``app.py`` is registered with its ``Operation`` (``operations.py``), so the document
lists exactly the routes the app has, in the order it registers them, each with its security, its
request schema, its answers and every error code it can give, by status; a route registered without
an operation cannot be documented, and ``build`` refuses it. Request bodies are the protocol's own
JSON Schemas (``modelforge_protocol.schemas`` and ``.work``; OpenAPI 3.1 uses JSON Schema 2020-12),
and the agent-facing answers combine the protocol's answer schemas with the full answer, so the
document cannot drift from what the control plane validates or what the agent reads. The admin views
(enrollment, node, work item, readiness) have no protocol schema and are written here; the fuzz test
(tests/integration/test_api_fuzz.py) checks every answer against them.

The protocol's patterns end in ``\\Z`` (Python's end of string). JSON Schema patterns are ECMA-262
regular expressions, where ``\\Z`` means a literal ``Z`` and ``$`` (without the multiline flag)
means the end of the input: the document writes ``$``, the same rule in the language JSON Schema
names.

Built on the first request for it, not at cold start: ``document()`` caches it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from modelforge_protocol import schemas
from modelforge_protocol import work as work_protocol
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER, ENROLLMENT_TOKEN_RE, NODE_ID_HEADER
from modelforge_protocol.versions import CONTROL_PLANE_RELEASE, Component, Verdict

from chalicelib.api.operation import (
    ADMIN,
    ENROLLMENT_ID,
    NODE,
    NODE_ID,
    PUBLIC,
    WORK_ID,
    WORK_STATUS,
    Operation,
    Parameter,
    closed,
    declared,
    nullable,
    portable,
    ref,
)

OPENAPI_VERSION = "3.1.0"

# --- the answers' schemas ------------------------------------------------------------------------

_TIME = {"type": "string", "format": "date-time", "description": "ISO 8601 in UTC with milliseconds"}
_SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_COUNT = {"type": "integer", "minimum": 0}
_TEXT = {"type": "string"}

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
                "next_step": {**_TEXT, "description": "protocol_incompatible, simulated_node_refused: what to do"},
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

ENROLLMENT = closed(
    {
        "enrollment_id": ENROLLMENT_ID,
        "display_name": portable(schemas.CREATE_ENROLLMENT["properties"]["display_name"]),
        "status": {"enum": ["pending", "consumed", "expired", "revoked"]},
        "production_eligible": {"type": "boolean"},
        "created_at": _TIME,
        "expires_at": _TIME,
        "consumed_at": nullable(_TIME),
        "revoked_at": nullable(_TIME),
        "node_id": nullable(NODE_ID),
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
_GPU_HEALTH_VIEW = closed(
    {
        "uuid": portable(schemas.GPU_HEALTH["properties"]["uuid"]),
        "state": {"enum": list(schemas.GPU_HEALTH_STATES), "description": "the worst of its grade and its latch"},
        "reasons": {"type": "array", "items": portable(schemas.GPU_REASON)},
        "latched": {"type": "boolean", "description": "a hard fault held until a new boot or an admin's clear"},
        "recheck_pending": {"type": "boolean", "description": "cleared: the agent re-checks it before it takes work"},
        "drained": {"type": "boolean", "description": "an admin drained this GPU"},
        "missing": {"type": "boolean", "description": "reported before, absent now (accept-gpus forgets it)"},
        "schedulable": {"type": "boolean", "description": "it may take work: its state, latch and drains allow it"},
        "reported": {"type": "boolean", "description": "the agent reported its health (false: an older agent)"},
    }
)
NODE_VIEW = closed(
    {
        "node_id": NODE_ID,
        "enrollment_id": ENROLLMENT_ID,
        "display_name": _TEXT,
        "hostname": _TEXT,
        "status": {**_LIVENESS, "description": "computed from last_heartbeat_at at request time"},
        "last_heartbeat_at": nullable(_TIME),
        "accelerator_mode": {"enum": list(schemas.ACCELERATOR_MODES)},
        "production_eligible": {"type": "boolean"},
        "agent_version": _TEXT,
        "protocol_version": {"type": "integer"},
        "protocol_verdict": {"enum": [verdict.value for verdict in Verdict]},
        "credential": closed(
            {"state": {"enum": ["active", "revoked"]}, "issued_at": _TIME, "revoked_at": nullable(_TIME)}
        ),
        "health": nullable(portable(schemas.HEALTH)),
        "telemetry": nullable(
            closed({"reported_at": _TIME, "gpus": {"type": "array", "items": portable(schemas.GPU_TELEMETRY)}})
        ),
        "inventory": nullable(_INVENTORY_VIEW),
        "duplicate_suspected": {"type": "array", "items": NODE_ID, "description": "other nodes reporting its GPUs"},
        "duplicate_suspected_since": nullable(_TIME),
        "duplicate_agent_instances_at": {
            **nullable(_TIME),
            "description": "when its heartbeats last came from two agent processes in turn (two agents on one "
            "identity); null when not within the last 3 heartbeat intervals",
        },
        "liveness_hold": nullable(
            closed({"reason": {"const": "mass_stale_held"}, "since": _TIME, "detail": {}, "meaning": _TEXT})
        ),
        "channel": {"enum": ["connected", "fallback"], "description": "connected: a live push-channel connection"},
        "channel_reason": nullable({**_TEXT, "description": "why the node is in fallback (null when connected)"}),
        "slots": nullable(
            {
                **closed({"total": _COUNT, "busy": _COUNT, "schedulable": _COUNT}),
                "description": "its job slots as its last heartbeat reported them (null: not reported)",
            }
        ),
        "drained": {"type": "boolean", "description": "an admin drained the node: it claims no new work"},
        "gpu_health": {"type": "array", "items": _GPU_HEALTH_VIEW, "description": "each GPU's effective health"},
        "simulated": {"type": "boolean", "description": "true: its GPUs come from an NVML simulation, not hardware"},
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
    "push_channel",
    "gpu_health",
)
READINESS = closed(
    {
        "node_id": nullable(NODE_ID),
        "enrollment_id": ENROLLMENT_ID,
        "ready": {"type": "boolean"},
        "status": {**_LIVENESS, "description": "absent while no node has enrolled with the enrollment"},
        "checked_at": {**_TIME, "description": "absent while no node has enrolled with the enrollment"},
        "checks": {
            "type": "array",
            "items": closed(
                {
                    "name": {"enum": list(READINESS_CHECKS)},
                    "ok": {"type": "boolean"},
                    "detail": _TEXT,
                    "next_step": nullable({**_TEXT, "description": "what to do when the check fails"}),
                }
            ),
        },
    },
    required=["node_id", "enrollment_id", "ready", "checks"],
)

NODE_DELETED = closed(
    {
        "node_id": NODE_ID,
        "deleted": {"const": True},
        "reason": {"enum": ["credential_revoked", "offline"], "description": "why it could be removed"},
        "leases_released": {"type": "integer", "minimum": 0, "description": "its leases, back in the queue"},
    }
)

_SUBMIT = work_protocol.SUBMIT_WORK["properties"]
WORK_ITEM = closed(
    {
        "work_id": WORK_ID,
        "capability": portable(_SUBMIT["capability"]),
        "status": WORK_STATUS,
        "attempts": _COUNT,
        "max_attempts": portable(_SUBMIT["max_attempts"]),
        "lease_seconds": portable(_SUBMIT["lease_seconds"]),
        "epoch": _COUNT,
        "node_id": nullable({**NODE_ID, "description": "the holder while leased, the last holder once done"}),
        "lease_expires_at": nullable(_TIME),
        "created_at": _TIME,
        "updated_at": _TIME,
        "finished_at": nullable(_TIME),
        "input": closed({"sha256": _SHA256, "size": _COUNT}),
        "errors": {
            "type": "array",
            "items": closed(
                {
                    "attempt": _COUNT,
                    "epoch": _COUNT,
                    "node_id": nullable(NODE_ID),
                    "reason": _TEXT,
                    "retryable": {"type": "boolean"},
                    "node_fault": {
                        "type": "boolean",
                        "description": "present (true) when the node failed, not the item: the attempt was not counted",
                    },
                    "at": _TIME,
                },
                ["attempt", "epoch", "node_id", "reason", "retryable", "at"],
            ),
        },
        "result": nullable(
            closed({"sha256": _SHA256, "size": _COUNT, "url": {**_TEXT, "description": "presigned GET, 1 hour"}})
        ),
    }
)


#: The enroll and heartbeat answers' ``features`` (what the control plane accepts beyond protocol 1's
#: base), and ``channel`` when a ticket was minted for this answer; see DISPATCH.md.
_PUSH_CHANNEL_FIELDS = {
    "features": portable(schemas.ENROLL_ANSWER["properties"]["features"]),
    "channel": closed({name: portable(value) for name, value in schemas.CHANNEL["properties"].items()}),
}
_ENROLLED_FIELDS = {
    "node_id": NODE_ID,
    "enrollment_id": ENROLLMENT_ID,
    "display_name": _TEXT,
    "production_eligible": {"type": "boolean"},
    "heartbeat_interval_seconds": {"type": "integer", "minimum": 1},
    "replayed": {"type": "boolean", "description": "true for the same agent's retry after a lost answer"},
    "auth": closed({"scheme": {"const": "Bearer"}, "credential": _TEXT, "node_id_header": {"const": NODE_ID_HEADER}}),
}
ENROLLED = _both(
    schemas.ENROLL_ANSWER, closed({**_ENROLLED_FIELDS, **_PUSH_CHANNEL_FIELDS}, required=list(_ENROLLED_FIELDS))
)
_HEARTBEAT_FIELDS = {
    "node_id": NODE_ID,
    "status": _LIVENESS,
    "heartbeat_interval_seconds": {"type": "integer", "minimum": 1},
    "work_waiting": {"type": "boolean"},
}
#: Only for a node that something blocks (drained, latched or drained GPUs, pending re-checks).
_GPU_ANSWER_FIELDS = {
    name: portable(schemas.HEARTBEAT_ANSWER["properties"][name]) for name in ("drained", "blocked_gpus", "recheck_gpus")
}
HEARTBEAT_ANSWER = _both(
    schemas.HEARTBEAT_ANSWER,
    closed({**_HEARTBEAT_FIELDS, **_PUSH_CHANNEL_FIELDS, **_GPU_ANSWER_FIELDS}, required=list(_HEARTBEAT_FIELDS)),
)
INVENTORY_ANSWER = _both(schemas.INVENTORY_ANSWER, closed({"node_id": NODE_ID, "inventory": _INVENTORY_VIEW}))
CLAIM_ANSWER = _both(
    work_protocol.CLAIM_ANSWER,
    closed(
        {
            "work_id": WORK_ID,
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
    closed({"work_id": WORK_ID, "status": WORK_STATUS, "epoch": _COUNT, "lease_expires_at": nullable(_TIME)}),
)

HEALTH_ANSWER = closed(
    {
        "status": {"const": "ok"},
        "release": _TEXT,
        "agent_protocol_version": {"type": "integer"},
        "worker_protocol_version": {"type": "integer"},
    }
)
COMPATIBILITY_ANSWER = closed(
    {
        "component": {"enum": [component.value for component in Component]},
        "verdict": {"enum": [verdict.value for verdict in Verdict]},
        "next_step": _TEXT,
        "accepted_protocol_versions": closed({"oldest": {"type": "integer"}, "newest": {"type": "integer"}}),
    }
)
OPENAPI_ANSWER = {"type": "object", "required": ["openapi", "info", "paths"], "description": "this document"}
_SETTINGS_FIELDS = list(schemas.NODE_AGENT_SETTINGS["properties"])
NODE_AGENT_SETTINGS_CHECK = closed(
    {
        "ok": {"type": "boolean", "description": "true when there is no problem; settings are then given"},
        "release": {**_TEXT, "description": "the release the image rules are checked against (image tags' spelling)"},
        "problems": {
            "type": "array",
            "items": closed({"field": {"enum": _SETTINGS_FIELDS}, "message": _TEXT}),
            "description": "what is missing or wrong, each naming the request field it is about",
        },
        "settings": {
            "type": "array",
            "items": closed({"name": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}, "value": _TEXT}),
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
    "Drain": portable(schemas.DRAIN),
    "SubmitWork": portable(work_protocol.SUBMIT_WORK),
    "RenewWork": portable(work_protocol.RENEW_WORK),
    "CompleteWork": portable(work_protocol.COMPLETE_WORK),
    "FailWork": portable(work_protocol.FAIL_WORK),
    "Error": ERROR,
    "Enrollment": ENROLLMENT,
    "MintedEnrollment": MINTED_ENROLLMENT,
    "Node": NODE_VIEW,
    "NodeDeleted": NODE_DELETED,
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
    "Drain": schemas.DRAIN,
    "SubmitWork": work_protocol.SUBMIT_WORK,
    "RenewWork": work_protocol.RENEW_WORK,
    "CompleteWork": work_protocol.COMPLETE_WORK,
    "FailWork": work_protocol.FAIL_WORK,
}

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
        "content": {"application/json": {"schema": {"allOf": [ref("Error"), narrowed]}}},
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
            "content": {"application/json": {"schema": ref(operation.request)}},
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


def operations(routes: Mapping[str, Mapping[str, Any]]) -> list[Operation]:
    """The operation of each route in ``routes`` (a Chalice app's ``routes``), in their order.

    Refuses a route registered without an operation: it could not be documented."""
    found: list[Operation] = []
    for path, by_method in routes.items():
        for method, entry in by_method.items():
            operation = declared(entry.view_function)
            if operation is None or (operation.path, operation.method) != (path, method):
                raise ValueError(f"{method} {path} was not registered with its operation (app.py's endpoint)")
            found.append(operation)
    return found


def build(routes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The whole document of the app whose ``routes`` are given, built afresh."""
    paths: dict[str, dict[str, Any]] = {}
    errors: dict[str, Any] = {}
    for operation in operations(routes):
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


_built: list[dict[str, Any]] = []


def document(routes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The document (built once per process, on the first request for it)."""
    if not _built:
        _built.append(build(routes))
    return _built[0]
