"""Wire schemas (JSON Schema, draft 2020-12) and limits that both sides must agree on.

The schemas are plain data so that this package stays dependency-free; the control plane
validates with ``jsonschema``. Patterns end in ``\\Z`` (Python's end of string): ``$`` would also
accept a trailing newline. Every request object refuses unknown fields; the answers the agent
reads (at the end) accept them, for forward compatibility.
"""

from __future__ import annotations

from typing import Any

#: Largest request body any endpoint accepts.
MAX_BODY_BYTES = 64 * 1024
#: Deepest nesting of arrays and objects in a request body: a work submission's input may nest
#: ``work.MAX_INPUT_DEPTH`` (64) levels inside the body's own object.
MAX_BODY_DEPTH = 65
MAX_GPUS = 64
MAX_CAPABILITIES = 64
MIN_ENROLLMENT_TTL_SECONDS = 60
MAX_ENROLLMENT_TTL_SECONDS = 86400
#: The expiries the console offers; the API accepts any value in the range above.
CONSOLE_ENROLLMENT_TTLS = (300, 900, 3600, 86400)
ACCELERATOR_MODES = ("nvidia", "cpu", "auto")
#: A node's hostname, as the agent reports it at enrollment (and as the console's settings check takes it).
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z"
HEALTH_STATES = ("ok", "degraded", "unhealthy")
GPU_UUID_PATTERN = r"^(GPU|MIG)-[0-9A-Za-z-]{8,96}\Z"

_U64 = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_SHORT_TEXT = {"type": "string", "minLength": 1, "maxLength": 128}
_VERSION_TEXT = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[0-9A-Za-z.+_-]+\Z"}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


GPU_INVENTORY = _obj(
    {
        "index": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS - 1},
        "uuid": {"type": "string", "pattern": GPU_UUID_PATTERN},
        "name": _SHORT_TEXT,
        "memory_total_bytes": _U64,
        "driver_version": _VERSION_TEXT,
        "cuda_version": _VERSION_TEXT,
    },
    ["index", "uuid", "name", "memory_total_bytes", "driver_version", "cuda_version"],
)

INVENTORY = _obj(
    {
        "gpus": {"type": "array", "items": GPU_INVENTORY, "maxItems": MAX_GPUS},
        "capabilities": {
            "type": "array",
            "maxItems": MAX_CAPABILITIES,
            "uniqueItems": True,
            "items": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9._:/-]{0,63}\Z"},
        },
        "cpu": _obj(
            {"model": _SHORT_TEXT, "logical_cores": {"type": "integer", "minimum": 1, "maximum": 4096}},
            ["model", "logical_cores"],
        ),
        "memory_total_bytes": _U64,
        #: present (and true) only on an agent running against a scripted NVML fake
        #: (the agent's NVML simulation): its GPUs are not real
        "simulated": {"const": True},
    },
    ["gpus", "capabilities", "cpu", "memory_total_bytes"],
)

#: Every field of one GPU's telemetry, in the order the control plane stores them as a row.
GPU_TELEMETRY_FIELDS = (
    "index",
    "utilization_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
)

GPU_TELEMETRY = _obj(
    {
        "index": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS - 1},
        "utilization_percent": {"type": "number", "minimum": 0, "maximum": 100},
        "memory_used_bytes": _U64,
        "memory_total_bytes": _U64,
        "temperature_celsius": {"type": "number", "minimum": -50, "maximum": 200},
        "power_watts": {"type": "number", "minimum": 0, "maximum": 100000},
    },
    list(GPU_TELEMETRY_FIELDS),
)

#: What the agent knows of its runtime worker (absent: the agent has no worker configured).
WORKER_STATES = ("ok", "degraded", "unreachable", "incompatible")
WORKER_HEALTH = _obj(
    {
        "status": {"enum": list(WORKER_STATES)},
        "detail": {"type": "string", "maxLength": 512},
        #: capabilities the worker has but cannot run, and why (``artifact_quarantined``)
        "unavailable": {
            "type": "array",
            "maxItems": MAX_CAPABILITIES,
            "items": _obj(
                {
                    "name": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9._:/-]{0,63}\Z"},
                    "reason": {"type": "string", "pattern": r"^[a-z0-9_]{1,64}\Z"},
                },
                ["name", "reason"],
            ),
        },
    },
    ["status"],
)

HEALTH = _obj(
    {
        "status": {"enum": list(HEALTH_STATES)},
        "detail": {"type": "string", "maxLength": 512},
        "worker": WORKER_HEALTH,
    },
    ["status"],
)

#: protocol_version is judged separately (verdict) before the schema, so any type passes here.
_PROTOCOL_VERSION: dict[str, Any] = {}

CREATE_ENROLLMENT = _obj(
    {
        "display_name": {"type": "string", "minLength": 1, "maxLength": 128},
        "expires_in_seconds": {
            "type": "integer",
            "minimum": MIN_ENROLLMENT_TTL_SECONDS,
            "maximum": MAX_ENROLLMENT_TTL_SECONDS,
        },
        "production_eligible": {"type": "boolean"},
    },
    ["display_name", "expires_in_seconds"],
)

ENROLL = _obj(
    {
        "token": {"type": "string", "maxLength": 256},
        "idempotency_key": {"type": "string", "maxLength": 256},
        "credential": {"type": "string", "maxLength": 256},
        "hostname": {"type": "string", "pattern": HOSTNAME_PATTERN},
        "agent_version": _VERSION_TEXT,
        "protocol_version": _PROTOCOL_VERSION,
        "accelerator_mode": {"enum": list(ACCELERATOR_MODES)},
        "inventory": INVENTORY,
    },
    [
        "token",
        "idempotency_key",
        "credential",
        "hostname",
        "agent_version",
        "protocol_version",
        "accelerator_mode",
        "inventory",
    ],
)

#: Image sources of a node's agent settings: the release bundle's tag, a registry image by digest, or
#: no container (the agent process from a checkout or installed wheels: development, bare metal).
IMAGE_SOURCES = ("release_bundle", "registry", "no_container")
#: The largest pasted release manifest entry the settings check reads.
MAX_MANIFEST_ENTRY_CHARS = 32 * 1024

#: The console's Enroll node wizard: the node's non-secret agent settings, to check and render.
#: Only the types are checked here; what is missing or wrong is the answer's ``problems``.
NODE_AGENT_SETTINGS = _obj(
    {
        "control_plane_url": {"type": "string", "maxLength": 2048},
        "hostname": {"type": "string", "maxLength": 253},
        "accelerator_mode": {"enum": list(ACCELERATOR_MODES)},
        "state_volume": {"type": "string", "maxLength": 4096},
        "image_source": {"enum": list(IMAGE_SOURCES)},
        "manifest_entry": {"type": "string", "maxLength": MAX_MANIFEST_ENTRY_CHARS},
        "image_reference": {"type": "string", "maxLength": 1024},
    },
    ["control_plane_url", "hostname", "accelerator_mode", "state_volume", "image_source"],
)

#: The push channel's states as the agent reports them (issue 19): ``off`` by its setting,
#: ``fallback`` when the channel could not be opened (the reason says why).
PUSH_CHANNEL_STATES = ("connected", "connecting", "fallback", "off")
MAX_PUSH_CHANNEL_REASON_CHARS = 200
#: The heartbeat's optional report of the agent's push channel: sent only when the control plane
#: advertises the ``push_channel`` feature (older control planes refuse unknown fields).
PUSH_CHANNEL_REPORT = _obj(
    {
        "state": {"enum": list(PUSH_CHANNEL_STATES)},
        "reason": {"type": "string", "maxLength": MAX_PUSH_CHANNEL_REASON_CHARS, "pattern": r"^[^\x00-\x1f\x7f]*\Z"},
        "need_ticket": {"type": "boolean"},
    },
    ["state", "need_ticket"],
)

#: A heartbeat's job slots (only to a control plane that lists the ``slots`` feature): how many the
#: node has, how many run a job, and how many it may use now (on schedulable GPUs; in ``cpu``
#: mode, all). ``busy`` and ``schedulable`` are at most ``total``.
MAX_SLOTS = 64
_SLOT_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_SLOTS}
SLOTS_REPORT = _obj(
    {"total": {"type": "integer", "minimum": 1, "maximum": MAX_SLOTS}, "busy": _SLOT_COUNT, "schedulable": _SLOT_COUNT},
    ["total", "busy", "schedulable"],
)

#: Per-GPU health (issue 20). A GPU's state is the worst of its reasons; ``unknown`` means its health
#: signals are not supported (a consumer GPU) or not decided (MIG), never that it is unhealthy.
GPU_HEALTH_STATES = ("healthy", "degraded", "unschedulable", "failed", "unknown")
#: The states whose GPUs take work (a slot each).
SCHEDULABLE_GPU_STATES = ("healthy", "degraded", "unknown")
#: What NVIDIA recommends doing about a reason (the Xid catalogue's "immediate action").
GPU_ACTIONS = ("none", "restart_app", "drain_p2p", "drain_and_reset", "reset_gpu", "reboot", "rma", "unknown")
MAX_GPU_REASONS = 8
GPU_REASON_CODE_PATTERN = r"^[a-z][a-z0-9_]{0,39}\Z"
#: A UTC time to the second, as the agent's clock read it: 2026-12-02T10:00:00Z
UTC_SECOND_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z"
#: The kernel's boot id (/proc/sys/kernel/random/boot_id): a hard fault is latched per GPU and boot.
BOOT_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z"
#: One agent process: random per process start (``secrets.token_hex(16)``). Heartbeats of one node
#: from two instances in turn mean two agents on one identity (a cloned disk or state volume).
AGENT_INSTANCE_ID_PATTERN = r"^[0-9a-f]{32}\Z"
GPU_REASON = _obj(
    {
        "code": {"type": "string", "pattern": GPU_REASON_CODE_PATTERN},
        "action": {"enum": list(GPU_ACTIONS)},
        "since": {"type": "string", "pattern": UTC_SECOND_PATTERN},
        "xid": {"type": "integer", "minimum": 0, "maximum": 65535},
        #: the raw value behind the reason where it has one (an unknown recovery action, a count)
        "value": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    },
    ["code", "action", "since"],
)
GPU_HEALTH = _obj(
    {
        "uuid": {"type": "string", "pattern": GPU_UUID_PATTERN},
        "state": {"enum": list(GPU_HEALTH_STATES)},
        "reasons": {"type": "array", "items": GPU_REASON, "maxItems": MAX_GPU_REASONS},
    },
    ["uuid", "state", "reasons"],
)
#: The heartbeat's per-GPU health, sent when it changed (and on an agent's first heartbeat).
GPU_HEALTH_REPORT = _obj(
    {"gpus": {"type": "array", "items": GPU_HEALTH, "maxItems": MAX_GPUS}},
    ["gpus"],
)

HEARTBEAT = _obj(
    {
        "protocol_version": _PROTOCOL_VERSION,
        "agent_version": _VERSION_TEXT,
        "health": HEALTH,
        "telemetry": _obj(
            {"gpus": {"type": "array", "items": GPU_TELEMETRY, "maxItems": MAX_GPUS}},
            ["gpus"],
        ),
        "push_channel": PUSH_CHANNEL_REPORT,
        "slots": SLOTS_REPORT,
        "boot_id": {"type": "string", "pattern": BOOT_ID_PATTERN},
        "gpu_health": GPU_HEALTH_REPORT,
        "agent_instance_id": {"type": "string", "pattern": AGENT_INSTANCE_ID_PATTERN},
    },
    ["protocol_version", "agent_version", "health", "telemetry"],
)

REPLACE_INVENTORY = _obj(
    {"protocol_version": _PROTOCOL_VERSION, "inventory": INVENTORY},
    ["protocol_version", "inventory"],
)

#: An empty JSON object (or no body) for action endpoints such as revoke.
EMPTY = _obj({}, [])

#: An admin's drain or undrain: the whole node, or one of its GPUs (by UUID).
DRAIN = _obj({"gpu_uuid": {"type": "string", "pattern": GPU_UUID_PATTERN}}, [])


# --- answers the control plane gives the agent ---------------------------------------------------
#
# The agent validates every answer before it uses any of it. Answers may carry more fields than
# listed (the control plane can add some without breaking older agents), but every field the
# agent reads is typed and bounded here.

#: Largest answer body the agent reads; a bigger one is a malformed answer.
MAX_ANSWER_BYTES = 256 * 1024
#: Deepest nesting of arrays and objects the agent parses in an answer.
MAX_ANSWER_DEPTH = 32
#: The heartbeat interval the control plane asks for is clamped to this range by the agent.
MIN_ANSWER_INTERVAL_SECONDS = 1
MAX_ANSWER_INTERVAL_SECONDS = 3600
#: A 429's Retry-After is clamped to this range by the agent.
MIN_RETRY_AFTER_SECONDS = 1
MAX_RETRY_AFTER_SECONDS = 3600
NODE_ID_PATTERN = r"^node_[0-9a-f]{32}\Z"

#: One line of printable text: no control characters (they could forge log lines or terminals).
_ANSWER_TEXT = {"type": "string", "maxLength": 1024, "pattern": r"^[^\x00-\x1f\x7f]*\Z"}
_NODE_ID = {"type": "string", "pattern": NODE_ID_PATTERN}
#: JSON number, never a boolean; the agent clamps it (the parser refuses NaN and infinities).
_SECONDS = {"type": "number"}


def _answer(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """Like ``_obj`` but open: unknown fields are allowed for forward compatibility."""
    return {"type": "object", "properties": properties, "required": required}


#: What the control plane can do beyond protocol 1's base: the answers' ``features``. An agent sends
#: a request field a feature introduces only when the control plane lists that feature.
FEATURE_PUSH_CHANNEL = "push_channel"
#: ``node_fault`` in a fail request: the node failed, not the item (work.FAIL_WORK).
FEATURE_NODE_FAULT = "node_fault"
#: ``slots`` in a heartbeat: the node's job slots (SLOTS_REPORT).
FEATURE_SLOTS = "slots"
#: ``boot_id`` and ``gpu_health`` in a heartbeat; the answer's ``drained``, ``blocked_gpus`` and
#: ``recheck_gpus``.
FEATURE_GPU_HEALTH = "gpu_health"
#: ``agent_instance_id`` in a heartbeat (AGENT_INSTANCE_ID_PATTERN).
FEATURE_AGENT_INSTANCE = "agent_instance"
#: Why the control plane keeps a GPU from work: a latched hard fault, or an admin's drain.
GPU_BLOCK_REASONS = ("latched", "drained")
#: Channel tickets live this long (never more than 600 s: the issue's bound).
CHANNEL_TICKET_SECONDS = 300
CHANNEL_TICKET_PREFIX = "mfct_"
CHANNEL_TICKET_PATTERN = r"^mfct_[A-Za-z0-9_-]{43}\Z"
_FEATURES = {
    "type": "array",
    "maxItems": 64,
    "items": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,63}\Z"},
}
#: The push channel's address and a single-use ticket for it (enroll answer; heartbeat answer when asked).
CHANNEL = _answer(
    {
        "url": {"type": "string", "minLength": 1, "maxLength": 2048, "pattern": r"^wss?://[^\x00-\x20\x7f]+\Z"},
        "ticket": {"type": "string", "pattern": CHANNEL_TICKET_PATTERN},
        "expires_at": {"type": "string", "maxLength": 64, "pattern": r"^[0-9T:.+Z-]+\Z"},
    },
    ["url", "ticket", "expires_at"],
)

ENROLL_ANSWER = _answer(
    {
        "node_id": _NODE_ID,
        "heartbeat_interval_seconds": _SECONDS,
        "replayed": {"type": "boolean"},
        "features": _FEATURES,
        "channel": CHANNEL,
    },
    ["node_id"],
)

HEARTBEAT_ANSWER = _answer(
    {
        "node_id": _NODE_ID,
        "status": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,31}\Z"},
        "heartbeat_interval_seconds": _SECONDS,
        "work_waiting": {"type": "boolean"},
        "features": _FEATURES,
        "channel": CHANNEL,
        #: an admin drained the node: claim nothing new, finish what runs
        "drained": {"type": "boolean"},
        #: GPUs the control plane keeps from work, whatever the agent's own grade
        "blocked_gpus": {
            "type": "array",
            "maxItems": MAX_GPUS,
            "items": _answer(
                {
                    "uuid": {"type": "string", "pattern": GPU_UUID_PATTERN},
                    "reason": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,31}\Z"},
                },
                ["uuid", "reason"],
            ),
        },
        #: GPUs whose latched fault an admin cleared: re-check each before it takes work again
        "recheck_gpus": {
            "type": "array",
            "maxItems": MAX_GPUS,
            "items": {"type": "string", "pattern": GPU_UUID_PATTERN},
        },
    },
    ["status"],
)

INVENTORY_ANSWER = _answer({"node_id": _NODE_ID}, [])

ERROR_ANSWER = _answer(
    {
        "error": _answer(
            {
                "code": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,63}\Z"},
                "message": {"type": "string"},  # never read by the agent
                "verdict": {"type": "string", "pattern": r"^[A-Z][A-Z0-9_]{0,31}\Z"},
                "next_step": _ANSWER_TEXT,
                "retry_after_seconds": _SECONDS,
            },
            ["code"],
        )
    },
    ["error"],
)


# --- the push channel's messages (JSON text frames, both ways) ------------------------------------

#: The one message version; a receiver ignores any other (one debug log line).
CHANNEL_MESSAGE_VERSION = 1
#: Largest channel message either side sends or reads (API Gateway allows 32 KB frames).
MAX_CHANNEL_MESSAGE_BYTES = 1024
#: server -> agent: claim now (a hint) / renew this work now (a hint: only the renewal's 409 stops it)
CHANNEL_WAKE = "wake"
CHANNEL_CANCEL = "cancel"
#: agent -> server, every CHANNEL_PING_SECONDS (API Gateway closes a connection idle for 10 minutes)
CHANNEL_PING = "ping"
CHANNEL_PING_SECONDS = 300
