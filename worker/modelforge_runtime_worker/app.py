"""What the worker's HTTP API serves, in the worker's own terms: its status, and one run checked
against the protocol's ``WORKER_RUN_REQUEST`` schema. Refusals are ``RunError``s; the HTTP layer
(``server.py``) gives them their status codes."""

from __future__ import annotations

import threading
from typing import Any

from modelforge_protocol.schema_check import Violation, violations
from modelforge_protocol.work import WORKER_RUN_REQUEST

from . import WORKER_PROTOCOL_VERSION, WORKER_VERSION
from .capabilities import Capability, describe, refuse_unavailable
from .errors import InvalidInput, InvalidRequest, ShuttingDown, UnknownCapability
from .jobs import JobRunner

_FIELDS = frozenset(WORKER_RUN_REQUEST["properties"])


class WorkerApp:
    """The capabilities and the one job runner."""

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
            "capabilities": listed,
        }

    def run(self, request: Any) -> dict[str, Any]:
        """``{"result": ...}`` for a valid request, else the first refusal in this order: the
        request's shape, the capability (unknown, then unavailable), its input, the worker stopping."""
        broken = violations(WORKER_RUN_REQUEST, request)
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
        return {"result": self.jobs.run(capability, request["input"])}


def _refuse_the_envelope(broken: list[Violation], request: Any) -> None:
    """The request's own shape: an object, a capability name, no other fields."""
    if any(violation.path == () and violation.keyword == "type" for violation in broken):
        raise InvalidRequest('the body must be a JSON object {"capability": ..., "input": {...}}')
    if any(violation.path[:1] == ("capability",) for violation in broken):
        raise InvalidRequest("capability is required (a string)")
    if any(violation.keyword == "additionalProperties" for violation in broken):
        raise InvalidRequest(f"unknown fields: {', '.join(sorted(set(request) - _FIELDS))}")
