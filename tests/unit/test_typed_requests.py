"""Typed requests: each builder judges a body as the control plane always has (protocol version,
then schema, then the rules JSON Schema cannot say) and gives a frozen dataclass with one field per
property of the protocol's schema, defaults filled in, secrets out of ``repr``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Invalid
from modelforge_protocol import schemas
from modelforge_protocol import work as work_protocol

from tests.unit.service_bodies import AgentIdentity, enroll_body, gpu_inventory, heartbeat_body, inventory_body

#: Each typed request, its builder and the protocol schema it is built from.
BUILT_FROM: list[tuple[type, Callable[[dict[str, Any]], Any], dict[str, Any]]] = [
    (typed.CreateEnrollment, typed.create_enrollment, schemas.CREATE_ENROLLMENT),
    (typed.NodeAgentSettings, typed.node_agent_settings, schemas.NODE_AGENT_SETTINGS),
    (typed.SubmitWork, typed.submit_work, work_protocol.SUBMIT_WORK),
    (typed.Enroll, typed.enroll, schemas.ENROLL),
    (typed.Heartbeat, typed.heartbeat, schemas.HEARTBEAT),
    (typed.ReplaceInventory, typed.replace_inventory, schemas.REPLACE_INVENTORY),
    (typed.RenewWork, typed.renew_work, work_protocol.RENEW_WORK),
    (typed.CompleteWork, typed.complete_work, work_protocol.COMPLETE_WORK),
    (typed.FailWork, typed.fail_work, work_protocol.FAIL_WORK),
]


def _code(build: Callable[[], Any]) -> str:
    with pytest.raises(Invalid) as refused:
        build()
    return refused.value.code


@pytest.mark.parametrize(("kind", "build", "schema"), BUILT_FROM, ids=lambda value: getattr(value, "__name__", ""))
def test_typed_request_fields_are_the_schema_properties(kind: type, build: Any, schema: dict[str, Any]) -> None:
    assert {field.name for field in dataclasses.fields(kind)} == set(schema["properties"])
    assert kind.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "build", "schema"), BUILT_FROM, ids=lambda value: getattr(value, "__name__", ""))
def test_typed_request_unknown_field_refused(kind: type, build: Any, schema: dict[str, Any]) -> None:
    body = {"unexpected": 1}
    if "protocol_version" in schema["properties"]:
        body["protocol_version"] = 1
    assert _code(lambda: build(body)) == "invalid_request"


def test_create_enrollment_absent_production_eligible_false() -> None:
    request = typed.create_enrollment({"display_name": "GPU Node", "expires_in_seconds": 900})
    assert request == typed.CreateEnrollment("GPU Node", 900, False)


def test_submit_work_absent_optionals_protocol_defaults() -> None:
    request = typed.submit_work({"capability": work_protocol.ECHO, "input": {"text": "hi"}})
    assert (request.max_attempts, request.lease_seconds, request.idempotency_key) == (
        work_protocol.DEFAULT_ATTEMPTS,
        work_protocol.DEFAULT_LEASE_SECONDS,
        None,
    )


def test_node_agent_settings_absent_image_fields_empty() -> None:
    body = {
        "control_plane_url": "https://cp.example",
        "hostname": "gpu-1",
        "accelerator_mode": "cpu",
        "state_volume": "/var/lib/modelforge",
        "image_source": "registry",
    }
    request = typed.node_agent_settings(body)
    assert (request.manifest_entry, request.image_reference) == ("", "")


def test_enroll_incompatible_protocol_judged_before_the_schema() -> None:
    body = {"protocol_version": 999, "token": 5}  # also invalid by the schema
    assert _code(lambda: typed.enroll(body)) == "protocol_incompatible"
    assert _code(lambda: typed.heartbeat(body)) == "protocol_incompatible"
    assert _code(lambda: typed.replace_inventory(body)) == "protocol_incompatible"


def test_enroll_secrets_left_out_of_repr() -> None:
    identity = AgentIdentity()
    request = typed.enroll(enroll_body("mfe.secret-token-text", identity))
    shown = repr(request)
    for secret in ("mfe.secret-token-text", identity.credential, identity.idempotency_key):
        assert secret not in shown
    assert request.protocol_version == 1 and request.hostname in shown


def test_submit_work_idempotency_key_left_out_of_repr() -> None:
    request = typed.submit_work({"capability": work_protocol.ECHO, "input": {}, "idempotency_key": "job-secret-0001"})
    assert "job-secret-0001" not in repr(request)


def test_replace_inventory_duplicate_gpu_index_refused() -> None:
    inventory = gpu_inventory(2)
    inventory["gpus"][1]["index"] = inventory["gpus"][0]["index"]
    assert _code(lambda: typed.replace_inventory(inventory_body(inventory))) == "invalid_request"


def test_heartbeat_valid_body_fields_as_given() -> None:
    body = heartbeat_body(2)
    request = typed.heartbeat(body)
    assert (request.agent_version, request.health, request.telemetry) == (
        body["agent_version"],
        body["health"],
        body["telemetry"],
    )
