"""One job at a time, each bounded in time.

The busy lock is taken when a job starts and released by the job's own thread when it has really
ended, not when its caller stopped waiting: a job past its deadline is aborted (``Cancel``) and
its caller gets ``JobTimedOut`` at once, and the worker stays busy (``WorkerBusy``) until the
aborted run has unwound, so two jobs never run together. The errors are the worker's own
(``errors.py``); the HTTP layer gives them their status codes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .capabilities import Capability
from .errors import JobFailed, JobTimedOut, RunError, ShuttingDown, WorkerBusy
from .ocr import Cancel, JobCancelled

log = logging.getLogger("modelforge.worker")


class JobRunner:
    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self._busy = threading.Lock()
        self._guard = threading.Lock()
        self._cancel: Cancel | None = None
        self._stopping = False
        self._sequence = 0

    def run(self, capability: Capability, payload: dict[str, Any]) -> dict[str, Any]:
        """``capability``'s result for ``payload``, or a ``RunError``."""
        if not self._busy.acquire(blocking=False):
            raise WorkerBusy("another job is running; retry when it is done")
        with self._guard:
            if self._stopping:
                self._busy.release()
                raise ShuttingDown("the worker is stopping")
            cancel = self._cancel = Cancel()
            self._sequence += 1
            job = self._sequence
        outcome: dict[str, Any] = {}
        finished = threading.Event()
        started = time.monotonic()

        def work() -> None:
            try:
                outcome["result"] = capability.run(payload, cancel)
            except BaseException as error:  # noqa: BLE001 - handed to the waiting request
                outcome["error"] = error
            finally:
                with self._guard:
                    self._cancel = None
                self._busy.release()
                finished.set()
                if cancel.is_set():
                    log.info(
                        "aborted job ended",
                        extra={
                            "event": "job_aborted",
                            "job": job,
                            "capability": capability.name,
                            "duration_ms": _ms(started),
                        },
                    )

        log.debug("job started", extra={"event": "job_started", "job": job, "capability": capability.name})
        try:
            threading.Thread(target=work, name=f"job-{job}", daemon=True).start()
        except BaseException:
            with self._guard:
                self._cancel = None
            self._busy.release()
            raise
        if not finished.wait(self.timeout_seconds):
            cancel.set()
            log.warning(
                f"job exceeded {self.timeout_seconds:g} s and is being aborted",
                extra={"event": "job_timeout", "job": job, "capability": capability.name},
            )
            raise JobTimedOut(f"the job ran over {self.timeout_seconds:g} s and was aborted")
        error = outcome.get("error")
        if isinstance(error, RunError):
            raise error
        if isinstance(error, JobCancelled):
            raise ShuttingDown("the job was aborted: the worker is stopping")
        if error is not None:
            log.error(
                "job failed",
                exc_info=error,
                extra={"event": "job_failed", "job": job, "capability": capability.name},
            )
            raise JobFailed(f"{capability.name} failed ({type(error).__name__})")
        return outcome["result"]

    def stop(self, grace_seconds: float) -> bool:
        """Refuse new jobs, abort the running one, and wait up to ``grace_seconds`` for it to end."""
        with self._guard:
            self._stopping = True
            if self._cancel is not None:
                self._cancel.set()
        if self._busy.acquire(timeout=grace_seconds):
            self._busy.release()
            return True
        return False

    @property
    def busy(self) -> bool:
        return self._busy.locked()


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)
