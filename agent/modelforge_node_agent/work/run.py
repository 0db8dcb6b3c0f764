"""The run call: one ``POST /v1/run`` on its own thread, so the work thread can stop waiting for it
(``abort`` cuts its socket), stop the job on the worker (``cancel``, when the call has a
``job_id``: only to a worker with the ``cancel`` feature), and what its error means for the work
item (``failure``).

The worker's own answer says whether an error is ``retryable`` (``invalid_input`` is not; its
message becomes the reason). A capability this node's worker cannot serve now
(``artifact_quarantined``, ...) fails the work retryable: the work is fine, another node can run
it. A worker that cannot be reached, resets, or runs past the deadline fails it retryable too, and
so do ``invalid_request`` (the agent builds the request: never the input's fault, e.g. a worker
replaced by an older one between two status polls) and ``job_cancelled`` when this agent did not
ask for it (someone else cancelled the job on the worker).
"""

from __future__ import annotations

import threading
from typing import Any

from ..worker_client import Cutter, WorkerClient, WorkerFailure, WorkerRefused
from .claimed import Failed

#: The worker's codes that say this node cannot serve the work now: not the input's fault.
NODE_CANNOT_SERVE = frozenset(
    {"artifact_quarantined", "capability_unavailable", "unknown_capability", "invalid_request", "job_cancelled"}
)


#: The worker's answers when it has no slot for the job: every slot is taken (the agent claimed for a
#: slot it did not have), or it keeps slots for as many GPUs as it may. The node's own fault, never
#: the item's: it goes back without counting an attempt.
WORKER_BUSY = "worker_busy"
NO_SLOT = frozenset({WORKER_BUSY, "gpu_slots_full"})


class RunCall:
    def __init__(
        self,
        worker: WorkerClient,
        capability: str,
        payload: dict[str, Any],
        job_id: str | None = None,
        gpu_uuid: str | None = None,
    ) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: WorkerRefused | WorkerFailure | None = None
        #: the job's name on the worker (None: the worker cannot cancel, the call only stops waiting)
        self.job_id = job_id
        #: the GPU the job runs on (only to a worker with ``gpu_slots``)
        self.gpu_uuid = gpu_uuid
        self._worker = worker
        self._cutter = Cutter()
        self._thread = threading.Thread(
            target=self._run, args=(capability, payload), name="modelforge-work-run", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> str:
        """Stop the job on the worker (the call must have a ``job_id``): what the worker says of it
        (``ended``, ``ending``, ``not_running``); ``WorkerRefused`` or ``WorkerFailure`` when it
        could not be told. The run's own answer (409 ``job_cancelled``) comes once the job has
        unwound."""
        assert self.job_id is not None
        return self._worker.cancel(self.job_id)

    def _run(self, capability: str, payload: dict[str, Any]) -> None:
        try:
            self.result = self._worker.run(capability, payload, self._cutter, self.job_id, self.gpu_uuid)
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
            busy = error.code in NO_SLOT  # the node's own fault: the item is not to blame
            return Failed(error.message or error.code, error.retryable or node_side, error.code, node_fault=busy)
        if isinstance(error, WorkerFailure):
            return Failed(f"worker_unreachable: {error}", True, "worker_unreachable")
        return None
