"""An unauthenticated caller costs the control plane reads, never a write.

Counted at the emulator (every DynamoDB and S3 request the app makes), over HTTP against the
in-process stack. In a pay-per-request deployment a write is what anyone on the internet could
otherwise run up; the most an unauthenticated heartbeat or inventory can cost is one GetItem.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from chalicelib import instance
from chalicelib.domain import requests as typed
from chalicelib.services import nodes
from chalicelib.services.auth import NodeCaller
from chalicelib.services.known_callers import KnownCallers
from modelforge_local_stack.emulator import operations_delta
from modelforge_protocol.credentials import sha256_hex

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.stores import stores

#: Operations that read; anything else the app sends changes state or costs a write unit.
READS = {"GetItem", "BatchGetItem", "Query", "Scan"}


def _app_operations(stack: Any) -> dict[str, int]:
    return {name: count for name, count in stack.aws_operations().items() if not name.startswith("poller:")}


def _impostors(cp: ControlPlane) -> list[AgentIdentity]:
    """Callers with well-formed headers that are not genuine: unknown node, wrong credential,
    and a revoked credential this instance never verified (one it had verified costs one failed
    conditional update once: see the revoked-credential test below)."""
    unknown = AgentIdentity()
    unknown.node_id = "node_" + secrets.token_hex(16)
    victim = cp.enrolled_node()
    wrong = AgentIdentity()
    wrong.node_id = victim.node_id
    revoked = cp.enrolled_node()
    assert cp.admin("POST", f"/api/v1/admin/nodes/{revoked.node_id}/revoke-credential").status_code == 200
    return [unknown, wrong, revoked]


@pytest.mark.parametrize("path", ["/api/v1/agent/heartbeat", "/api/v1/agent/inventory"])
def test_unauthenticated_agent_call_makes_no_write_only_one_read(counted_stack, cp: ControlPlane, path: str) -> None:
    stack = counted_stack
    impostors = _impostors(cp)
    stack.drain_state_log()
    body = (
        cp.heartbeat_body(gpus=64)
        if path.endswith("heartbeat")
        else {"protocol_version": 1, "inventory": gpu_inventory(64)}
    )
    before = _app_operations(stack)
    for _ in range(5):
        for impostor in impostors:
            response = cp.request("POST", path, headers=impostor.headers(), json=body)
            assert response.status_code == 401, response.text
    delta = operations_delta(before, _app_operations(stack))
    assert set(delta) <= READS, f"an unauthenticated caller caused {delta}"
    assert delta == {"GetItem": 5 * len(impostors)}  # exactly one read per attempt


def test_a_caller_known_to_this_instance_heartbeats_with_one_update_a_new_instance_reads_once(
    counted_stack, cp: ControlPlane
) -> None:
    stack = counted_stack
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200  # online, and known to the served instance
    caller = NodeCaller(node_id=identity.node_id or "", credential_sha256=sha256_hex(identity.credential))
    settings = instance.get().settings
    fresh = KnownCallers()  # what a newly started function instance knows: nobody
    stack.drain_state_log()  # the state-log function's S3 writes are not the heartbeat's
    before = _app_operations(stack)
    nodes.heartbeat(stores(), settings, caller, typed.heartbeat(cp.heartbeat_body()), time.time(), fresh)
    assert operations_delta(before, _app_operations(stack)) == {"GetItem": 1, "UpdateItem": 1}
    before = _app_operations(stack)
    for _ in range(3):
        nodes.heartbeat(stores(), settings, caller, typed.heartbeat(cp.heartbeat_body()), time.time(), fresh)
    assert operations_delta(before, _app_operations(stack)) == {"UpdateItem": 3}


def test_a_revoked_credential_is_forgotten_and_refused_by_the_next_heartbeat(counted_stack, cp: ControlPlane) -> None:
    identity = cp.enrolled_node()
    assert cp.heartbeat(identity).status_code == 200
    assert cp.heartbeat(identity).status_code == 200  # known: the one-update path
    assert cp.admin("POST", f"/api/v1/admin/nodes/{identity.node_id}/revoke-credential").status_code == 200
    counted_stack.drain_state_log()  # the state-log function's S3 writes are not the heartbeat's
    before = _app_operations(counted_stack)
    refused = cp.heartbeat(identity)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "credential_revoked"
    # the instance still trusted it: its one update fails the credential condition, then a read
    assert operations_delta(before, _app_operations(counted_stack)) == {"UpdateItem": 1, "GetItem": 1}
    before = _app_operations(counted_stack)
    assert cp.heartbeat(identity).status_code == 401
    assert operations_delta(before, _app_operations(counted_stack)) == {"GetItem": 1}  # forgotten: read, no write
