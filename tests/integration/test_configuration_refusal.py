"""Every Lambda entry point refuses invalid liveness thresholds with a clear error naming both
variables and values: a JSON answer for the API, one clear exception for the other functions."""

from __future__ import annotations

import pytest
from chalicelib import instance

from tests.support.api import ControlPlane


@pytest.fixture()
def broken_thresholds(stack, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MODELFORGE_NODE_STALE_AFTER_SECONDS", "300")
    monkeypatch.setenv("MODELFORGE_NODE_OFFLINE_AFTER_SECONDS", "60")
    instance.reset()
    yield stack
    monkeypatch.undo()
    instance.reset()
    instance.get()


def _names_both(message: str) -> None:
    assert "MODELFORGE_NODE_STALE_AFTER_SECONDS='300'" in message
    assert "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS='60'" in message


def test_api_answers_configuration_invalid_as_json_not_a_traceback(broken_thresholds, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    response = cp.admin("GET", "/api/v1/admin/nodes")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "configuration_invalid"
    _names_both(error["message"])
    assert "Traceback" not in response.text


def test_sweep_and_state_log_functions_fail_with_one_clear_error(broken_thresholds) -> None:  # type: ignore[no-untyped-def]
    from modelforge_local_stack.scheduler import scheduled_event

    app = broken_thresholds.app_module
    with pytest.raises(app.ConfigurationInvalid) as sweep_error:
        app.liveness_sweep(scheduled_event(), None)
    _names_both(str(sweep_error.value))
    with pytest.raises(app.ConfigurationInvalid) as stream_error:
        app.state_log({"Records": []}, None)
    _names_both(str(stream_error.value))
