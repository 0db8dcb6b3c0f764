"""The work queue's wire contract: capabilities, limits and the schemas of work requests and answers.

Shared by the control plane (validates submissions and lease calls), the node agent (validates the
claim answer, speaks to the worker) and the runtime worker (validates its own inputs). Plain data,
no dependencies, like ``schemas``.
"""

from __future__ import annotations

from typing import Any

from .schemas import GPU_UUID_PATTERN, MAX_CAPABILITIES, MAX_SLOTS, _answer, _obj

#: What work can ask for. A node serves a capability when its inventory lists the name (the agent
#: adds the ones its runtime worker reports available).
OCR = "ocr"
ECHO = "diagnostic.echo"
#: Holds a worker slot on purpose for ``seconds`` (tests, benches); bounded by the job timeout and
#: cancellable like any job.
SLEEP = "diagnostic.sleep"
CAPABILITIES = (OCR, ECHO, SLEEP)
#: ``diagnostic.sleep``'s longest sleep.
MAX_SLEEP_SECONDS = 300

WORK_STATES = ("queued", "leased", "succeeded", "dead", "cancelled")
#: States a work item never leaves.
FINAL_STATES = ("succeeded", "dead", "cancelled")

MIN_ATTEMPTS, MAX_ATTEMPTS, DEFAULT_ATTEMPTS = 1, 10, 3
MIN_LEASE_SECONDS, MAX_LEASE_SECONDS, DEFAULT_LEASE_SECONDS = 10, 3600, 60

#: Largest submit body. API Gateway (REST) accepts 10 MB and Lambda 6 MB per synchronous
#: invocation, event envelope included; 5 MiB of JSON leaves room for the envelope, and base64
#: makes that about 3.7 MiB of image.
MAX_SUBMIT_BODY_BYTES = 5 * 1024 * 1024
#: Deepest nesting of arrays and objects in a work input or result document.
MAX_INPUT_DEPTH = 64
#: Largest result object the control plane accepts at completion (it reads the object to check it).
MAX_RESULT_BYTES = 16 * 1024 * 1024
#: Longest failure reason kept per attempt.
MAX_REASON_CHARS = 1024

WORK_ID_PATTERN = r"^work_[0-9a-f]{32}\Z"
_SHA256 = {"type": "string", "pattern": r"^[0-9a-f]{64}\Z"}
_EPOCH = {"type": "integer", "minimum": 1, "maximum": 2**53}
_CAPABILITY = {"enum": list(CAPABILITIES)}

#: Input of each capability (the control plane also checks an ``ocr`` image's base64 and type).
#: ``ocr``'s ``detect_rotation`` (default false) runs the text-line orientation classifier, for
#: pages with turned lines: on upright pages it turns some lines over and they are misread.
INPUTS: dict[str, dict[str, Any]] = {
    OCR: _obj(
        {
            "image_base64": {"type": "string", "minLength": 1, "maxLength": MAX_SUBMIT_BODY_BYTES},
            "detect_rotation": {"type": "boolean"},
        },
        ["image_base64"],
    ),
    ECHO: {"type": "object", "maxProperties": 64},
    SLEEP: _obj({"seconds": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS}}, ["seconds"]),
}

SUBMIT_WORK = _obj(
    {
        "capability": _CAPABILITY,
        "input": {"type": "object"},
        "max_attempts": {"type": "integer", "minimum": MIN_ATTEMPTS, "maximum": MAX_ATTEMPTS},
        "lease_seconds": {"type": "integer", "minimum": MIN_LEASE_SECONDS, "maximum": MAX_LEASE_SECONDS},
        "idempotency_key": {"type": "string", "minLength": 8, "maxLength": 128, "pattern": r"^[A-Za-z0-9._:-]+\Z"},
    },
    ["capability", "input"],
)

RENEW_WORK = _obj({"epoch": _EPOCH}, ["epoch"])
COMPLETE_WORK = _obj(
    {"epoch": _EPOCH, "sha256": _SHA256, "size": {"type": "integer", "minimum": 0, "maximum": MAX_RESULT_BYTES}},
    ["epoch", "sha256", "size"],
)
#: ``node_fault`` (only to a control plane that lists the ``node_fault`` feature): the node failed,
#: not the item (its worker was busy, say): the item goes back without counting the attempt.
FAIL_WORK = _obj(
    {
        "epoch": _EPOCH,
        "reason": {"type": "string", "minLength": 1, "maxLength": MAX_REASON_CHARS},
        "retryable": {"type": "boolean"},
        "node_fault": {"type": "boolean"},
    },
    ["epoch", "reason", "retryable"],
)

#: What the agent reads from a 200 claim answer (presigned URLs are checked again before use).
_URL = {"type": "string", "minLength": 8, "maxLength": 8192, "pattern": r"^https?://[^\s]+\Z"}
CLAIM_ANSWER = _answer(
    {
        "work_id": {"type": "string", "pattern": WORK_ID_PATTERN},
        "capability": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9._:/-]{0,63}\Z"},
        "epoch": _EPOCH,
        "lease_seconds": {"type": "integer", "minimum": MIN_LEASE_SECONDS, "maximum": MAX_LEASE_SECONDS},
        "lease_expires_at": {"type": "string", "maxLength": 64},
        "input_url": _URL,
        "result_upload_url": _URL,
    },
    ["work_id", "capability", "epoch", "lease_seconds", "input_url", "result_upload_url"],
)
#: Answer of renew, complete and fail.
LEASE_ANSWER = _answer(
    {"work_id": {"type": "string", "pattern": WORK_ID_PATTERN}, "status": {"enum": list(WORK_STATES)}}, ["status"]
)

# --- what the runtime worker answers the node agent (its local HTTP API) ------------------------
#
# The agent reads these over a unix socket or a loopback port and validates them like the control
# plane's answers: open objects (the worker may add fields), every field the agent reads typed and
# bounded. The worker's protocol_version is judged separately (``versions.verdict`` with
# ``Component.WORKER``), before this schema, so any type passes here.

WORKER_DEVICES = ("cpu", "cuda")
_WORKER_CAPABILITY_NAME = {"type": "string", "pattern": r"^[a-z0-9][a-z0-9._:/-]{0,63}\Z"}
#: Why a capability is unavailable (``artifact_quarantined``, ``model_load_failed``, ...).
_WORKER_REASON = {"type": "string", "pattern": r"^[a-z0-9_]{1,64}\Z"}

#: What a worker that advertises it in ``GET /v1/status`` ``features`` can do beyond running jobs:
#: ``cancel``: ``POST /v1/run`` takes a ``job_id`` and ``POST /v1/cancel`` stops that job. An agent
#: sends ``job_id`` or calls cancel only to a worker that lists ``cancel`` (an older worker refuses the
#: unknown field: its request schema is closed).
WORKER_FEATURE_CANCEL = "cancel"
#: ``slots``: the worker runs up to ``slots.total`` jobs at once, each in its own process, and says
#: in its status how many are taken (``slots.busy``).
WORKER_FEATURE_SLOTS = "slots"
#: ``gpu_slots``: ``POST /v1/run`` takes a ``gpu_uuid``, and the job runs in that GPU's own slot (a
#: process started with ``CUDA_VISIBLE_DEVICES=<uuid>``). An agent sends ``gpu_uuid`` only to a
#: worker that lists it.
WORKER_FEATURE_GPU_SLOTS = "gpu_slots"
WORKER_FEATURES = (WORKER_FEATURE_CANCEL, WORKER_FEATURE_SLOTS)
#: The most job slots a worker runs: the bound of a node's slots in its heartbeat, since a node's
#: slots are its worker's (schemas.SLOTS_REPORT).
MAX_WORKER_SLOTS = MAX_SLOTS
#: A job's name, chosen by the agent (``<work_id>:<epoch>``): unique per claim.
WORKER_JOB_ID = {"type": "string", "pattern": r"^[A-Za-z0-9._:-]{1,128}\Z"}
#: What ``POST /v1/cancel`` says of the job: ``ended`` (it was running and has unwound: the worker
#: is free), ``ending`` (aborted, still unwinding after the cancel's wait: its run answers once it
#: has), ``not_running`` (no job of that id runs; a run that arrives later with it is refused).
WORKER_CANCEL_STATES = ("ended", "ending", "not_running")

#: ``POST /v1/run`` (what the agent asks its worker): the capability to run, its input and, to a
#: worker with the ``cancel`` feature, the job's id.
WORKER_RUN_REQUEST = _obj(
    {
        "capability": {"type": "string", "minLength": 1},
        "input": {"type": "object"},
        "job_id": WORKER_JOB_ID,
        #: the GPU the job runs on (``gpu_slots``): its NVML UUID, never an index
        "gpu_uuid": {"type": "string", "pattern": GPU_UUID_PATTERN},
    },
    ["capability", "input"],
)
#: ``POST /v1/cancel``: stop the job of this id.
WORKER_CANCEL_REQUEST = _obj({"job_id": WORKER_JOB_ID}, ["job_id"])

#: ``GET /v1/status``.
WORKER_STATUS = _answer(
    {
        "protocol_version": {},
        "worker_version": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[0-9A-Za-z.+_-]+\Z"},
        "healthy": {"type": "boolean"},
        "busy": {"type": "boolean"},
        "slots": _answer(
            {
                "total": {"type": "integer", "minimum": 1, "maximum": MAX_WORKER_SLOTS},
                "busy": {"type": "integer", "minimum": 0, "maximum": MAX_WORKER_SLOTS},
            },
            ["total", "busy"],
        ),
        "features": {
            "type": "array",
            "maxItems": 32,
            "items": {"type": "string", "pattern": r"^[a-z0-9][a-z0-9._-]{0,63}\Z"},
        },
        "capabilities": {
            "type": "array",
            "maxItems": MAX_CAPABILITIES,
            "items": _answer(
                {
                    "name": _WORKER_CAPABILITY_NAME,
                    "model": {"type": "string", "maxLength": 256},
                    "model_sha256": {"anyOf": [{"type": "null"}, _SHA256]},
                    "device": {"enum": list(WORKER_DEVICES)},
                    "available": {"type": "boolean"},
                    "reason": {"anyOf": [{"type": "null"}, _WORKER_REASON]},
                },
                ["name", "device", "available"],
            ),
        },
    },
    ["protocol_version", "worker_version", "healthy", "capabilities"],
)

#: ``POST /v1/run``: ``{"result": {...}}`` with 200, else ``{"error": {"code", "message", "retryable"}}``
#: (``retryable``: whether the same input may succeed later; ``message`` is cut to
#: ``MAX_REASON_CHARS`` by the agent, which hands it on as the failure reason).
WORKER_RUN_ANSWER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "result": {"type": "object"},
        "error": _answer(
            {
                "code": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,63}\Z"},
                "message": {"type": "string"},
                "retryable": {"type": "boolean"},
            },
            ["code", "retryable"],
        ),
    },
    "oneOf": [{"required": ["result"]}, {"required": ["error"]}],
}

#: ``POST /v1/cancel``'s 200 answer.
WORKER_CANCEL_ANSWER = _answer(
    {"job_id": WORKER_JOB_ID, "state": {"enum": list(WORKER_CANCEL_STATES)}}, ["job_id", "state"]
)
