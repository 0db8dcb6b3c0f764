"""The node's work loop: claim the work the control plane hints at, run it on the runtime worker,
keep its lease, upload its result and complete it (or fail it); one job at a time.

Two sides, two threads:

- the publishing thread (``agent.Agent``) calls ``observe`` once per heartbeat (the worker's
  status: what the inventory advertises and what ``health.worker`` reports) and ``hint`` when a
  heartbeat answer says ``work_waiting``;
- the work thread waits for a hint, then drains: claims, runs the job, claims again at once, until
  the claim answers 204 (nothing claimable); then it waits for the next hint. A node whose worker
  is not ready (unreachable, incompatible, nothing available) ignores hints: idle nodes never
  send a claim.

One job: the lease is renewed every ``lease_seconds / 3`` on its own thread from the claim until
the job is settled. The input is fetched with a presigned GET, the worker runs it, the result's
canonical JSON is uploaded with a presigned PUT, then the work is completed with that upload's
SHA-256 and size. A renewal answered 409 (``lease_lost``, ``work_cancelled``) ends the job at
once: the run is no longer waited for and nothing is uploaded (the next claim waits until the
worker has finished that run, so two jobs never meet on the worker).

Failures: the worker's own answer says whether an error is ``retryable`` (``invalid_input`` is
not; its message becomes the reason); a worker that cannot be reached, resets, or runs past the
deadline fails the work retryable; so does a capability this node's worker cannot serve now
(``artifact_quarantined``: the work is fine, another node can run it) and any transfer failure.
After a retryable failure the node stops claiming until the next hint, once the worker's status
was polled again. Presigned URLs are bearer secrets: they are never logged, never followed when
they redirect, and must be https (plain http only for loopback).

Fatal answers on the work thread (a redirect from the control plane, a refused credential, a
bug) are handed to the publishing thread (``fatal``, and ``wake``), which stops the agent with
the exit code it would give for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from modelforge_protocol import work
from modelforge_protocol.addresses import is_loopback_host

from . import answers
from .answers import MalformedAnswer
from .config import AgentConfig
from .control_plane import (
    _NETWORK_ERRORS,
    COMPLETE,
    DEADLINE_EXCEEDED,
    FAIL,
    RENEW,
    WORK_CLAIM,
    ControlPlaneClient,
    Refused,
    TransientFailure,
    _label,
    work_path,
)
from .deadline import Deadline
from .failures import RedirectRefused
from .identity import Identity
from .transport import base_url, build_object_session, build_session
from .worker_client import OK, Cutter, WorkerClient, WorkerFailure, WorkerRefused, WorkerStatus, printable

log = logging.getLogger("modelforge.agent")

#: Whole-transfer deadline of one presigned GET (input, at most 5 MiB) or PUT (result, 16 MiB).
TRANSFER_TIMEOUT_SECONDS = 120.0
#: How often the work thread looks at the stop signal and the lease while the worker runs.
POLL_SECONDS = 0.05
#: Waits between attempts to complete or fail when the control plane cannot be reached (never
#: past the lease: after that, the control plane takes the work back itself).
SETTLE_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0)
#: The worker's codes that say this node cannot serve the capability now: not the input's fault.
NODE_CANNOT_SERVE = frozenset({"artifact_quarantined", "capability_unavailable", "unknown_capability"})
#: The input's nesting limit (the worker's own).
MAX_INPUT_DEPTH = 64


def default_renew_interval(lease_seconds: float) -> float:
    """Renew three times per lease: two renewals can be lost before the lease is."""
    return lease_seconds / 3


def canonical(document: Any) -> bytes:
    """The result's bytes as uploaded: sorted keys, no spaces, UTF-8 (as the control plane
    writes the input)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# --- presigned object URLs -----------------------------------------------------------------------


class TransferFailed(Exception):
    """A presigned GET or PUT did not succeed; ``reason`` names the status or error class, never
    the URL (a bearer secret)."""

    def __init__(self, reason: str, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason, self.retryable = reason, retryable


def check_presigned_url(url: str) -> None:
    """https, or plain http to a loopback address (the local stack); no user information."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:  # e.g. an unclosed IPv6 bracket
        raise TransferFailed("presigned URL refused: not a URL") from None
    if not host or parts.username is not None or parts.password is not None:
        raise TransferFailed("presigned URL refused: not an absolute URL with a host")
    if parts.scheme == "https" or (parts.scheme == "http" and is_loopback_host(host)):
        return
    raise TransferFailed("presigned URL refused: https is required (plain http only for loopback addresses)")


class PresignedObjects:
    """GET and PUT on presigned URLs: no redirect followed, one whole-transfer deadline, answers
    read up to a cap. The session carries no credential of the node's."""

    def __init__(
        self,
        session: requests.Session,
        request_timeout_seconds: float,
        transfer_timeout_seconds: float = TRANSFER_TIMEOUT_SECONDS,
    ) -> None:
        self._session = session
        self._timeout = request_timeout_seconds
        self._transfer_timeout = transfer_timeout_seconds

    def get(self, url: str, what: str, max_bytes: int) -> bytes:
        return self._exchange("GET", url, what, None, max_bytes)

    def put(self, url: str, what: str, data: bytes) -> None:
        self._exchange("PUT", url, what, data, 64 * 1024)

    def _exchange(self, method: str, url: str, what: str, data: bytes | None, max_bytes: int) -> bytes:
        check_presigned_url(url)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        with Deadline(self._transfer_timeout) as deadline:
            try:
                response = self._session.request(
                    method, url, data=data, headers=headers, timeout=self._timeout, stream=True, allow_redirects=False
                )
                with contextlib.closing(response):
                    status = response.status_code
                    if 300 <= status < 400:
                        raise TransferFailed(f"HTTP {status} redirect on {method} {what} (not followed)")
                    if not 200 <= status < 300:
                        raise TransferFailed(f"HTTP {status} on {method} {what}")
                    body = _read_capped(response, method, what, max_bytes)
            except _NETWORK_ERRORS as error:
                label = DEADLINE_EXCEEDED if deadline.expired else _label(error)[0]
                raise TransferFailed(f"{label} on {method} {what}") from None
        if deadline.expired:
            raise TransferFailed(f"{DEADLINE_EXCEEDED} on {method} {what}")
        return body


def _read_capped(response: requests.Response, method: str, what: str, max_bytes: int) -> bytes:
    if response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        raise TransferFailed(f"{method} {what}: the answer is compressed")
    too_large = TransferFailed(f"{what} larger than {max_bytes} bytes", retryable=False)
    length = response.headers.get("Content-Length", "").strip()
    if length.isascii() and length.isdigit() and int(length) > max_bytes:
        raise too_large
    body = response.raw.read(max_bytes + 1, decode_content=False)
    if len(body) > max_bytes:
        raise too_large
    return bytes(body)


# --- one job ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """A claimed work item; the URLs are bearer secrets (kept out of ``repr``, never logged)."""

    work_id: str
    capability: str
    epoch: int
    lease_seconds: int
    input_url: str = field(repr=False)
    result_upload_url: str = field(repr=False)

    @classmethod
    def from_claim(cls, answer: dict[str, Any]) -> Lease:
        return cls(
            answer["work_id"],
            answer["capability"],
            answer["epoch"],
            answer["lease_seconds"],
            answer["input_url"],
            answer["result_upload_url"],
        )

    def fields(self) -> dict[str, Any]:
        return {"work_id": self.work_id, "capability": self.capability, "epoch": self.epoch}


@dataclass(frozen=True)
class _Done:
    """The job ran and its result was uploaded."""

    sha256: str
    size: int


@dataclass(frozen=True)
class _Failed:
    reason: str
    retryable: bool
    code: str


class _Interrupted(Exception):
    """The lease was lost or the agent is stopping: settle nothing more here."""


class _RunCall:
    """One ``POST /v1/run`` on its own thread, so the work thread can stop waiting for it."""

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


class _LeaseKeeper:
    """Renews one lease every ``interval`` seconds until stopped; a 409 marks it ``lost``."""

    def __init__(self, runner: WorkRunner, lease: Lease, identity: Identity, interval: float) -> None:
        self._runner, self._lease, self._identity, self._interval = runner, lease, identity, interval
        self.lost = threading.Event()
        self.lost_code: str | None = None
        self.renewals = 0
        #: When the lease runs out as far as this node knows (claim or last renewal + lease).
        self.expires_at = time.monotonic() + lease.lease_seconds
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modelforge-work-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        lease, fields = self._lease, self._lease.fields()
        while not self._halt.wait(self._interval):
            asked = time.monotonic()
            try:
                self._runner._client.lease(lease.work_id, RENEW, {"epoch": lease.epoch}, self._identity)
            except TransientFailure as failure:
                log.warning(
                    f"{failure.label} on POST {failure.path}: lease renewal failed, trying again in {self._interval:g}s",
                    extra={"event": "work_renew_failed", **fields, "error": failure.label},
                )
                continue
            except Refused as refused:
                if refused.status == 409:
                    self._lose(refused.code)
                    return
                if self._runner._is_fatal(refused):
                    self._lose(refused.code)
                    return
                log.warning(
                    f"HTTP {refused.status} {refused.code} on POST {refused.path}: lease renewal refused",
                    extra={"event": "work_renew_failed", **fields, "error": refused.code},
                )
                continue
            except RedirectRefused as redirect:
                self._runner._set_fatal(redirect)
                self._lose("redirect")
                return
            self.renewals += 1
            self.expires_at = asked + lease.lease_seconds
            log.debug("lease renewed", extra={"event": "work_renewed", **fields})

    def _lose(self, code: str) -> None:
        self.lost_code = code
        self.lost.set()
        log.warning(
            f"work {self._lease.work_id}: lease renewal answered {code}; stopping it and uploading nothing",
            extra={"event": "work_lease_lost", **self._lease.fields(), "code": code},
        )


# --- the loop ---------------------------------------------------------------------------------------


class WorkRunner:
    def __init__(
        self,
        client: ControlPlaneClient,
        worker: WorkerClient,
        objects: PresignedObjects,
        *,
        renew_interval: Callable[[float], float] = default_renew_interval,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self._client = client
        self._worker = worker
        self._objects = objects
        self._renew_interval = renew_interval
        self._poll = poll_seconds
        self._view: WorkerStatus | None = None
        #: set after the worker refused or failed a run: hints are ignored until the next status
        self._view_stale = False
        self._hinted = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._identity: Identity | None = None
        self._wake: Callable[[], None] | None = None
        self._abandoned: _RunCall | None = None
        #: the first fatal failure on the work thread; the publishing thread raises it
        self.fatal: BaseException | None = None
        #: how each job ended, in order (``succeeded``, ``failed``, ``lease_lost``, ...)
        self.outcomes: list[str] = []

    # --- the publishing thread's side ----------------------------------------------------------

    @property
    def view(self) -> WorkerStatus | None:
        return self._view

    def observe(self) -> WorkerStatus:
        """Poll the worker's status (once per heartbeat), log it when it changed, keep it."""
        view = self._worker.status()
        before = self._view
        self._view, self._view_stale = view, False
        if before is None or (before.status, before.detail) != (view.status, view.detail):
            fields: dict[str, Any] = {
                "event": "worker_status",
                "worker_status": view.status,
                "available": list(view.available),
            }
            if view.verdict is not None:
                fields["verdict"] = view.verdict.value
            if view.next_step is not None:
                fields["next_step"] = view.next_step
            if view.unavailable:
                fields["unavailable"] = view.unavailable
            message = f"runtime worker {view.status}: {printable(view.detail, 512)}"
            if view.status == OK:
                log.info(message, extra=fields)
            else:
                log.warning(message + ("" if view.claimable else "; claiming no work"), extra=fields)
        return view

    def hint(self) -> None:
        """A heartbeat answer said ``work_waiting``: drain, if the worker can take work."""
        view = self._view
        if view is not None and view.claimable and not self._view_stale:
            self._hinted.set()

    def start(self, identity: Identity, wake: Callable[[], None] | None = None) -> None:
        if self._thread is not None:
            return
        self._identity, self._wake = identity, wake
        self._thread = threading.Thread(target=self._loop, name="modelforge-work", daemon=True)
        self._thread.start()

    def close(self, grace_seconds: float = 1.0) -> None:
        """Stop: a running job is failed (retryable) if that can be said quickly; never blocks
        longer than ``grace_seconds``."""
        self._closing.set()
        self._hinted.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(grace_seconds)

    # --- fatal failures are handed to the publishing thread ----------------------------------

    def _set_fatal(self, error: BaseException) -> None:
        if self.fatal is None:
            self.fatal = error
        self._closing.set()
        self._hinted.set()
        if self._wake is not None:
            self._wake()

    def _is_fatal(self, refused: Refused) -> bool:
        """A refused credential stops the agent, as it would on a heartbeat."""
        if refused.status in (401, 403):
            self._set_fatal(refused)
            return True
        return False

    # --- the work thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                self._hinted.wait()
                if self._closing.is_set():
                    return
                self._drain()
        except Exception as error:  # noqa: BLE001 - a bug: stop the agent (exit 1) rather than stop working silently
            self._set_fatal(error)

    def _drain(self) -> None:
        identity = self._identity
        assert identity is not None
        while not self._closing.is_set():
            view = self._view
            if view is None or not view.claimable or self._view_stale:
                self._hinted.clear()
                return
            if not self._worker_free():
                return
            self._hinted.clear()  # a hint that comes while this claim runs means another drain
            lease = self._claim(identity)
            if lease is None:
                return
            if not self._job(lease, identity):
                return

    def _worker_free(self) -> bool:
        """Wait for a run this node stopped waiting for (its lease was lost) to end on the worker."""
        call = self._abandoned
        if call is None:
            return True
        if not call.done.is_set():
            log.info(
                "waiting for the worker to finish a run whose lease was lost",
                extra={"event": "work_waiting_for_worker"},
            )
            while not call.done.wait(self._poll):
                if self._closing.is_set():
                    return False
        self._abandoned = None
        return True

    def _claim(self, identity: Identity) -> Lease | None:
        try:
            answer = self._client.claim(identity)
        except TransientFailure as failure:
            log.warning(
                f"{failure.label} on POST {WORK_CLAIM}; claiming again after the next hint",
                extra={"event": "work_claim_failed", "error": failure.label, "status": failure.status},
            )
            return None
        except Refused as refused:
            if not self._is_fatal(refused):
                log.warning(
                    f"HTTP {refused.status} {refused.code} on POST {WORK_CLAIM}; claiming again after the next hint",
                    extra={"event": "work_claim_refused", "code": refused.code, "status": refused.status},
                )
            return None
        except RedirectRefused as redirect:
            self._set_fatal(redirect)
            return None
        if answer is None:
            log.debug("no claimable work", extra={"event": "work_drained"})
            return None
        lease = Lease.from_claim(answer)
        log.info(
            f"claimed {lease.work_id} ({lease.capability}, epoch {lease.epoch}, lease {lease.lease_seconds}s)",
            extra={"event": "work_claimed", **lease.fields(), "lease_seconds": lease.lease_seconds},
        )
        return lease

    def _job(self, lease: Lease, identity: Identity) -> bool:
        """Run one claimed item to its end; whether to keep draining."""
        started = time.monotonic()
        keeper = _LeaseKeeper(self, lease, identity, max(0.01, self._renew_interval(lease.lease_seconds)))
        keeper.start()
        try:
            outcome: _Done | _Failed | None = self._execute(lease, keeper)
        except _Interrupted:
            outcome = None
        finally:
            keeper.stop()
        if keeper.lost.is_set():
            return self._finished(lease, keeper.lost_code or "lease_lost", started, keeper, keep_draining=True)
        if self._closing.is_set():
            if self.fatal is None:
                stopping = _Failed(
                    "agent_stopping: the node agent stopped before the work finished", True, "agent_stopping"
                )
                self._settle(lease, identity, FAIL, self._fail_body(lease, stopping), keeper, once=True)
            return self._finished(lease, "interrupted", started, keeper, keep_draining=False)
        if isinstance(outcome, _Done):
            body = {"epoch": lease.epoch, "sha256": outcome.sha256, "size": outcome.size}
            code = self._settle(lease, identity, COMPLETE, body, keeper)
            if code in ("result_missing", "result_checksum_mismatch"):
                failed = _Failed(f"{code}: the uploaded result was not found as sent", True, code)
                self._settle(lease, identity, FAIL, self._fail_body(lease, failed), keeper)
                return self._finished(lease, "failed", started, keeper, keep_draining=False, code=code, retryable=True)
            return self._finished(lease, code or "succeeded", started, keeper, keep_draining=True, size=outcome.size)
        assert outcome is not None
        code = self._settle(lease, identity, FAIL, self._fail_body(lease, outcome), keeper)
        return self._finished(
            lease,
            code or "failed",
            started,
            keeper,
            keep_draining=not outcome.retryable,
            code=outcome.code,
            retryable=outcome.retryable,
        )

    @staticmethod
    def _fail_body(lease: Lease, failed: _Failed) -> dict[str, Any]:
        reason = printable(failed.reason, work.MAX_REASON_CHARS) or failed.code
        return {"epoch": lease.epoch, "reason": reason, "retryable": failed.retryable}

    def _interrupted(self, keeper: _LeaseKeeper) -> bool:
        return keeper.lost.is_set() or self._closing.is_set()

    def _execute(self, lease: Lease, keeper: _LeaseKeeper) -> _Done | _Failed:
        view = self._view
        if view is None or lease.capability not in view.available:
            self._view_stale = True
            return _Failed(
                f"capability_unavailable: this node's runtime worker cannot run {lease.capability} now",
                True,
                "capability_unavailable",
            )
        try:
            raw = self._objects.get(lease.input_url, "input", work.MAX_SUBMIT_BODY_BYTES)
        except TransferFailed as failed:
            return _Failed(f"input_download_failed: {failed.reason}", failed.retryable, "input_download_failed")
        if self._interrupted(keeper):
            raise _Interrupted()
        try:
            payload = answers.parse(raw, max_bytes=work.MAX_SUBMIT_BODY_BYTES, max_depth=MAX_INPUT_DEPTH)
        except MalformedAnswer as malformed:
            return _Failed(
                f"invalid_input: the input document is not usable JSON ({malformed.reason})", False, "invalid_input"
            )
        if not isinstance(payload, dict):
            return _Failed("invalid_input: the input document is not a JSON object", False, "invalid_input")
        result = self._run(lease, payload, keeper)
        if isinstance(result, _Failed):
            return result
        data = canonical(result)
        if len(data) > work.MAX_RESULT_BYTES:
            return _Failed(
                f"result_too_large: the result is larger than {work.MAX_RESULT_BYTES} bytes", False, "result_too_large"
            )
        if self._interrupted(keeper):
            raise _Interrupted()
        try:
            self._objects.put(lease.result_upload_url, "result", data)
        except TransferFailed as failed:
            return _Failed(f"result_upload_failed: {failed.reason}", True, "result_upload_failed")
        return _Done(hashlib.sha256(data).hexdigest(), len(data))

    def _run(self, lease: Lease, payload: dict[str, Any], keeper: _LeaseKeeper) -> dict[str, Any] | _Failed:
        call = _RunCall(self._worker, lease.capability, payload)
        call.start()
        while not call.done.wait(self._poll):
            if keeper.lost.is_set():
                self._abandoned = call  # the worker is still busy with it: the next claim waits
                raise _Interrupted()
            if self._closing.is_set():
                call.abort()
                raise _Interrupted()
        if isinstance(call.error, WorkerRefused):
            refused = call.error
            node_side = refused.code in NODE_CANNOT_SERVE
            if node_side or refused.retryable:
                self._view_stale = True  # claim nothing more until the worker's status was polled again
            return _Failed(refused.message or refused.code, refused.retryable or node_side, refused.code)
        if isinstance(call.error, WorkerFailure):
            self._view_stale = True
            return _Failed(f"worker_unreachable: {call.error}", True, "worker_unreachable")
        assert call.result is not None
        return call.result

    def _settle(
        self,
        lease: Lease,
        identity: Identity,
        action: str,
        body: dict[str, Any],
        keeper: _LeaseKeeper,
        *,
        once: bool = False,
    ) -> str | None:
        """Complete or fail: None when the control plane took it, else the refusal's code (or
        ``unsettled`` when it could not be reached before the lease ran out)."""
        steps = iter(() if once else SETTLE_BACKOFF)
        while True:
            try:
                self._client.lease(lease.work_id, action, body, identity)
                return None
            except TransientFailure as failure:
                step = next(steps, None)
                if step is None or self._closing.is_set() or time.monotonic() + step > keeper.expires_at:
                    log.warning(
                        f"{failure.label} on POST {work_path(lease.work_id, action)}; giving up, the control plane "
                        "takes the work back when its lease expires",
                        extra={"event": "work_unsettled", **lease.fields(), "error": failure.label},
                    )
                    return "unsettled"
                log.warning(
                    f"{failure.label} on POST {work_path(lease.work_id, action)} (retry in {step:g}s)",
                    extra={"event": "work_settle_failed", **lease.fields(), "error": failure.label},
                )
                if self._closing.wait(step):
                    return "unsettled"
            except Refused as refused:
                self._is_fatal(refused)
                return refused.code
            except RedirectRefused as redirect:
                self._set_fatal(redirect)
                return "redirect"

    def _finished(
        self,
        lease: Lease,
        outcome: str,
        started: float,
        keeper: _LeaseKeeper,
        *,
        keep_draining: bool,
        code: str | None = None,
        retryable: bool | None = None,
        size: int | None = None,
    ) -> bool:
        self.outcomes.append(outcome)
        seconds = time.monotonic() - started
        fields: dict[str, Any] = {
            "event": "work_finished",
            **lease.fields(),
            "outcome": outcome,
            "duration_ms": round(seconds * 1000, 2),
            "renewals": keeper.renewals,
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
        return keep_draining and not self._closing.is_set()


def for_config(config: AgentConfig, **options: Any) -> WorkRunner:
    """The work loop of a configuration with ``MODELFORGE_AGENT_WORKER_URL``: its own
    control-plane session (the publishing thread keeps the other), a session for presigned URLs
    and the worker's client."""
    assert config.worker_url is not None
    client = ControlPlaneClient(build_session(config), base_url(config), config.request_timeout_seconds)
    objects = PresignedObjects(build_object_session(config), config.request_timeout_seconds)
    return WorkRunner(client, WorkerClient(config.worker_url), objects, **options)
