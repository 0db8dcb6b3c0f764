"""The failures the worker refuses or ends a run with, and the ones it stops on.

A ``RunError`` says what went wrong in the worker's own terms: ``code`` is stable (callers branch
on it), ``message`` says what to change, ``retryable`` says whether the same request may succeed
later unchanged. Only the HTTP layer (``server.py``) turns one into a status code.
"""

from __future__ import annotations


class RunError(Exception):
    """A run refused or failed."""

    code = "job_failed"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(RunError):
    """The request is not ``{"capability": ..., "input": {...}}``."""

    code = "invalid_request"


class UnknownCapability(RunError):
    code = "unknown_capability"


class InvalidInput(RunError):
    """The input of a run cannot be used as given: sending it again will not help."""

    code = "invalid_input"


class CapabilityUnavailable(RunError):
    """The capability cannot run (``artifact_quarantined``, or ``capability_unavailable``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class WorkerBusy(RunError):
    """Another job is running: one at a time."""

    code = "worker_busy"
    retryable = True


class GpuSlotsFull(RunError):
    """A job for one more GPU than the worker keeps slots for (``jobs.JobRunner.max_gpu_slots``):
    a GPU slot is kept once made, so the same request succeeds only after the worker restarts, or
    on another node."""

    code = "gpu_slots_full"
    retryable = True


class ShuttingDown(RunError):
    code = "shutting_down"
    retryable = True


class JobTimedOut(RunError):
    """The job ran over its deadline and was aborted."""

    code = "job_timeout"
    retryable = True


class Cancelled(RunError):
    """The job was cancelled (``POST /v1/cancel``) and has unwound; its caller asked for that, so
    it is no failure of the work."""

    code = "job_cancelled"
    retryable = True


class JobFailed(RunError):
    """The capability raised: a bug or a broken model, not the input's fault."""

    code = "job_failed"


def invalid_input(message: str) -> InvalidInput:
    return InvalidInput(message)


class ConfigurationInvalid(Exception):
    """Every problem with the configuration, each naming its variable; the worker exits 2."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        self.message = "invalid worker configuration: " + "; ".join(problems)
        super().__init__(self.message)


class ListenFailed(Exception):
    """The listening address cannot be taken (another worker answers there, or it is not a
    socket); the worker exits 3."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
