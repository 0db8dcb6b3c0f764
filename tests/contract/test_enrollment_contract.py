"""The enrollment store's contract, guard by guard, on both implementations (docs/TESTING.md, "Store guards")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.records import NOW, enrollment, event, inventory, node
from tests.support.store_backends import Backend

KEY_SHA256 = "c" * 64
CONSUMED_EVENTS = ["enrollment.consumed", "node.registered", "credential.issued", "inventory.replaced"]


def _pending(backend: Backend, **fields: Any) -> Any:
    pending = enrollment(**fields)
    backend.seed(pending)
    return pending


# --- create -----------------------------------------------------------------------------


def test_enrollments_create_new_id_is_stored_with_its_event(backend: Backend) -> None:
    created = enrollment()
    backend.stores.enrollments.create(created, event("enrollment.created"))
    assert backend.stores.enrollments.get(created.enrollment_id) == created
    assert backend.event_types() == ["enrollment.created"]


def test_enrollments_create_existing_id_is_refused(backend: Backend) -> None:
    existing = _pending(backend)
    again = enrollment(enrollment_id=existing.enrollment_id)
    backend.refused(lambda: backend.stores.enrollments.create(again, event()))


# --- revoke -----------------------------------------------------------------------------


def test_enrollments_revoke_pending_is_revoked(backend: Backend) -> None:
    pending = _pending(backend)
    backend.stores.enrollments.revoke(pending.enrollment_id, NOW, event("enrollment.revoked"))
    stored = backend.stores.enrollments.get(pending.enrollment_id)
    assert (stored.state, stored.revoked_at) == ("revoked", NOW)
    assert backend.event_types() == ["enrollment.revoked"]


def test_enrollments_revoke_consumed_meanwhile_is_refused(backend: Backend) -> None:
    pending = _pending(backend)
    backend.meanwhile("enrollments.revoke", "enrollments", pending.enrollment_id, state="consumed", consumed_at=NOW)
    backend.refused(lambda: backend.stores.enrollments.revoke(pending.enrollment_id, NOW, event()))


def test_enrollments_revoke_unknown_id_is_refused(backend: Backend) -> None:
    backend.refused(lambda: backend.stores.enrollments.revoke("enr_" + "0" * 32, NOW, event()))


# --- consume ----------------------------------------------------------------------------


def _consume(backend: Backend, pending: Any, new_node: Any, token: str | None = None, now: float = NOW) -> None:
    claimed = inventory(new_node.node_id, claimed_uuids={"GPU-1", "GPU-2"})
    backend.stores.enrollments.consume(
        pending.enrollment_id, token or pending.token_sha256, KEY_SHA256, new_node, claimed, now
    )


def test_enrollments_consume_pending_token_creates_the_node(backend: Backend) -> None:
    pending, new_node = _pending(backend), node()
    _consume(backend, pending, new_node)
    stored = backend.stores.enrollments.get(pending.enrollment_id)
    assert (stored.state, stored.consumed_at, stored.node_id) == ("consumed", NOW, new_node.node_id)
    assert stored.idempotency_key_sha256 == KEY_SHA256
    assert backend.stores.nodes.get(new_node.node_id) == new_node
    assert backend.stores.nodes.get_inventory(new_node.node_id).claimed_uuids == {"GPU-1", "GPU-2"}
    assert backend.claims(new_node.node_id) == {"GPU-1", "GPU-2"}
    assert sorted(backend.event_types()) == sorted(CONSUMED_EVENTS)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"token_sha256": "d" * 64}, id="token"),  # not the token this enrollment minted
        pytest.param({"state": "consumed", "consumed_at": NOW - 1}, id="consumed"),
        pytest.param({"state": "revoked", "revoked_at": NOW - 1}, id="revoked"),
        pytest.param({"expires_at": NOW}, id="expired"),  # expired at the write's time (not after it)
    ],
)
def test_enrollments_consume_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    pending, new_node = _pending(backend), node()
    backend.meanwhile("enrollments.consume", "enrollments", pending.enrollment_id, **change)
    backend.refused(lambda: _consume(backend, pending, new_node))


@pytest.mark.parametrize("existing", ["node", "inventory"])
def test_enrollments_consume_node_id_taken_is_refused(backend: Backend, existing: str) -> None:
    pending, new_node = _pending(backend), node()
    backend.seed(new_node if existing == "node" else inventory(new_node.node_id))
    backend.refused(lambda: _consume(backend, pending, node(node_id=new_node.node_id)))
