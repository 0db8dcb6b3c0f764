"""The agent's life after the preflight: enroll once, then publish inventory and heartbeats.

Time is injected: ``clock`` (monotonic seconds) and ``stop`` (an Event whose ``wait`` is the only
sleep), so tests never wait on real time. Fatal errors propagate (``Fatal``, ``Refused``,
``PreflightFailed`` from telemetry; ``exit_codes.exit_for`` maps them); transient ones back off
1, 2, 4, 8, 16 s with jitter, reset after a success, and never sooner than a 429's Retry-After.
A rate-limited inventory does not hold up heartbeats: it is sent again once Retry-After passed.
The interval the control plane asks for is clamped to 1..3600 s.

With a runtime worker (``work``, from ``MODELFORGE_AGENT_WORKER_URL``), each heartbeat first polls
the worker's status once: the capabilities it reports available join the inventory (re-sent when
that set changes), the heartbeat's health carries ``worker`` (and is ``degraded`` when the worker
is not ok), and an answer saying ``work_waiting`` hints the work loop (``work``), which runs
on its own thread so heartbeats go on while a job runs.

With a push channel (``channel``), every answer's ``features`` is remembered and its ``channel``
block (a ticket) handed to the channel; a heartbeat carries the channel's ``push_channel`` report
only while the last answer advertised ``push_channel`` (an older control plane refuses unknown
fields, so it gets exactly the heartbeat it always got). The channel's ``wake`` hints the work
loop as ``work_waiting`` does, its ``cancel`` makes the work loop renew that work at once.

Each agent process draws a random ``agent_instance_id`` at start; a heartbeat carries it while the
last answer advertised ``agent_instance``, so the control plane can tell two agents running with one
identity (a cloned disk or state volume) from a restart.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from modelforge_protocol.backoff import CAP, Backoff
from modelforge_protocol.schemas import (
    FEATURE_AGENT_INSTANCE,
    FEATURE_PUSH_CHANNEL,
    FEATURE_SLOTS,
    MAX_ANSWER_INTERVAL_SECONDS,
    MIN_ANSWER_INTERVAL_SECONDS,
)
from modelforge_protocol.versions import AGENT_PROTOCOL_VERSION

from . import AGENT_VERSION
from .answers import clamp
from .channel import CONNECTED, Channel
from .config import NO_IDENTITY_NO_TOKEN, AgentConfig
from .control_plane import ENROLL, HEARTBEAT, INVENTORY, ControlPlaneClient, TransientFailure
from .failures import ConfigurationInvalid, IdentityRefused
from .gpu_source import GpuSource
from .gpu_watch import GpuWatch
from .identity import Identity, StateVolume, new_identity
from .inventory import host_inventory
from .work import WorkRunner

log = logging.getLogger("modelforge.agent")

DEFAULT_INTERVAL_SECONDS = 15.0


class Stopped(Exception):
    """The stop signal arrived while waiting."""


class _Deferred(Exception):
    """A 429 on a call that can wait: try it again after ``seconds``, carry on meanwhile."""

    def __init__(self, failure: TransientFailure, seconds: float) -> None:
        super().__init__(str(failure))
        self.failure, self.seconds = failure, seconds


def _interval(answer: dict[str, Any]) -> float:
    """The control plane's heartbeat interval (a JSON number, by the answer schema), clamped."""
    asked = answer.get("heartbeat_interval_seconds", DEFAULT_INTERVAL_SECONDS)
    return clamp(float(asked), MIN_ANSWER_INTERVAL_SECONDS, MAX_ANSWER_INTERVAL_SECONDS)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        client: ControlPlaneClient,
        state: StateVolume,
        gpus: GpuSource,
        *,
        stop: threading.Event,
        clock: Callable[[], float],
        jitter: Callable[[], float],
        work: WorkRunner | None = None,
        channel: Channel | None = None,
        gpu_watch: GpuWatch | None = None,
    ) -> None:
        self._config = config
        self._client = client
        self._state = state
        self._gpus = gpus
        self._stop = stop
        self._clock = clock
        self._backoff = Backoff(jitter)
        self._inventory_not_before = float("-inf")
        self._work = work
        self._channel = channel
        self._gpu_watch = gpu_watch
        if work is not None and gpu_watch is not None:
            work.use_gpus(gpu_watch)
        #: the ``features`` of the last answer (an older control plane lists none)
        self._features: frozenset[str] = frozenset()
        #: this process's random id (AGENT_INSTANCE_ID_PATTERN): two agents on one identity differ
        self.instance_id = secrets.token_hex(16)
        #: the worker was polled just before enrolling: the first heartbeat uses that status
        self._worker_observed = False
        #: the interval the last ``heartbeating`` line named (said again only when it changes)
        self._announced_interval: float | None = None
        self.heartbeats_sent = 0

    # --- the life cycle ------------------------------------------------------------------

    def run(self) -> None:
        """Enroll if needed, then publish until stopped; a fatal error propagates (see ``exit_codes``)."""
        try:
            identity, interval = self._ensure_enrolled()
            self._publish(identity, interval)
        except Stopped:
            return
        finally:
            if self._gpu_watch is not None:
                self._gpu_watch.close()
            if self._channel is not None:
                self._channel.close()
            if self._work is not None:
                self._work.close()

    def _ensure_enrolled(self) -> tuple[Identity, float | None]:
        identity = self._state.load()
        if identity is not None and identity.control_plane_url != self._config.control_plane_url:
            raise IdentityRefused(
                f"the identity in {self._state.identity_path} belongs to another control plane; "
                "point MODELFORGE_AGENT_CONTROL_PLANE_URL back at it, or give this node a new state volume"
            )
        if identity is not None and identity.enrolled:
            if self._config.enrollment_token:
                log.info(
                    "identity present; the enrollment token is ignored and can be removed from the environment",
                    extra={"event": "enrollment_token_ignored", "node_id": identity.node_id},
                )
            return identity, None
        if not self._config.enrollment_token:
            raise ConfigurationInvalid([NO_IDENTITY_NO_TOKEN])  # load_config checked; the file went since
        if identity is None:
            identity = new_identity(self._config.control_plane_url)
            self._state.save(identity)  # persisted before enrolling: a retry is the same enrollment
        return self._enroll(identity)

    def _enroll(self, identity: Identity) -> tuple[Identity, float | None]:
        self._observe_worker()
        self._worker_observed = True
        body = {
            "token": self._config.enrollment_token,
            "idempotency_key": identity.idempotency_key,
            "credential": identity.credential,
            "hostname": self._config.hostname,
            "agent_version": AGENT_VERSION,
            "protocol_version": AGENT_PROTOCOL_VERSION,
            "accelerator_mode": self._config.accelerator_mode,
            "inventory": self._inventory(),
        }
        answer = self._with_retries(lambda: self._client.post(ENROLL, body))  # a refusal is fatal
        self._read_channel(answer)
        enrolled = self._state.enrolled_as(identity, answer["node_id"])  # the answer schema checked its format
        log.info(
            f"enrolled as {enrolled.node_id}",
            extra={"event": "enrolled", "node_id": enrolled.node_id, "replayed": bool(answer.get("replayed"))},
        )
        return enrolled, _interval(answer)

    def _publish(self, identity: Identity, interval: float | None) -> None:
        sent_inventory: dict[str, Any] | None = None
        inventory_sent_at = 0.0
        if interval is not None:  # just enrolled: the enrollment carried the inventory
            sent_inventory, inventory_sent_at = self._inventory(), self._clock()
        if self._gpu_watch is not None:
            self._gpu_watch.start()
        if self._work is not None:
            self._work.start(identity, wake=getattr(self._stop, "set", None))
        if self._channel is not None:
            assert identity.node_id is not None
            self._channel.start(identity.node_id, on_wake=self._hint, on_cancel=self._renew_now)
        status: object = None  # the last heartbeat answer's status: a node that comes online claims once
        while True:
            if not self._worker_observed:
                self._observe_worker()  # once per heartbeat
            self._worker_observed = False
            inventory = self._inventory()
            refresh_due = self._clock() - inventory_sent_at >= self._config.inventory_refresh_seconds
            allowed = self._clock() >= self._inventory_not_before
            if (inventory != sent_inventory or refresh_due) and allowed and self._send_inventory(inventory, identity):
                sent_inventory, inventory_sent_at = inventory, self._clock()
            body = self._heartbeat_body()
            answer = self._call(HEARTBEAT, body, identity)
            self.heartbeats_sent += 1
            interval = _interval(answer)
            self._read_channel(answer)
            self._read_gpu_answer(answer)
            came_online = answer.get("status") == "online" and status != "online"
            status = answer.get("status")
            connected = self._channel is not None and self._channel.state == CONNECTED
            if answer.get("work_waiting") is True or (came_online and connected):
                # came online while connected: the connection's own claim may have raced the first
                # heartbeat and been refused node_not_online, so the node never parked and no wake
                # would reach it; this claim takes what is queued, or parks the node. (Without a
                # channel every heartbeat's work_waiting is the hint: nothing to add.)
                self._hint()
            log.debug(
                "heartbeat",
                extra={"event": "heartbeat_sent", "node_id": identity.node_id, "status": answer.get("status")},
            )
            every = self._config.heartbeat_interval_override or interval
            if every != self._announced_interval:  # the first heartbeat, and when the interval changes
                self._announced_interval = every
                log.info(
                    f"heartbeating every {every:g} s as {identity.node_id} (status {answer.get('status', '?')})",
                    extra={"event": "heartbeating", "node_id": identity.node_id, "interval_seconds": every},
                )
            self._wait(0.0 if self._ticket_wanted_now(reported="push_channel" in body) else every)

    def _send_inventory(self, inventory: dict[str, Any], identity: Identity) -> bool:
        """Publish the inventory; False when it was rate-limited (heartbeats go on meanwhile)."""
        body = {"protocol_version": AGENT_PROTOCOL_VERSION, "inventory": inventory}
        try:
            self._call(INVENTORY, body, identity, defer_rate_limit=True)
        except _Deferred as deferred:
            self._inventory_not_before = self._clock() + deferred.seconds
            failure = deferred.failure
            log.warning(
                f"{failure.label} on {failure.method} {failure.path} (retry after {deferred.seconds:g}s); "
                "heartbeats continue meanwhile",
                extra={
                    "event": "inventory_deferred",
                    "node_id": identity.node_id,
                    "retry_after_seconds": deferred.seconds,
                },
            )
            return False
        log.info("inventory published", extra={"event": "inventory_published", "node_id": identity.node_id})
        return True

    def _observe_worker(self) -> None:
        if self._work is not None:
            self._work.observe()

    def _inventory(self) -> dict[str, Any]:
        view = self._work.view if self._work is not None else None
        if view is None:
            inventory = host_inventory(self._gpus.devices())
        else:
            inventory = host_inventory(self._gpus.devices(), worker_capabilities=view.available)
        if self._config.nvml_simulation is not None:
            inventory["simulated"] = True  # its GPUs come from a scripted NVML fake: it says so everywhere
        return inventory

    def _health(self) -> dict[str, Any]:
        view = self._work.view if self._work is not None else None
        if view is None:
            return {"status": "ok"}
        worker = view.to_health()
        if worker["status"] == "ok":
            return {"status": "ok", "worker": worker}
        detail = f"runtime worker {worker['status']}: {worker['detail']}"[:512]
        return {"status": "degraded", "detail": detail, "worker": worker}

    def _heartbeat_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "protocol_version": AGENT_PROTOCOL_VERSION,
            "agent_version": AGENT_VERSION,
            "health": self._health(),
            "telemetry": {"gpus": [reading.to_wire() for reading in self._gpus.telemetry()]},
        }
        if self._channel is not None and FEATURE_PUSH_CHANNEL in self._features:
            body["push_channel"] = self._channel.report()
        if self._work is not None and FEATURE_SLOTS in self._features:
            body["slots"] = self._work.slot_report()
        if self._gpu_watch is not None:
            body.update(self._gpu_watch.heartbeat_part(self._features))
        if FEATURE_AGENT_INSTANCE in self._features:
            body["agent_instance_id"] = self.instance_id
        return body

    def _read_gpu_answer(self, answer: dict[str, Any]) -> None:
        """Drains, blocked GPUs and re-checks: a change of what may take work re-plans the slots."""
        if self._gpu_watch is not None and self._gpu_watch.answered(answer) and self._work is not None:
            self._work.replan()

    # --- the push channel ----------------------------------------------------------------------

    def _read_channel(self, answer: dict[str, Any]) -> None:
        """Remember the answer's ``features``; hand its ``channel`` block (a ticket) to the channel."""
        self._features = frozenset(answer.get("features") or ())
        if self._work is not None:
            self._work.advertised(self._features)
        if self._channel is not None and FEATURE_PUSH_CHANNEL in self._features and "channel" in answer:
            self._channel.offer(answer["channel"])

    def _ticket_wanted_now(self, *, reported: bool) -> bool:
        """The heartbeat just sent could not ask for a ticket (the control plane was not yet known
        to serve the channel: the first one after a restart), its answer says it does, and the
        channel needs one: the next heartbeat, which asks, need not wait an interval."""
        if self._channel is None or reported or FEATURE_PUSH_CHANNEL not in self._features:
            return False
        return bool(self._channel.report()["need_ticket"])

    def _hint(self) -> None:
        """Work may be waiting (a heartbeat's ``work_waiting``, the channel's ``wake``): claim."""
        if self._work is not None:
            self._work.hint()

    def _renew_now(self, work_id: str) -> None:
        """The channel's ``cancel``: renew that work now; only the renewal's 409 stops the job."""
        if self._work is not None:
            self._work.renew_now(work_id)

    # --- calls and retries (a refusal propagates) -----------------------------------------

    def _call(
        self, path: str, body: dict[str, Any], identity: Identity, *, defer_rate_limit: bool = False
    ) -> dict[str, Any]:
        return self._with_retries(lambda: self._client.post(path, body, identity), defer_rate_limit)

    def _with_retries(self, call: Callable[[], dict[str, Any]], defer_rate_limit: bool = False) -> dict[str, Any]:
        while True:
            try:
                answer = call()
            except TransientFailure as failure:
                if defer_rate_limit and failure.status == 429:
                    raise _Deferred(failure, failure.retry_after or CAP) from None
                step = self._backoff.next_delay()
                self._log_failure(failure, step)
                self._wait(max(self._backoff.jittered(step), failure.retry_after or 0.0))
                continue
            if self._backoff.failures:
                log.info("control plane reachable again", extra={"event": "publish_recovered"})
            self._backoff.reset()
            return answer

    @staticmethod
    def _log_failure(failure: TransientFailure, step: float) -> None:
        detail = f": {failure.detail}" if failure.detail else ""
        if failure.retry_after is not None:
            detail += f" (Retry-After {failure.retry_after:g}s)"
        log.warning(
            f"{failure.label} on {failure.method} {failure.path} (backoff {step:g}s…{CAP:g}s){detail}",
            extra={
                "event": "publish_failed",
                "error": failure.label,
                "method": failure.method,
                "path": failure.path,
                "backoff_seconds": step,
                "retry_after_seconds": failure.retry_after,
            },
        )

    def _wait(self, seconds: float) -> None:
        stopped = self._stop.wait(seconds)
        if self._work is not None and self._work.fatal is not None:
            raise self._work.fatal  # the work loop met a fatal answer: stop as a heartbeat would
        if stopped:
            raise Stopped()
