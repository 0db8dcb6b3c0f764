"""Keeps one lease: renews it every ``interval`` seconds on its own thread until stopped, and marks
it ``lost`` when a renewal is answered 409 (``lease_lost``, ``work_cancelled``) or fatally (a
redirect, a refused credential; handed to ``Signals.halt``). A transient failure or another
refusal is logged and the next renewal comes at its time.

``renew_now`` (a channel's ``cancel`` hint) renews at once instead of at the interval, at most
once per ``MIN_EARLY_RENEW_SECONDS`` after the previous renewal: a hint costs one renewal, and a
flood of them no more than one per that time. Only the renewal's answer stops the job."""

from __future__ import annotations

import logging
import threading

from ..control_plane import RENEW, ControlPlaneClient
from ..failures import CONTROL_PLANE_FAILURES, Classified, Kind, classify
from ..identity import Identity
from .claimed import Lease
from .signals import Signals
from .timing import Timing

log = logging.getLogger("modelforge.agent")

#: The status of a lease call that says the lease is gone (lost, or its work cancelled).
LEASE_GONE = 409
#: Least time between a renewal and one asked early by ``renew_now``.
MIN_EARLY_RENEW_SECONDS = 0.5


class LeaseKeeper:
    def __init__(
        self,
        client: ControlPlaneClient,
        identity: Identity,
        lease: Lease,
        interval: float,
        signals: Signals,
        timing: Timing,
    ) -> None:
        self._client, self._identity, self._lease = client, identity, lease
        self._interval, self._signals, self._timing = interval, signals, timing
        self.lost = threading.Event()
        self.lost_code: str | None = None
        self.renewals = 0
        #: When the lease runs out as far as this node knows (claim or last renewal + lease).
        self._asked = timing.clock()  # the claim counts as the first ask
        self.expires_at = self._asked + lease.lease_seconds
        self._halt = threading.Event()
        #: set by ``renew_now`` and by ``stop``: ends the wait for the next interval
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self.run, name="modelforge-work-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def renew_now(self) -> None:
        """Renew at once rather than at the next interval (from any thread)."""
        self._wake.set()

    def run(self) -> None:
        """Renew at each interval, or at once when woken, until stopped or lost (the thread's body)."""
        while True:
            woken = self._timing.wait(self._wake, self._interval)
            if self._halt.is_set():
                return
            if woken:
                self._wake.clear()  # a hint that comes during this renewal asks for another
                gap = self._asked + MIN_EARLY_RENEW_SECONDS - self._timing.clock()
                if gap > 0 and self._timing.wait(self._halt, gap):
                    return
            if not self.renew():
                return

    def renew(self) -> bool:
        """One renewal; whether to keep renewing."""
        asked = self._asked = self._timing.clock()
        try:
            self._client.lease(self._lease.work_id, RENEW, {"epoch": self._lease.epoch}, self._identity)
        except CONTROL_PLANE_FAILURES as error:
            return self._failed(classify(error))
        self.renewals += 1
        self.expires_at = asked + self._lease.lease_seconds
        log.debug("lease renewed", extra={"event": "work_renewed", **self._lease.fields()})
        return True

    def _failed(self, failure: Classified) -> bool:
        fields = {"event": "work_renew_failed", **self._lease.fields(), "error": failure.code}
        if failure.kind is Kind.TRANSIENT:
            log.warning(
                f"{failure.code} on POST {failure.path}: lease renewal failed, trying again in {self._interval:g}s",
                extra=fields,
            )
            return True
        if failure.status == LEASE_GONE or self._signals.take(failure):
            self._lose(failure.code)
            return False
        log.warning(f"HTTP {failure.status} {failure.code} on POST {failure.path}: lease renewal refused", extra=fields)
        return True

    def _lose(self, code: str) -> None:
        self.lost_code = code
        self.lost.set()
        log.warning(
            f"work {self._lease.work_id}: lease renewal answered {code}; stopping it and uploading nothing",
            extra={"event": "work_lease_lost", **self._lease.fields(), "code": code},
        )
