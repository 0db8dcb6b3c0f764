"""The run call: one ``POST /v1/run`` on its own thread, so the work thread can stop waiting for it
(``abort`` cuts its socket), and what its error means for the work item (``failure``).

The worker's own answer says whether an error is ``retryable`` (``invalid_input`` is not; its
message becomes the reason). A capability this node's worker cannot serve now
(``artifact_quarantined``, ...) fails the work retryable: the work is fine, another node can run
it. A worker that cannot be reached, resets, or runs past the deadline fails it retryable too.
"""

from __future__ import annotations

import threading
from typing import Any

from ..worker_client import Cutter, WorkerClient, WorkerFailure, WorkerRefused
from .claimed import Failed

#: The worker's codes that say this node cannot serve the capability now: not the input's fault.
NODE_CANNOT_SERVE = frozenset({"artifact_quarantined", "capability_unavailable", "unknown_capability"})


class RunCall:
    def __init__(self, worker: WorkerClient, capability: str, payload: dict[str, Any]) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: WorkerRefused | WorkerFailure | None = None
        self._cutter = Cutter()
        self._thread = threading.Thread(
            target=self._run, args=(worker, capability, payload), name="modelforge-work-run", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self, worker: WorkerClient, capability: str, payload: dict[str, Any]) -> None:
        try:
            self.result = worker.run(capability, payload, self._cutter)
        except (WorkerRefused, WorkerFailure) as error:
            self.error = error
        except Exception as error:  # noqa: BLE001 - reported as a worker failure, retryable
            self.error = WorkerFailure(type(error).__name__)
        finally:
            self.done.set()

    def abort(self) -> None:
        self._cutter.cut("aborted")

    def failure(self) -> Failed | None:
        """How the work is failed after the call ended in an error; None when it gave a result."""
        error = self.error
        if isinstance(error, WorkerRefused):
            node_side = error.code in NODE_CANNOT_SERVE
            return Failed(error.message or error.code, error.retryable or node_side, error.code)
        if isinstance(error, WorkerFailure):
            return Failed(f"worker_unreachable: {error}", True, "worker_unreachable")
        return None
