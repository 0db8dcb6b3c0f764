"""The node store's contract, guard by guard, on both implementations (docs/TESTING.md, "Store guards")."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain.records import ONLINE_NODES

from tests.contract.records import HEARTBEAT, NOW, event, holder, inventory, node
from tests.support.store_backends import Backend

#: Who moved the node meanwhile, for the writes a node makes as itself.
CREDENTIAL_MOVES = [
    pytest.param({"credential_sha256": "f" * 64}, id="credential"),  # re-enrolled: another credential
    pytest.param({"credential_state": "revoked"}, id="revoked"),
]


def _online_count(backend: Backend) -> int | None:
    counter = backend.stores.control.get(ONLINE_NODES)
    return None if counter is None or counter.count is None else int(counter.count)


def _seeded(backend: Backend, liveness: str = "online", **fields: Any) -> Any:
    seeded = node(liveness, **fields)
    backend.seed(seeded)
    return seeded


# --- record_heartbeat -------------------------------------------------------------------


def test_nodes_heartbeat_online_holder_is_recorded_unlogged(backend: Backend) -> None:
    ours = _seeded(backend)
    written = backend.stores.nodes.record_heartbeat(holder(ours), HEARTBEAT, NOW)
    stored = backend.stores.nodes.get(ours.node_id)
    assert stored == written
    assert (stored.last_heartbeat_at, stored.telemetry, stored.liveness) == (NOW, HEARTBEAT.telemetry, "online")
    assert backend.event_types() == []


@pytest.mark.parametrize("change", [*CREDENTIAL_MOVES, pytest.param({"liveness": "stale"}, id="not_online")])
def test_nodes_heartbeat_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _seeded(backend)
    backend.meanwhile("nodes.record_heartbeat", "nodes", ours.node_id, **change)
    backend.refused(lambda: backend.stores.nodes.record_heartbeat(holder(ours), HEARTBEAT, NOW))


def test_nodes_late_nodes_after_steady_heartbeats_go_by_the_last_heartbeat(backend: Backend) -> None:
    """A steady heartbeat leaves the sweep's index entry where the transition put it (one write
    unit): the node is still found late by its last heartbeat, and not before."""
    ours = _seeded(backend, last_heartbeat_at=NOW - 1000)
    backend.stores.nodes.record_heartbeat(holder(ours), HEARTBEAT, NOW)
    assert backend.stores.nodes.late_nodes("online", NOW - 100) == []
    assert backend.stores.nodes.late_nodes("online", NOW + 100) == [ours.node_id]
    assert backend.stores.nodes.late_nodes("stale", NOW + 100) == []


# --- bring_online -----------------------------------------------------------------------


def test_nodes_bring_online_unchanged_liveness_counts_one_more_online(backend: Backend) -> None:
    ours = _seeded(backend, "stale")
    backend.stores.nodes.bring_online(holder(ours), "stale", HEARTBEAT, NOW, event("node.online"))
    stored = backend.stores.nodes.get(ours.node_id)
    assert (stored.liveness, stored.liveness_changed_at, stored.last_heartbeat_at) == ("online", NOW, NOW)
    assert _online_count(backend) == 1
    assert backend.event_types() == ["node.online"]


@pytest.mark.parametrize("change", [*CREDENTIAL_MOVES, pytest.param({"liveness": "online"}, id="liveness")])
def test_nodes_bring_online_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _seeded(backend, "stale")
    backend.meanwhile("nodes.bring_online", "nodes", ours.node_id, **change)
    backend.refused(lambda: backend.stores.nodes.bring_online(holder(ours), "stale", HEARTBEAT, NOW, event()))


# --- change_liveness --------------------------------------------------------------------

SILENT_SINCE = NOW - 20  # the seeded heartbeat (NOW - 30) is at or before it


@pytest.mark.parametrize(("source", "target", "delta"), [("online", "stale", -1), ("stale", "offline", 0)])
def test_nodes_change_liveness_still_silent_moves_the_counter(
    backend: Backend, source: str, target: str, delta: int
) -> None:
    ours = _seeded(backend, source)
    backend.stores.nodes.change_liveness(ours.node_id, source, target, SILENT_SINCE, NOW, event("node.liveness"))
    stored = backend.stores.nodes.get(ours.node_id)
    assert (stored.liveness, stored.liveness_changed_at) == (target, NOW)
    assert _online_count(backend) == (delta or None)
    if target == "stale":  # the sweep's index holds online and stale nodes only
        assert backend.stores.nodes.late_nodes(target, NOW) == [ours.node_id]
    assert backend.event_types() == ["node.liveness"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"liveness": "stale"}, id="liveness"),  # another sweep moved it first
        pytest.param({"last_heartbeat_at": SILENT_SINCE + 0.001}, id="heartbeat"),  # a heartbeat arrived
    ],
)
def test_nodes_change_liveness_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _seeded(backend)
    backend.meanwhile("nodes.change_liveness", "nodes", ours.node_id, **change)
    write = backend.stores.nodes.change_liveness
    backend.refused(lambda: write(ours.node_id, "online", "stale", SILENT_SINCE, NOW, event()))


# --- replace_inventory ------------------------------------------------------------------


@pytest.mark.parametrize("previous", [None, "rev-1"], ids=["first", "next"])
def test_nodes_replace_inventory_unchanged_revision_is_written(backend: Backend, previous: str | None) -> None:
    ours = _seeded(backend)
    if previous is not None:
        backend.seed(inventory(ours.node_id, previous, claimed_uuids={"GPU-1"}))
    replacement = inventory(ours.node_id, "rev-2", updated_at=NOW, rate_window_start=NOW, rate_window_count=1)
    backend.stores.nodes.replace_inventory(holder(ours), replacement, previous, {"echo"}, event("inventory.replaced"))
    stored = backend.stores.nodes.get_inventory(ours.node_id)
    claimed = {"GPU-1"} if previous else None
    assert stored == inventory(
        ours.node_id, "rev-2", updated_at=NOW, rate_window_start=NOW, rate_window_count=1, claimed_uuids=claimed
    )
    assert backend.stores.nodes.get(ours.node_id).capabilities == {"echo"}
    assert backend.event_types() == ["inventory.replaced"]


@pytest.mark.parametrize("change", CREDENTIAL_MOVES)
def test_nodes_replace_inventory_credential_moved_meanwhile_is_refused(
    backend: Backend, change: dict[str, Any]
) -> None:
    ours = _seeded(backend)
    backend.seed(inventory(ours.node_id))
    backend.meanwhile("nodes.replace_inventory", "nodes", ours.node_id, **change)
    replacement = inventory(ours.node_id, "rev-2")
    backend.refused(lambda: backend.stores.nodes.replace_inventory(holder(ours), replacement, "rev-1", set(), event()))


def test_nodes_replace_inventory_replaced_meanwhile_is_refused(backend: Backend) -> None:
    ours = _seeded(backend)
    backend.seed(inventory(ours.node_id))
    backend.meanwhile("nodes.replace_inventory", "inventories", ours.node_id, revision="rev-other")
    replacement = inventory(ours.node_id, "rev-2")
    backend.refused(lambda: backend.stores.nodes.replace_inventory(holder(ours), replacement, "rev-1", set(), event()))


def test_nodes_replace_inventory_first_written_meanwhile_is_refused(backend: Backend) -> None:
    ours = _seeded(backend)
    first, replacement = inventory(ours.node_id, "rev-other"), inventory(ours.node_id, "rev-2")
    backend.meanwhile_seed("nodes.replace_inventory", first)
    backend.refused(lambda: backend.stores.nodes.replace_inventory(holder(ours), replacement, None, set(), event()))


# --- change_claims ----------------------------------------------------------------------


@pytest.mark.parametrize("adding", [True, False], ids=["add", "delete"])
def test_nodes_change_claims_same_revision_changes_claims(backend: Backend, adding: bool) -> None:
    ours = _seeded(backend)
    backend.seed(inventory(ours.node_id, claimed_uuids=None if adding else {"GPU-1", "GPU-2"}))
    backend.stores.nodes.change_claims(ours.node_id, "rev-1", ["GPU-1"], adding, NOW, event("gpu_claims.changed"))
    expected = {"GPU-1"} if adding else {"GPU-2"}
    assert backend.stores.nodes.get_inventory(ours.node_id).claimed_uuids == expected
    assert backend.claims(ours.node_id) == expected
    assert backend.stores.nodes.claimants("GPU-1") == ([ours.node_id] if adding else [])
    assert backend.event_types() == ["gpu_claims.changed"]


@pytest.mark.parametrize("adding", [True, False], ids=["add", "delete"])
def test_nodes_change_claims_inventory_replaced_meanwhile_is_refused(backend: Backend, adding: bool) -> None:
    ours = _seeded(backend)
    backend.seed(inventory(ours.node_id, claimed_uuids=None if adding else {"GPU-1"}))
    backend.meanwhile("nodes.change_claims", "inventories", ours.node_id, revision="rev-2")
    write = backend.stores.nodes.change_claims
    backend.refused(lambda: write(ours.node_id, "rev-1", ["GPU-1"], adding, NOW, event()))


# --- duplicate flags --------------------------------------------------------------------


def test_nodes_link_duplicates_existing_nodes_flags_both_sides(backend: Backend) -> None:
    first, second = _seeded(backend), _seeded(backend, duplicate_suspected_at=NOW - 5)
    backend.stores.nodes.link_duplicates(first.node_id, [second.node_id], NOW, event("node.duplicate_flagged"))
    stored_first, stored_second = backend.stores.nodes.get(first.node_id), backend.stores.nodes.get(second.node_id)
    assert (stored_first.duplicate_partners, stored_first.duplicate_suspected_at) == ({second.node_id}, NOW)
    assert (stored_second.duplicate_partners, stored_second.duplicate_suspected_at) == ({first.node_id}, NOW - 5)
    assert backend.event_types() == ["node.duplicate_flagged"]


def test_nodes_unlink_duplicates_existing_nodes_unflags_both_sides(backend: Backend) -> None:
    other, second = "node_" + "3" * 32, node()
    first = _seeded(backend, duplicate_partners={second.node_id, other}, duplicate_suspected_at=NOW - 5)
    backend.seed(node(node_id=second.node_id, duplicate_partners={first.node_id}, duplicate_suspected_at=NOW - 5))
    backend.stores.nodes.unlink_duplicates(first.node_id, [second.node_id], event("node.duplicate_unflagged"))
    assert backend.stores.nodes.get(first.node_id).duplicate_partners == {other}
    assert backend.stores.nodes.get(second.node_id).duplicate_partners is None
    assert backend.event_types() == ["node.duplicate_unflagged"]


@pytest.mark.parametrize("method", ["link_duplicates", "unlink_duplicates"])
def test_nodes_duplicate_flag_partner_gone_is_refused(backend: Backend, method: str) -> None:
    first, second = _seeded(backend), _seeded(backend)
    backend.meanwhile_delete(f"nodes.{method}", "nodes", second.node_id)
    if method == "link_duplicates":
        backend.refused(lambda: backend.stores.nodes.link_duplicates(first.node_id, [second.node_id], NOW, event()))
    else:
        backend.refused(lambda: backend.stores.nodes.unlink_duplicates(first.node_id, [second.node_id], event()))


def test_nodes_forget_duplicate_time_no_partner_left_is_forgotten(backend: Backend) -> None:
    ours = _seeded(backend, duplicate_suspected_at=NOW - 5)
    backend.stores.nodes.forget_duplicate_time(ours.node_id, event("node.duplicate_flag_cleared"))
    assert backend.stores.nodes.get(ours.node_id).duplicate_suspected_at is None
    assert backend.event_types() == ["node.duplicate_flag_cleared"]


def test_nodes_forget_duplicate_time_partner_flagged_meanwhile_is_refused(backend: Backend) -> None:
    ours = _seeded(backend, duplicate_suspected_at=NOW - 5)
    backend.meanwhile("nodes.forget_duplicate_time", "nodes", ours.node_id, duplicate_partners={"node_" + "4" * 32})
    backend.refused(lambda: backend.stores.nodes.forget_duplicate_time(ours.node_id, event()))


def test_nodes_forget_duplicate_time_node_gone_is_refused(backend: Backend) -> None:
    ours = _seeded(backend, duplicate_suspected_at=NOW - 5)
    backend.meanwhile_delete("nodes.forget_duplicate_time", "nodes", ours.node_id)
    backend.refused(lambda: backend.stores.nodes.forget_duplicate_time(ours.node_id, event()))


# --- revoke_credential ------------------------------------------------------------------


def test_nodes_revoke_credential_active_is_revoked(backend: Backend) -> None:
    ours = _seeded(backend)
    backend.stores.nodes.revoke_credential(ours.node_id, NOW, event("credential.revoked"))
    stored = backend.stores.nodes.get(ours.node_id)
    assert (stored.credential_state, stored.credential_revoked_at) == ("revoked", NOW)
    assert backend.event_types() == ["credential.revoked"]


def test_nodes_revoke_credential_revoked_meanwhile_is_refused(backend: Backend) -> None:
    ours = _seeded(backend)
    revoked = {"credential_state": "revoked", "credential_revoked_at": NOW - 1}
    backend.meanwhile("nodes.revoke_credential", "nodes", ours.node_id, **revoked)
    backend.refused(lambda: backend.stores.nodes.revoke_credential(ours.node_id, NOW, event()))


def test_nodes_revoke_credential_node_gone_is_refused(backend: Backend) -> None:
    ours = _seeded(backend)
    backend.meanwhile_delete("nodes.revoke_credential", "nodes", ours.node_id)
    backend.refused(lambda: backend.stores.nodes.revoke_credential(ours.node_id, NOW, event()))


# --- write_gpu_state ---------------------------------------------------------------------

_BOOK = {
    "boot_id": "b",
    "reported": {},
    "latches": {},
    "rechecks": {},
    "drained": True,
    "drained_gpus": [],
    "known": [],
}


def _with_inventory(backend: Backend, **fields: Any) -> Any:
    ours = _seeded(backend)
    backend.seed(inventory(ours.node_id, **fields))
    return ours


@pytest.mark.parametrize("as_agent", [True, False], ids=["agent", "admin"])
def test_nodes_write_gpu_state_first_revision_is_written_with_the_block_bits(backend: Backend, as_agent: bool) -> None:
    ours = _with_inventory(backend)
    writer = holder(ours) if as_agent else None
    backend.stores.nodes.write_gpu_state(ours.node_id, _BOOK, 1, 3, writer, event("gpu.state_changed"))
    stored = backend.stores.nodes.get_inventory(ours.node_id)
    assert (stored.gpu_state, stored.gpu_revision, stored.revision) == (_BOOK, 1, "rev-1")
    assert backend.stores.nodes.get(ours.node_id).gpu_blocks == 3
    assert backend.event_types() == ["gpu.state_changed"]
    backend.stores.nodes.write_gpu_state(ours.node_id, {**_BOOK, "drained": False}, 2, 0, writer, event())
    assert backend.stores.nodes.get(ours.node_id).gpu_blocks is None  # 0 removes the bits


@pytest.mark.parametrize("revision", [1, 3], ids=["written_meanwhile", "skipped_one"])
def test_nodes_write_gpu_state_at_another_revision_is_refused(backend: Backend, revision: int) -> None:
    ours = _with_inventory(backend, gpu_state=_BOOK, gpu_revision=1)
    backend.refused(lambda: backend.stores.nodes.write_gpu_state(ours.node_id, _BOOK, revision, 1, None, event()))


@pytest.mark.parametrize("change", CREDENTIAL_MOVES)
def test_nodes_write_gpu_state_by_an_agent_that_moved_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    ours = _with_inventory(backend)
    backend.meanwhile("nodes.write_gpu_state", "nodes", ours.node_id, **change)
    backend.refused(lambda: backend.stores.nodes.write_gpu_state(ours.node_id, _BOOK, 1, 1, holder(ours), event()))


def test_nodes_write_gpu_state_by_an_admin_for_a_node_that_is_gone_is_refused(backend: Backend) -> None:
    gone = node()  # never stored: only its inventory is
    backend.seed(inventory(gone.node_id))
    backend.refused(lambda: backend.stores.nodes.write_gpu_state(gone.node_id, _BOOK, 1, 1, None, event()))


def test_nodes_write_gpu_state_without_an_inventory_is_refused(backend: Backend) -> None:
    ours = _seeded(backend)
    backend.refused(lambda: backend.stores.nodes.write_gpu_state(ours.node_id, _BOOK, 1, 1, None, event()))


def test_nodes_replace_inventory_keeps_the_gpu_state(backend: Backend) -> None:
    ours = _with_inventory(backend, gpu_state=_BOOK, gpu_revision=4)
    replacement = inventory(ours.node_id, revision="rev-2")
    backend.stores.nodes.replace_inventory(holder(ours), replacement, "rev-1", {"cpu"}, event())
    stored = backend.stores.nodes.get_inventory(ours.node_id)
    assert (stored.revision, stored.gpu_state, stored.gpu_revision) == ("rev-2", _BOOK, 4)
