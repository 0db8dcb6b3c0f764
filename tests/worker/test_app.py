"""The worker's run checks in its own terms (no HTTP): which ``RunError`` each bad request gets,
in the order the HTTP API has always answered them."""

from __future__ import annotations

from typing import Any

import pytest
from modelforge_runtime_worker import errors
from modelforge_runtime_worker.app import WorkerApp
from modelforge_runtime_worker.jobs import JobRunner
from modelforge_runtime_worker.ocr import Cancel
from modelforge_runtime_worker.server import STATUS, http_error


class Fixed:
    model, model_sha256, device = "stand-in", None, "cpu"

    def __init__(self, name: str, available: bool = True, reason: str | None = None) -> None:
        self.name, self.available, self.reason = name, available, reason

    def run(self, payload: dict[str, Any], cancel: Cancel) -> dict[str, Any]:
        return {"n": len(payload)}


def _app() -> WorkerApp:
    return WorkerApp([Fixed("echoish"), Fixed("off", available=False, reason="cuda_unavailable")], JobRunner(5))


@pytest.mark.parametrize(
    ("request_body", "error", "message"),
    [
        ([], errors.InvalidRequest, 'the body must be a JSON object {"capability": ..., "input": {...}}'),
        ({}, errors.InvalidRequest, "capability is required (a string)"),
        ({"capability": 3, "input": {}}, errors.InvalidRequest, "capability is required (a string)"),
        ({"capability": "", "input": {}}, errors.InvalidRequest, "capability is required (a string)"),
        ({"capability": "echoish", "input": {}, "b": 1, "a": 2}, errors.InvalidRequest, "unknown fields: a, b"),
        ({"capability": "nope"}, errors.UnknownCapability, "no capability 'nope' here; this worker runs: echoish, off"),
        ({"capability": "echoish"}, errors.InvalidInput, "input is required (a JSON object)"),
        ({"capability": "echoish", "input": [1]}, errors.InvalidInput, "input is required (a JSON object)"),
        ({"capability": "off", "input": []}, errors.InvalidInput, "input is required (a JSON object)"),
        ({"capability": "off", "input": {}}, errors.CapabilityUnavailable, "off is unavailable (cuda_unavailable)"),
    ],
)
def test_worker_app_run_bad_request_raises_the_first_refusal_in_order(
    request_body: Any, error: type[errors.RunError], message: str
) -> None:
    with pytest.raises(error) as refused:
        _app().run(request_body)
    assert refused.value.message.startswith(message)


def test_worker_app_run_stopping_refuses_with_shutting_down() -> None:
    app = _app()
    app.stopping = True
    with pytest.raises(errors.ShuttingDown):
        app.run({"capability": "echoish", "input": {}})


def test_worker_app_run_valid_request_returns_the_result() -> None:
    assert _app().run({"capability": "echoish", "input": {"a": 1}}) == {"result": {"n": 1}}


@pytest.mark.parametrize(
    ("error", "status", "retryable"),
    [
        (errors.InvalidRequest("m"), 400, False),
        (errors.UnknownCapability("m"), 404, False),
        (errors.CapabilityUnavailable("m", "artifact_quarantined"), 409, False),
        (errors.Cancelled("m"), 409, True),
        (errors.InvalidInput("m"), 422, False),
        (errors.JobFailed("m"), 500, False),
        (errors.WorkerBusy("m"), 503, True),
        (errors.GpuSlotsFull("m"), 503, True),
        (errors.ShuttingDown("m"), 503, True),
        (errors.JobTimedOut("m"), 504, True),
    ],
)
def test_http_error_each_run_error_has_its_status(error: errors.RunError, status: int, retryable: bool) -> None:
    answer = http_error(error)
    assert (answer.status, answer.code, answer.retryable) == (status, error.code, retryable)


def test_status_table_covers_every_run_error() -> None:
    def leaves(cls: type[errors.RunError]) -> set[type[errors.RunError]]:
        return {cls}.union(*(leaves(sub) for sub in cls.__subclasses__()))

    assert leaves(errors.RunError) - {errors.RunError} == set(STATUS)
