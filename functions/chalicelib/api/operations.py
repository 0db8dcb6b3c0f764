"""Every operation of the API, as data: what each route declares about itself.

``app.py`` registers a route per operation with ``endpoint(operations.NAME)``: the route's method and
path are the operation's, and the OpenAPI document (``openapi.py``) lists the operations the app's
routes carry, in the order ``app.py`` registers them. Nothing else lists the routes.

Each operation names its request body's schema (the protocol's, ``openapi.COMPONENT_SCHEMAS``), its
answers and every error code of its own, by status (``Operation.errors`` adds the common ones).
"""

from __future__ import annotations

from typing import Any

from modelforge_protocol import schemas
from modelforge_protocol import work as work_protocol
from modelforge_protocol.versions import Component

from chalicelib.api import console
from chalicelib.api.operation import (
    ADMIN,
    ENROLLMENT_ID,
    NODE,
    NODE_ID,
    PAGE_TOKEN,
    PUBLIC,
    WORK_ID,
    WORK_STATUS,
    Answer,
    Operation,
    Parameter,
    closed,
    path_id,
    portable,
    ref,
)
from chalicelib.api.paging import MAX_PAGE

_SUBMIT = work_protocol.SUBMIT_WORK["properties"]
_PAGE = (
    Parameter(
        "limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}, f"page size (default {MAX_PAGE})"
    ),
    Parameter("next_token", "query", {"type": "string"}, "the next_token of the previous page"),
)
_ENROLLMENT_PARAMETER = path_id("enrollment_id", ENROLLMENT_ID, "an enrollment id")
_NODE_PARAMETER = path_id("node_id", NODE_ID, "a node id")
_WORK_PARAMETER = path_id("work_id", WORK_ID, "a work id")
#: Every console answer carries these (chalicelib/api/console.py).
_CONSOLE_HEADERS = {
    name: {"required": True, "schema": {"const": value}} for name, value in console.SECURITY_HEADERS.items()
}
_CONSOLE_BODY = {"type": "string"}
_LEASE_REFUSALS = {404: ("work_not_found",), 409: ("work_cancelled", "work_finished", "lease_lost")}
_AGENT_BODY = {400: ("protocol_incompatible",)}


def _page_of(field: str, schema: str) -> dict[str, Any]:
    """A list answer: one page of ``schema`` items under ``field``, and the next page's token."""
    return closed({field: {"type": "array", "items": ref(schema)}, "next_token": PAGE_TOKEN})


# --- public ----------------------------------------------------------------------------------------

GET_HEALTH = Operation(
    "GET",
    "/api/v1/health",
    "getHealth",
    "Liveness of the API and the protocol versions it speaks",
    "public",
    PUBLIC,
    answers={200: Answer("the API answers", ref("HealthAnswer"))},
)

GET_COMPATIBILITY = Operation(
    "GET",
    "/api/v1/compatibility",
    "getCompatibility",
    "Judge a component's protocol version",
    "public",
    PUBLIC,
    parameters=(
        Parameter("component", "query", {"enum": [c.value for c in Component]}, "which component", required=True),
        Parameter(
            "protocol_version",
            "query",
            {"type": "string"},
            "the version to judge, in decimal digits (missing, or anything else: the verdict is UNKNOWN)",
        ),
    ),
    answers={200: Answer("the verdict and what to do about it", ref("CompatibilityAnswer"))},
)

GET_OPEN_API = Operation(
    "GET",
    "/api/v1/openapi.json",
    "getOpenApi",
    "This document",
    "public",
    PUBLIC,
    answers={200: Answer("the OpenAPI 3.1 document of this API", ref("OpenApiDocument"))},
)

# --- admin: enrollments ---------------------------------------------------------------------------

CREATE_ENROLLMENT = Operation(
    "POST",
    "/api/v1/admin/node-enrollments",
    "createEnrollment",
    "Mint a single-use enrollment token",
    "enrollments",
    ADMIN,
    request="CreateEnrollment",
    answers={201: Answer("the enrollment, with its token (shown only here)", ref("MintedEnrollment"))},
)

LIST_ENROLLMENTS = Operation(
    "GET",
    "/api/v1/admin/node-enrollments",
    "listEnrollments",
    "List enrollments",
    "enrollments",
    ADMIN,
    parameters=_PAGE,
    answers={200: Answer("a page of enrollments", _page_of("enrollments", "Enrollment"))},
)

GET_ENROLLMENT = Operation(
    "GET",
    "/api/v1/admin/node-enrollments/{enrollment_id}",
    "getEnrollment",
    "Show an enrollment",
    "enrollments",
    ADMIN,
    parameters=(_ENROLLMENT_PARAMETER,),
    answers={200: Answer("the enrollment (never its token)", ref("Enrollment"))},
    refusals={404: ("enrollment_not_found",)},
)

REVOKE_ENROLLMENT = Operation(
    "POST",
    "/api/v1/admin/node-enrollments/{enrollment_id}/revoke",
    "revokeEnrollment",
    "Revoke an unused enrollment token",
    "enrollments",
    ADMIN,
    request="Empty",
    body_optional=True,
    parameters=(_ENROLLMENT_PARAMETER,),
    answers={200: Answer("the revoked enrollment", ref("Enrollment"))},
    refusals={404: ("enrollment_not_found",), 409: ("enrollment_consumed", "enrollment_revoked")},
    description="A consumed token cannot be revoked (`enrollment_consumed`): revoke the node's credential instead.",
)

CHECK_NODE_AGENT_SETTINGS = Operation(
    "POST",
    "/api/v1/admin/node-agent-settings/check",
    "checkNodeAgentSettings",
    "Check a node's agent settings and render its .env (the console's Enroll node wizard)",
    "enrollments",
    ADMIN,
    request="NodeAgentSettings",
    answers={
        200: Answer("every problem by field, or the node's .env settings in order", ref("NodeAgentSettingsCheck"))
    },
    description="The image is checked against this release: a pasted `images.modelforge-node-agent` manifest "
    "entry with the rules of `modelforge release manifest` (exact tag, RootFS layers, architecture, every OCI "
    "label; the image/config ID is ignored), or a registry reference pinned by `@sha256:` digest. Problems are "
    "an answer (200, `ok: false`), not an error. Never takes or returns a token.",
)

# --- admin: nodes ---------------------------------------------------------------------------------

LIST_NODES = Operation(
    "GET",
    "/api/v1/admin/nodes",
    "listNodes",
    "List nodes",
    "nodes",
    ADMIN,
    parameters=_PAGE,
    answers={200: Answer("a page of nodes", _page_of("nodes", "Node"))},
)

GET_NODE = Operation(
    "GET",
    "/api/v1/admin/nodes/{node_id}",
    "getNode",
    "Show a node",
    "nodes",
    ADMIN,
    parameters=(_NODE_PARAMETER,),
    answers={200: Answer("the node", ref("Node"))},
    refusals={404: ("node_not_found",)},
)

GET_NODE_READINESS = Operation(
    "GET",
    "/api/v1/admin/nodes/{node_id}/readiness",
    "getNodeReadiness",
    "Is this node ready to serve, and if not, why",
    "nodes",
    ADMIN,
    parameters=(
        path_id(
            "node_id",
            {"type": "string", "pattern": "^(node|enr)_[0-9a-f]{32}$"},
            "a node id, or the id of the enrollment the node used (followed to its node)",
        ),
    ),
    answers={200: Answer("each check, with the next step of those that fail", ref("Readiness"))},
    refusals={404: ("node_not_found", "enrollment_not_found")},
)

REVOKE_NODE_CREDENTIAL = Operation(
    "POST",
    "/api/v1/admin/nodes/{node_id}/revoke-credential",
    "revokeNodeCredential",
    "Revoke a node's credential (the node must enroll again)",
    "nodes",
    ADMIN,
    request="Empty",
    body_optional=True,
    parameters=(_NODE_PARAMETER,),
    answers={200: Answer("the node, its credential revoked", ref("Node"))},
    refusals={404: ("node_not_found",), 409: ("credential_already_revoked",)},
)

DELETE_NODE = Operation(
    "DELETE",
    "/api/v1/admin/nodes/{node_id}",
    "deleteNode",
    "Remove a node whose credential is revoked or that is offline, and everything of it",
    "nodes",
    ADMIN,
    parameters=(_NODE_PARAMETER,),
    answers={200: Answer("the node is gone; its leases went back to the queue", ref("NodeDeleted"))},
    refusals={404: ("node_not_found",), 409: ("node_not_removable", "node_conflict")},
    description="Its inventory, GPU claims and GPU state, duplicate flags, channel connection, park entries, "
    "slot counters and enrollment record go with it (one `node.deleted` state-log event); its agent's "
    "credential no longer authenticates.",
)

_GPU_PARAMETER = path_id("gpu_uuid", {"type": "string", "pattern": "^(GPU|MIG)-[0-9A-Za-z-]{8,96}$"}, "a GPU UUID")
_NODE_GPU_VIEW = {200: Answer("the node, with each GPU's effective health", ref("Node"))}


def _drain(path: str, name: str, summary: str) -> Operation:
    return Operation(
        "POST",
        path,
        name,
        summary,
        "nodes",
        ADMIN,
        request="Drain",
        body_optional=True,
        parameters=(_NODE_PARAMETER,),
        answers=_NODE_GPU_VIEW,
        refusals={404: ("node_not_found", "gpu_not_found"), 409: ("gpu_state_conflict",)},
        description="Without a body the whole node; with `gpu_uuid`, that GPU. Running jobs finish; "
        "doing it twice changes nothing.",
    )


DRAIN_NODE = _drain("/api/v1/admin/nodes/{node_id}/drain", "drainNode", "Stop new work on a node or one of its GPUs")
UNDRAIN_NODE = _drain(
    "/api/v1/admin/nodes/{node_id}/undrain", "undrainNode", "Let a drained node or GPU take work again"
)
CLEAR_GPU_FAULT = Operation(
    "POST",
    "/api/v1/admin/nodes/{node_id}/gpus/{gpu_uuid}/clear",
    "clearGpuFault",
    "Clear a GPU's latched hard fault after repair",
    "nodes",
    ADMIN,
    request="Empty",
    body_optional=True,
    parameters=(_NODE_PARAMETER, _GPU_PARAMETER),
    answers=_NODE_GPU_VIEW,
    refusals={404: ("node_not_found", "gpu_not_found"), 409: ("gpu_fault_not_latched", "gpu_state_conflict")},
    description="The agent re-checks the GPU before it takes work; a GPU still faulted is latched again.",
)
ACCEPT_NODE_GPUS = Operation(
    "POST",
    "/api/v1/admin/nodes/{node_id}/accept-gpus",
    "acceptNodeGpus",
    "Accept a node's current GPU set (forget GPUs removed on purpose)",
    "nodes",
    ADMIN,
    request="Empty",
    body_optional=True,
    parameters=(_NODE_PARAMETER,),
    answers=_NODE_GPU_VIEW,
    refusals={404: ("node_not_found",), 409: ("gpu_state_conflict",)},
)

# --- agents ---------------------------------------------------------------------------------------

ENROLL = Operation(
    "POST",
    "/api/v1/agent/enroll",
    "enroll",
    "Consume an enrollment token and become a node",
    "agent",
    PUBLIC,
    request="Enroll",
    answers={
        201: Answer("enrolled", ref("Enrolled")),
        200: Answer("the same agent's retry after a lost answer: the same node, replayed true", ref("Enrolled")),
    },
    refusals={
        **_AGENT_BODY,
        401: ("enrollment_token_unknown",),
        403: ("simulated_node_refused",),
        409: ("enrollment_token_consumed",),
        410: ("enrollment_token_expired", "enrollment_token_revoked"),
    },
    description="Authenticated by the enrollment token in the body; the credential and idempotency key are "
    "the agent's own, persisted before it calls. An inventory that says simulated (an agent on an NVML "
    "simulation) is refused with 403 simulated_node_refused, before anything is written (the token stays "
    "usable), unless the control plane's MODELFORGE_ALLOW_SIMULATED_NODES is true.",
)

HEARTBEAT = Operation(
    "POST",
    "/api/v1/agent/heartbeat",
    "heartbeat",
    "Report liveness, health and telemetry",
    "agent",
    NODE,
    request="Heartbeat",
    answers={200: Answer("recorded", ref("HeartbeatAnswer"))},
    refusals={**_AGENT_BODY, 409: ("heartbeat_conflict",)},
)

REPLACE_INVENTORY = Operation(
    "POST",
    "/api/v1/agent/inventory",
    "replaceInventory",
    "Replace the node's inventory",
    "agent",
    NODE,
    request="ReplaceInventory",
    answers={200: Answer("replaced", ref("InventoryAnswer"))},
    refusals={
        **_AGENT_BODY,
        403: ("simulated_node_refused",),
        409: ("inventory_conflict",),
        429: ("inventory_rate_limited",),
    },
    description="A simulated inventory is refused with 403 simulated_node_refused, before anything is written, "
    "unless the control plane's MODELFORGE_ALLOW_SIMULATED_NODES is true.",
)

# --- admin: work ----------------------------------------------------------------------------------

SUBMIT_WORK = Operation(
    "POST",
    "/api/v1/admin/work",
    "submitWork",
    "Submit work",
    "work",
    ADMIN,
    request="SubmitWork",
    answers={
        201: Answer("queued", ref("WorkItem")),
        200: Answer("a retry with the same idempotency_key and the same work: the same item", ref("WorkItem")),
    },
    refusals={400: ("invalid_input",), 409: ("idempotency_key_reused",)},
    description=f"The body may be up to {work_protocol.MAX_SUBMIT_BODY_BYTES} bytes (every other operation: "
    f'{schemas.MAX_BODY_BYTES}). `ocr` takes `{{"image_base64": <PNG or JPEG>, "detect_rotation"?: true|false}}` '
    "(`detect_rotation`, default false: turn upside-down lines before reading; for pages with turned lines only); "
    "`diagnostic.echo` any object; "
    f'`diagnostic.sleep` `{{"seconds": 0-{work_protocol.MAX_SLEEP_SECONDS}}}`.',
)

LIST_WORK = Operation(
    "GET",
    "/api/v1/admin/work",
    "listWork",
    "List work",
    "work",
    ADMIN,
    parameters=(
        *_PAGE,
        Parameter("status", "query", dict(WORK_STATUS), "only work in this state"),
        Parameter("capability", "query", portable(_SUBMIT["capability"]), "only work of this capability"),
    ),
    answers={200: Answer("a page of work items", _page_of("work", "WorkItem"))},
)

GET_WORK = Operation(
    "GET",
    "/api/v1/admin/work/{work_id}",
    "getWork",
    "Show a work item",
    "work",
    ADMIN,
    parameters=(_WORK_PARAMETER,),
    answers={200: Answer("the work item", ref("WorkItem"))},
    refusals={404: ("work_not_found",)},
)

CANCEL_WORK = Operation(
    "POST",
    "/api/v1/admin/work/{work_id}/cancel",
    "cancelWork",
    "Cancel queued or leased work",
    "work",
    ADMIN,
    request="Empty",
    body_optional=True,
    parameters=(_WORK_PARAMETER,),
    answers={200: Answer("the cancelled item", ref("WorkItem"))},
    refusals={404: ("work_not_found",), 409: ("work_finished", "work_conflict")},
)


def _work_object(part: str, operation_id: str, refusals: dict[int, tuple[str, ...]]) -> Operation:
    """``GET /api/v1/admin/work/{work_id}/<part>``: the stored bytes, for the console."""
    return Operation(
        "GET",
        f"/api/v1/admin/work/{{work_id}}/{part}",
        operation_id,
        f"Read a work item's {part}",
        "work",
        ADMIN,
        parameters=(_WORK_PARAMETER,),
        answers={200: Answer(f"the {part} document (JSON), as stored", {"type": "object"})},
        refusals={404: ("work_not_found", f"{part}_not_found"), 413: (f"{part}_too_large_to_read",), **refusals},
        description=f"The bytes of the {part} (up to 5 MiB), served by the API itself: the console cannot "
        "fetch presigned URLs (another origin). A work object expires after 30 days.",
    )


GET_WORK_INPUT = _work_object("input", "getWorkInput", {})
GET_WORK_RESULT = _work_object("result", "getWorkResult", {409: ("result_not_ready",)})

# --- the web console ------------------------------------------------------------------------------

GET_ROOT = Operation(
    "GET",
    "/",
    "getRoot",
    "The root: sent to the web console",
    "console",
    PUBLIC,
    answers={
        302: Answer(
            "sent to the console (relative Location: console/, so that a stage prefix is kept)",
            None,
            headers={**_CONSOLE_HEADERS, "Location": {"required": True, "schema": {"const": "console/"}}},
        ),
    },
)

GET_CONSOLE = Operation(
    "GET",
    "/console",
    "getConsole",
    "The web console's page",
    "console",
    PUBLIC,
    answers={
        200: Answer("the page (at /console/)", _CONSOLE_BODY, ("text/html",), _CONSOLE_HEADERS),
        308: Answer(
            "/console without its slash: sent to /console/ (relative Location: console/)",
            None,
            headers={**_CONSOLE_HEADERS, "Location": {"required": True, "schema": {"const": "console/"}}},
        ),
    },
    description="Static, served by the same function as the API; it calls the admin API of the same origin.",
)

GET_CONSOLE_FILE = Operation(
    "GET",
    "/console/{name}",
    "getConsoleFile",
    "One of the web console's files",
    "console",
    PUBLIC,
    parameters=(path_id("name", {"enum": sorted(console.ASSETS)}, "a file of the console (a fixed list)"),),
    answers={200: Answer("the file", _CONSOLE_BODY, ("text/javascript", "text/css"), _CONSOLE_HEADERS)},
    refusals={404: ("console_file_not_found",)},
)

# --- agents: work ---------------------------------------------------------------------------------

CLAIM_WORK = Operation(
    "POST",
    "/api/v1/agent/work/claim",
    "claimWork",
    "Lease the oldest claimable work item",
    "agent",
    NODE,
    request="Empty",
    body_optional=True,
    answers={200: Answer("leased to this node", ref("ClaimAnswer")), 204: Answer("nothing claimable")},
    refusals={409: ("node_not_online",)},
)

RENEW_LEASE = Operation(
    "POST",
    "/api/v1/agent/work/{work_id}/renew",
    "renewLease",
    "Extend the lease",
    "agent",
    NODE,
    request="RenewWork",
    parameters=(_WORK_PARAMETER,),
    answers={200: Answer("renewed", ref("LeaseAnswer"))},
    refusals=_LEASE_REFUSALS,
)

COMPLETE_WORK = Operation(
    "POST",
    "/api/v1/agent/work/{work_id}/complete",
    "completeWork",
    "Finish the work with its uploaded result",
    "agent",
    NODE,
    request="CompleteWork",
    parameters=(_WORK_PARAMETER,),
    answers={200: Answer("succeeded", ref("LeaseAnswer"))},
    refusals={
        **_LEASE_REFUSALS,
        409: (*_LEASE_REFUSALS[409], "result_missing", "result_checksum_mismatch"),
        413: ("result_too_large",),
    },
)

FAIL_WORK = Operation(
    "POST",
    "/api/v1/agent/work/{work_id}/fail",
    "failWork",
    "Give the work up (re-queued while attempts remain)",
    "agent",
    NODE,
    request="FailWork",
    parameters=(_WORK_PARAMETER,),
    answers={200: Answer("re-queued or dead", ref("LeaseAnswer"))},
    refusals=_LEASE_REFUSALS,
)
