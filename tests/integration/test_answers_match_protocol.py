"""What the control plane answers an agent is what the agent accepts: every answer, refusals
included, validates against the shared protocol's answer schemas (the agent treats anything else
as a malformed answer and retries it forever)."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from modelforge_protocol import schemas

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory


def _conforms(schema: dict[str, Any], answer: Any) -> None:
    problems = [error.message for error in Draft202012Validator(schema).iter_errors(answer)]
    assert not problems, f"{answer!r}: {problems}"


def test_enroll_heartbeat_and_inventory_answers_match_the_answer_schemas(cp: ControlPlane) -> None:
    identity = AgentIdentity()
    enrolled = cp.enroll(cp.mint()["token"], identity, accelerator_mode="nvidia", inventory=gpu_inventory(2))
    assert enrolled.status_code == 201
    _conforms(schemas.ENROLL_ANSWER, enrolled.json())
    beat = cp.heartbeat(identity, gpus=2)
    assert beat.status_code == 200
    _conforms(schemas.HEARTBEAT_ANSWER, beat.json())
    body = {"protocol_version": 1, "inventory": gpu_inventory(2)}
    inventory = cp.request("POST", "/api/v1/agent/inventory", headers=identity.headers(), json=body)
    assert inventory.status_code == 200
    _conforms(schemas.INVENTORY_ANSWER, inventory.json())


def _refusals(cp: ControlPlane) -> tuple[list[tuple[str, Any]], str]:
    identity = cp.enrolled_node()
    stranger = AgentIdentity(node_id="node_" + "0" * 32)
    revoked = cp.enrolled_node()
    cp.admin("POST", f"/api/v1/admin/nodes/{revoked.node_id}/revoke-credential")
    used = cp.mint()
    cp.enroll(used["token"], AgentIdentity())
    heartbeat = "/api/v1/agent/heartbeat"
    return [
        ("unknown credential", cp.request("POST", heartbeat, headers=stranger.headers(), json=cp.heartbeat_body())),
        ("revoked credential", cp.request("POST", heartbeat, headers=revoked.headers(), json=cp.heartbeat_body())),
        ("no credential", cp.request("POST", heartbeat, json=cp.heartbeat_body())),
        (
            "protocol too new",
            cp.request("POST", heartbeat, headers=identity.headers(), json=cp.heartbeat_body(protocol_version=99)),
        ),
        ("bad body", cp.request("POST", heartbeat, headers=identity.headers(), json={"protocol_version": 1})),
        (
            "not json",
            cp.request(
                "POST", heartbeat, headers={**identity.headers(), "Content-Type": "application/json"}, data=b"{"
            ),
        ),
        (
            "wrong media type",
            cp.request("POST", heartbeat, headers={**identity.headers(), "Content-Type": "text/plain"}, data=b"{}"),
        ),
        ("token used", cp.enroll(used["token"], AgentIdentity())),
        ("token unknown", cp.enroll("mfe.enr_" + "0" * 32 + "." + "A" * 43, AgentIdentity())),
        ("unknown route", cp.request("POST", "/api/v1/agent/nothing-here", headers=identity.headers(), json={})),
    ], identity.credential


def test_every_refusal_an_agent_can_meet_matches_the_error_answer_schema(cp: ControlPlane) -> None:
    refusals, credential = _refusals(cp)
    for what, response in refusals:
        assert 400 <= response.status_code < 500, (what, response.status_code, response.text)
        _conforms(schemas.ERROR_ANSWER, response.json())
        assert credential not in response.text, what  # an unknown route must not echo Authorization


def test_an_unknown_path_is_404_not_found(cp: ControlPlane) -> None:
    response = cp.request("GET", "/api/v2/nodes")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_an_inventory_rate_limit_refusal_carries_retry_after_in_both_forms(cp: ControlPlane) -> None:
    identity = cp.enrolled_node()
    body = {"protocol_version": 1, "inventory": gpu_inventory(1)}
    for _ in range(50):
        response = cp.request("POST", "/api/v1/agent/inventory", headers=identity.headers(), json=body)
        if response.status_code == 429:
            break
        assert response.status_code == 200, response.text
    else:
        pytest.fail("no 429 after 50 replacements")
    _conforms(schemas.ERROR_ANSWER, response.json())
    assert int(response.headers["Retry-After"]) == response.json()["error"]["retry_after_seconds"] >= 1
