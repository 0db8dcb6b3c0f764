"""bench/claims.py times "the claim's own TransactWriteItems" raw, to compare the 1-claimer rate with
it; the transaction it sends must be the one a claim sends. A claim over HTTP on the in-process
stack is captured at botocore and compared, shape for shape, with the bench's
(``claim_load.claim_transaction``): the same operations on the same tables, the same condition
and update expressions and names, values of the same types, and an event of the same build.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import botocore.client
import pytest
from modelforge_bench import claim_load
from modelforge_protocol import work as protocol

from tests.support.api import ControlPlane

ECHO = protocol.ECHO


@pytest.fixture()
def sent_transactions() -> Iterator[list[dict[str, Any]]]:
    """Every TransactWriteItems request this process sends while the test runs."""
    sent: list[dict[str, Any]] = []
    lock = threading.Lock()
    original = botocore.client.BaseClient._make_api_call

    def recording(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if operation == "TransactWriteItems":
            with lock:
                sent.append(json.loads(json.dumps(params)))
        return original(self, operation, params)

    botocore.client.BaseClient._make_api_call = recording  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        botocore.client.BaseClient._make_api_call = original  # type: ignore[method-assign]


def _shape(value: Any) -> Any:
    """Structure and types, not values: dict keys kept, leaves replaced by their type name; a
    DynamoDB attribute value keeps its type tag; a JSON string (the event's payload) is parsed."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    if isinstance(value, str) and value.startswith("{"):
        return {"json": _shape(json.loads(value))}
    return type(value).__name__


def _entry_shape(entry: dict[str, Any], roles: dict[str, str]) -> dict[str, Any]:
    ((operation, body),) = entry.items()
    kept = {"ConditionExpression", "UpdateExpression", "ExpressionAttributeNames"}
    return {
        "operation": operation,
        "table": roles[body["TableName"]],
        **{key: body[key] for key in kept if key in body},
        "Key": _shape(body.get("Key")),
        "Item": _shape(body.get("Item")),
        "ExpressionAttributeValues": _shape(body.get("ExpressionAttributeValues")),
    }


def test_the_claims_bench_times_the_transaction_a_claim_sends(
    stack: Any, cp: ControlPlane, sent_transactions: list[dict[str, Any]]
) -> None:
    node = cp.worker_node(("cpu", ECHO))
    assert cp.heartbeat(node).status_code == 200
    assert cp.submit_work(ECHO, {"text": "shape"}).status_code == 201
    sent_transactions.clear()
    claimed = cp.claim(node)
    assert claimed.status_code == 200, claimed.text
    leases = [
        sent["TransactItems"]
        for sent in sent_transactions
        if any('"work.leased"' in json.dumps(entry) for entry in sent["TransactItems"])
    ]
    assert len(leases) == 1, sent_transactions
    names = stack.names
    tables = {role: names[f"MODELFORGE_{role.upper()}_TABLE"] for role in ("work", "nodes", "outbox")}
    roles = {name: role for role, name in tables.items()}
    bench = claim_load.claim_transaction(
        tables["work"],
        tables["nodes"],
        tables["outbox"],
        "work_" + "0" * 32,
        "node_" + "0" * 32,
        "1" * 64,
        time.time(),
    )
    assert [_entry_shape(entry, roles) for entry in bench] == [_entry_shape(entry, roles) for entry in leases[0]]
