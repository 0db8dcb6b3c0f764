"""Settling a job: complete or fail its work item. When the control plane cannot be reached, the
call is tried again after 1, 2, 4, 8, 16 s, never past the lease (after that, the control plane
takes the work back itself) and never once the agent is stopping."""

from __future__ import annotations

import logging
from typing import Any

from modelforge_protocol import backoff

from ..control_plane import ControlPlaneClient, work_path
from ..failures import CONTROL_PLANE_FAILURES, Kind, classify
from ..identity import Identity
from .claimed import Lease
from .signals import Signals
from .timing import Timing

log = logging.getLogger("modelforge.agent")

#: Waits between attempts to complete or fail when the control plane cannot be reached.
SETTLE_BACKOFF = backoff.STEPS
#: What ``settle`` answers when the control plane could not be reached before the lease ran out.
UNSETTLED = "unsettled"


class Settler:
    def __init__(
        self,
        client: ControlPlaneClient,
        identity: Identity,
        signals: Signals,
        timing: Timing,
        backoff: tuple[float, ...] = SETTLE_BACKOFF,
    ) -> None:
        self._client, self._identity = client, identity
        self._signals, self._timing, self._backoff = signals, timing, backoff

    def settle(
        self, lease: Lease, action: str, body: dict[str, Any], expires_at: float, *, once: bool = False
    ) -> str | None:
        """Complete or fail: None when the control plane took it, else the refusal's code (or
        ``unsettled``); a fatal refusal is handed to ``Signals.halt``."""
        steps = iter(() if once else self._backoff)
        while True:
            try:
                self._client.lease(lease.work_id, action, body, self._identity)
                return None
            except CONTROL_PLANE_FAILURES as error:
                failure = classify(error)
            if failure.kind is not Kind.TRANSIENT:
                self._signals.take(failure)
                return failure.code
            path, fields = work_path(lease.work_id, action), {**lease.fields(), "error": failure.code}
            step = next(steps, None)
            if step is None or self._signals.stopping() or self._timing.clock() + step > expires_at:
                log.warning(
                    f"{failure.code} on POST {path}; giving up, the control plane takes the work back when its "
                    "lease expires",
                    extra={"event": "work_unsettled", **fields},
                )
                return UNSETTLED
            log.warning(
                f"{failure.code} on POST {path} (retry in {step:g}s)", extra={"event": "work_settle_failed", **fields}
            )
            if self._timing.wait(self._signals.stop, step):
                return UNSETTLED
