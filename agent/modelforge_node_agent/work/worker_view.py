"""The runtime worker's status as the work loop sees it: polled once per heartbeat on the
publishing thread (``observe``, logged when it changed), and marked stale after a run the worker
refused retryably or failed, so that no claim is made until it was polled again."""

from __future__ import annotations

import logging
from typing import Any

from ..worker_client import OK, WorkerClient, WorkerStatus, printable

log = logging.getLogger("modelforge.agent")


class WorkerView:
    def __init__(self, worker: WorkerClient) -> None:
        self._worker = worker
        self.current: WorkerStatus | None = None
        #: set after the worker refused or failed a run: hints are ignored until the next status
        self.stale = False

    @property
    def claimable(self) -> bool:
        """Worth claiming for: a fresh status, and the worker able to take work."""
        view = self.current
        return view is not None and view.claimable and not self.stale

    def offers(self, capability: str) -> bool:
        view = self.current
        return view is not None and capability in view.available

    @property
    def cancels(self) -> bool:
        """Whether the worker, as last polled, can cancel a job by its id (the ``cancel`` feature)."""
        view = self.current
        return view is not None and view.cancels

    def mark_stale(self) -> None:
        self.stale = True

    def observe(self) -> WorkerStatus:
        """Poll the worker's status, log it when it changed, keep it."""
        view = self._worker.status()
        before = self.current
        self.current, self.stale = view, False
        if before is None or (before.status, before.detail) != (view.status, view.detail):
            _log_status(view)
        return view


def _log_status(view: WorkerStatus) -> None:
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
