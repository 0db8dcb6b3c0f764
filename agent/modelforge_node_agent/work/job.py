"""One job, from its claim to its settling: keep the lease (``LeaseKeeper``), fetch the input
with a presigned GET, run it on the worker (``RunCall``), upload the result's canonical JSON with
a presigned PUT, then complete the work with that upload's SHA-256 and size, or fail it
(``Settler``); one ``work_finished`` line says how it ended.

A lease lost while the job runs (a renewal answered 409 ``work_cancelled`` or ``lease_lost``)
ends it at once: a worker with the ``cancel`` feature is told to stop the job (the run was given
the job id ``<work_id>:<epoch>``), the run is no longer waited for (``abandoned``: the next claim
waits until the worker has finished it, which a cancelled job does as soon as it has unwound),
nothing is uploaded and nothing is failed. A stop while it runs fails it retryable, if that can be
said at once, and tells the worker to stop the job on the side. ``renew_now`` asks the lease keeper
to renew at once (a channel's ``cancel`` hint).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelforge_protocol import work
from modelforge_protocol.canonical import canonical_bytes

from .. import answers
from ..answers import MalformedAnswer
from ..control_plane import COMPLETE, FAIL, ControlPlaneClient
from ..identity import Identity
from ..worker_client import WorkerClient, WorkerFailure, WorkerRefused
from .claimed import Done, Failed, Interrupted, Lease
from .lease_keeper import LeaseKeeper
from .run import RunCall
from .settle import Settler
from .signals import Signals
from .timing import Timing
from .transfers import PresignedObjects, TransferFailed
from .worker_view import WorkerView

log = logging.getLogger("modelforge.agent")

#: The input's nesting limit (the worker's own).
MAX_INPUT_DEPTH = 64
#: Completion refusals that say the upload was not found as sent: the work is failed retryable.
UPLOAD_NOT_FOUND = frozenset({"result_missing", "result_checksum_mismatch"})
STOPPING = Failed("agent_stopping: the node agent stopped before the work finished", True, "agent_stopping")


@dataclass(frozen=True)
class Station:
    """What every job of one work loop uses."""

    client: ControlPlaneClient
    worker: WorkerClient
    objects: PresignedObjects
    view: WorkerView
    signals: Signals
    timing: Timing
    renew_interval: Callable[[float], float]
    poll_seconds: float
    #: the GPUs that faulted (a job running on one is stopped and failed as the node's fault)
    gpu_faults: Callable[[], set[str]] = set


class Job:
    def __init__(self, station: Station, lease: Lease, identity: Identity, gpu_uuid: str | None = None) -> None:
        self._station, self._lease = station, lease
        #: the GPU whose slot runs the job (None: a worker slot not tied to a GPU)
        self._gpu_uuid = gpu_uuid
        interval = max(0.01, station.renew_interval(lease.lease_seconds))
        self._keeper = LeaseKeeper(station.client, identity, lease, interval, station.signals, station.timing)
        self._settler = Settler(station.client, identity, station.signals, station.timing)
        #: how the job ended (``succeeded``, ``failed``, ``lease_lost``, ...), once it has
        self.outcome: str | None = None
        #: a run the job stopped waiting for when its lease was lost (the worker may still be on it)
        self.abandoned: RunCall | None = None

    @property
    def work_id(self) -> str:
        return self._lease.work_id

    def renew_now(self) -> None:
        """Renew the lease at once (from any thread); a 409 then stops the job."""
        self._keeper.renew_now()

    def run(self) -> bool:
        """Run the job to its end; whether to keep draining."""
        started = self._station.timing.clock()
        self._keeper.start()
        try:
            outcome: Done | Failed | None = self._execute()
        except Interrupted:
            outcome = None
        finally:
            self._keeper.stop()
        return self._settle(outcome, started)

    # --- running -----------------------------------------------------------------------------

    def _interrupted(self) -> bool:
        return self._keeper.lost.is_set() or self._station.signals.stopping()

    def _execute(self) -> Done | Failed:
        lease, station = self._lease, self._station
        if not station.view.offers(lease.capability):
            station.view.mark_stale()
            return Failed(
                f"capability_unavailable: this node's runtime worker cannot run {lease.capability} now",
                True,
                "capability_unavailable",
            )
        payload = self._input()
        if isinstance(payload, Failed):
            return payload
        result = self._run(payload)
        if isinstance(result, Failed):
            return result
        return self._upload(canonical_bytes(result))  # as the control plane writes the input

    def _input(self) -> dict[str, Any] | Failed:
        try:
            raw = self._station.objects.get(self._lease.input_url, "input", work.MAX_SUBMIT_BODY_BYTES)
        except TransferFailed as failed:
            return Failed(f"input_download_failed: {failed.reason}", failed.retryable, "input_download_failed")
        if self._interrupted():
            raise Interrupted()
        try:
            payload = answers.parse(raw, max_bytes=work.MAX_SUBMIT_BODY_BYTES, max_depth=MAX_INPUT_DEPTH)
        except MalformedAnswer as malformed:
            return Failed(
                f"invalid_input: the input document is not usable JSON ({malformed.reason})", False, "invalid_input"
            )
        if not isinstance(payload, dict):
            return Failed("invalid_input: the input document is not a JSON object", False, "invalid_input")
        return payload

    def _run(self, payload: dict[str, Any]) -> dict[str, Any] | Failed:
        station, lease = self._station, self._lease
        job_id = f"{lease.work_id}:{lease.epoch}" if station.view.cancels else None
        call = RunCall(station.worker, lease.capability, payload, job_id, self._gpu_uuid)
        call.start()
        while not station.timing.wait(call.done, station.poll_seconds):
            if self._gpu_uuid is not None and self._gpu_uuid in station.gpu_faults():
                return self._gpu_failed(call)
            if self._keeper.lost.is_set():
                self._cancel(call, self._keeper.lost_code or "lease_lost")
                self.abandoned = call  # until the worker has unwound it: the next claim waits
                raise Interrupted()
            if station.signals.stopping():
                if call.job_id is not None:  # on the side: the stop must not wait for the worker
                    threading.Thread(
                        target=self._cancel, args=(call, "agent_stopping"), name="modelforge-work-cancel", daemon=True
                    ).start()
                call.abort()
                raise Interrupted()
        failed = call.failure()
        if failed is not None:
            if failed.retryable:
                station.view.mark_stale()  # claim nothing more until the worker's status was polled again
            return failed
        assert call.result is not None
        return call.result

    def _gpu_failed(self, call: RunCall) -> Failed:
        """The job's GPU faulted mid-job (an Xid that needs a reset or a reboot, the GPU lost):
        stop the job, and fail it as the node's failure, so the item goes back uncounted."""
        self._cancel(call, "gpu_fault")
        call.abort()
        log.warning(
            f"work {self._lease.work_id}: GPU {self._gpu_uuid} faulted while it ran the job; the job was stopped "
            "and the item goes back to the queue",
            extra={"event": "work_gpu_fault", **self._lease.fields(), "gpu_uuid": self._gpu_uuid},
        )
        return Failed(
            f"gpu_fault: GPU {self._gpu_uuid} faulted while it ran the job", True, "gpu_fault", node_fault=True
        )

    def _cancel(self, call: RunCall, why: str) -> None:
        """Tell the worker to stop the job (when it can be told); logged either way."""
        if call.job_id is None:
            return
        station, fields = self._station, {**self._lease.fields(), "job_id": call.job_id, "why": why}
        asked = station.timing.clock()
        try:
            state = call.cancel()
        except (WorkerRefused, WorkerFailure) as error:
            log.warning(
                f"work {self._lease.work_id}: the worker could not be told to stop the job ({error}); "
                "waiting for it to end",
                extra={"event": "work_job_cancel_failed", **fields, "error": str(error)},
            )
            return
        log.info(
            f"work {self._lease.work_id}: the worker stopped the job ({state})",
            extra={
                "event": "work_job_cancelled",
                **fields,
                "state": state,
                "duration_ms": round((station.timing.clock() - asked) * 1000, 2),
            },
        )

    def _upload(self, data: bytes) -> Done | Failed:
        if len(data) > work.MAX_RESULT_BYTES:
            return Failed(
                f"result_too_large: the result is larger than {work.MAX_RESULT_BYTES} bytes", False, "result_too_large"
            )
        if self._interrupted():
            raise Interrupted()
        try:
            self._station.objects.put(self._lease.result_upload_url, "result", data)
        except TransferFailed as failed:
            return Failed(f"result_upload_failed: {failed.reason}", True, "result_upload_failed")
        return Done(hashlib.sha256(data).hexdigest(), len(data))

    # --- settling -----------------------------------------------------------------------------

    def _send(self, action: str, body: dict[str, Any], *, once: bool = False) -> str | None:
        return self._settler.settle(self._lease, action, body, self._keeper.expires_at, once=once)

    def _settle(self, outcome: Done | Failed | None, started: float) -> bool:
        keeper, lease = self._keeper, self._lease
        if keeper.lost.is_set():
            return self._finished(keeper.lost_code or "lease_lost", started, keep_draining=True)
        if self._station.signals.stopping():
            if self._station.signals.fatal is None:
                self._send(FAIL, STOPPING.fail_body(lease, self._station.signals.features), once=True)
            return self._finished("interrupted", started, keep_draining=False)
        if isinstance(outcome, Done):
            code = self._send(COMPLETE, outcome.complete_body(lease))
            if code in UPLOAD_NOT_FOUND:
                failed = Failed(f"{code}: the uploaded result was not found as sent", True, code)
                self._send(FAIL, failed.fail_body(lease, self._station.signals.features))
                return self._finished("failed", started, keep_draining=False, code=code, retryable=True)
            return self._finished(code or "succeeded", started, keep_draining=True, size=outcome.size)
        assert outcome is not None
        code = self._send(FAIL, outcome.fail_body(lease, self._station.signals.features))
        return self._finished(
            code or "failed",
            started,
            keep_draining=not outcome.retryable,
            code=outcome.code,
            retryable=outcome.retryable,
        )

    def _finished(
        self,
        outcome: str,
        started: float,
        *,
        keep_draining: bool,
        code: str | None = None,
        retryable: bool | None = None,
        size: int | None = None,
    ) -> bool:
        lease = self._lease
        self.outcome = outcome
        seconds = self._station.timing.clock() - started
        fields: dict[str, Any] = {
            "event": "work_finished",
            **lease.fields(),
            "outcome": outcome,
            "duration_ms": round(seconds * 1000, 2),
            "renewals": self._keeper.renewals,
        }
        detail = ""
        if code is not None:
            fields["code"], detail = code, f" ({code}{', retryable' if retryable else ''})"
        if retryable is not None:
            fields["retryable"] = retryable
        if size is not None:
            fields["result_bytes"] = size
        message = f"work {lease.work_id} ({lease.capability}) {outcome}{detail} in {seconds:.1f}s"
        (log.info if outcome == "succeeded" else log.warning)(message, extra=fields)
        return keep_draining and not self._station.signals.stopping()
