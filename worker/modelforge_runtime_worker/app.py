"""What the worker's HTTP API serves, in the worker's own terms: its status, one run checked
against the protocol's ``WORKER_RUN_REQUEST`` schema (with ``gpu_uuid``: ``RUN_REQUEST``), and the
cancel of a run by the id its caller gave it (``WORKER_CANCEL_REQUEST``). Refusals are
``RunError``s; the HTTP layer (``server.py``) gives them their status codes."""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from jsonschema import Draft202012Validator
from modelforge_protocol.work import (
    WORKER_CANCEL_REQUEST,
    WORKER_FEATURE_GPU_SLOTS,
    WORKER_FEATURES,
    WORKER_RUN_REQUEST,
)

from . import WORKER_PROTOCOL_VERSION, WORKER_VERSION
from .capabilities import Capability, describe, refuse_unavailable
from .errors import InvalidInput, InvalidRequest, ShuttingDown, UnknownCapability
from .jobs import JobRunner

#: ``gpu_slots`` (modelforge_protocol.work): ``POST /v1/run`` takes a ``gpu_uuid`` (the job runs in
#: that GPU's own slot, whose process sees only that GPU: ``slots.py``), and the status's
#: ``slots.gpus`` lists the GPU slots.
FEATURES = tuple(dict.fromkeys((*WORKER_FEATURES, WORKER_FEATURE_GPU_SLOTS)))
RUN_REQUEST: dict[str, Any] = WORKER_RUN_REQUEST
_FIELDS = frozenset(RUN_REQUEST["properties"])
_RUN_REQUEST = Draft202012Validator(RUN_REQUEST)
_CANCEL_REQUEST = Draft202012Validator(WORKER_CANCEL_REQUEST)
#: How long a cancel waits for its job to unwind before it answers ``ending``.
CANCEL_WAIT_SECONDS = 1.0


class Violation(NamedTuple):
    """``path``: the field (for ``required``, the missing one); ``keyword``: the rule it breaks."""

    path: tuple[str | int, ...]
    keyword: str


def violations(request: Any, validator: Draft202012Validator = _RUN_REQUEST) -> list[Violation]:
    """Every way ``request`` breaks ``WORKER_RUN_REQUEST`` (or ``validator``'s schema), a missing
    field named by its own path."""
    found: list[Violation] = []
    for error in validator.iter_errors(request):
        path = tuple(error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            found += [
                Violation((*path, name), "required") for name in error.validator_value if name not in error.instance
            ]
        else:
            found.append(Violation(path, str(error.validator)))
    return found


class WorkerApp:
    """The capabilities and the job runner (its slots)."""

    def __init__(self, capabilities: list[Capability], jobs: JobRunner) -> None:
        self.capabilities = {capability.name: capability for capability in capabilities}
        self.jobs = jobs
        self.stopping = False
        self._requests = 0
        self._idle = threading.Condition()

    def request_started(self) -> None:
        with self._idle:
            self._requests += 1

    def request_finished(self) -> None:
        with self._idle:
            self._requests -= 1
            self._idle.notify_all()

    def wait_answered(self, timeout: float) -> bool:
        """Wait until every request being handled has been answered (idle keep-alive connections
        do not count); False after ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._requests == 0, timeout)

    def status(self) -> dict[str, Any]:
        listed = [describe(capability) for capability in self.capabilities.values()]
        return {
            "protocol_version": WORKER_PROTOCOL_VERSION,
            "worker_version": WORKER_VERSION,
            "healthy": not self.stopping and all(entry["available"] for entry in listed),
            "busy": self.jobs.busy,
            "slots": {"total": self.jobs.slots, "busy": self.jobs.slots_busy, "gpus": self.jobs.gpu_slots},
            "features": list(FEATURES),
            "capabilities": listed,
        }

    def run(self, request: Any) -> dict[str, Any]:
        """``{"result": ...}`` for a valid request, else the first refusal in this order: the
        request's shape, the capability (unknown, then unavailable), its input, the worker stopping."""
        broken = violations(request)
        _refuse_the_envelope(broken, request)
        capability = self.capabilities.get(request["capability"])
        if capability is None:
            known = ", ".join(sorted(self.capabilities))
            raise UnknownCapability(f"no capability {request['capability'][:64]!r} here; this worker runs: {known}")
        if any(violation.path[:1] == ("input",) for violation in broken):
            raise InvalidInput("input is required (a JSON object)")
        if not capability.available:
            raise refuse_unavailable(capability)
        if self.stopping:
            raise ShuttingDown("the worker is stopping")
        return {"result": self.jobs.run(capability, request["input"], request.get("job_id"), request.get("gpu_uuid"))}

    def cancel(self, request: Any) -> dict[str, Any]:
        """Stop the running job of ``request["job_id"]``: ``{"job_id", "state"}`` once it has
        unwound, or after ``CANCEL_WAIT_SECONDS`` (``ending``)."""
        broken = violations(request, _CANCEL_REQUEST)
        if any(violation.path == () and violation.keyword == "type" for violation in broken):
            raise InvalidRequest('the body must be a JSON object {"job_id": "..."}')
        if any(violation.keyword == "additionalProperties" for violation in broken):
            raise InvalidRequest(f"unknown fields: {', '.join(sorted(set(request) - {'job_id'}))}")
        if broken:
            raise InvalidRequest(_JOB_ID_RULE)
        job_id = request["job_id"]
        return {"job_id": job_id, "state": self.jobs.cancel(job_id, CANCEL_WAIT_SECONDS)}


def _refuse_the_envelope(broken: list[Violation], request: Any) -> None:
    """The request's own shape: an object, a capability name, no other fields."""
    if any(violation.path == () and violation.keyword == "type" for violation in broken):
        raise InvalidRequest('the body must be a JSON object {"capability": ..., "input": {...}}')
    if any(violation.path[:1] == ("capability",) for violation in broken):
        raise InvalidRequest("capability is required (a string)")
    if any(violation.keyword == "additionalProperties" for violation in broken):
        raise InvalidRequest(f"unknown fields: {', '.join(sorted(set(request) - _FIELDS))}")
    if any(violation.path[:1] == ("job_id",) for violation in broken):
        raise InvalidRequest(_JOB_ID_RULE)
    if any(violation.path[:1] == ("gpu_uuid",) for violation in broken):
        raise InvalidRequest(_GPU_UUID_RULE)


_JOB_ID_RULE = "job_id must be a string of 1 to 128 characters from A-Z a-z 0-9 . _ : -"
_GPU_UUID_RULE = (
    "gpu_uuid must be a GPU's UUID as NVML names it: GPU- or MIG- and 8 to 96 characters from A-Z a-z 0-9 -"
)
