"""The work store's contract, guard by guard, on both implementations (docs/TESTING.md, "Store guards")."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.domain.records import GPU_BLOCKED, NODE_DRAINED
from chalicelib.stores.contract import LeaseCheck

from tests.contract.records import HEARTBEAT_CUTOFF, NOW, event, holder, node, work
from tests.support.store_backends import Backend

ERROR = {"attempt": 1, "reason": "contract"}
RESULT = {"sha256": "b" * 64, "size": 3, "key": "work-results/contract.json"}


# --- create -----------------------------------------------------------------------------


def test_work_create_new_id_is_stored_with_its_event(backend: Backend) -> None:
    item = work()
    backend.stores.work.create(item, event("work.submitted"))
    assert backend.stores.work.get(item.work_id) == item
    assert backend.stores.work.queue_front("echo", 5) == [item]
    assert backend.event_types() == ["work.submitted"]


def test_work_create_existing_id_is_refused(backend: Backend) -> None:
    item = work()
    backend.seed(item)
    backend.refused(lambda: backend.stores.work.create(work(work_id=item.work_id, max_attempts=9), event()))


# --- lease ------------------------------------------------------------------------------


def _queued_and_node(backend: Backend, **fields: Any) -> tuple[Any, Any]:
    claimant, item = node(capabilities={"echo", "cpu"}, **fields), work()
    backend.seed(claimant)
    backend.seed(item)
    return backend.stores.work.get(item.work_id), claimant


def _lease(backend: Backend, item: Any, claimant: Any, parked_at: float | None = None) -> Any:
    return backend.stores.work.lease(
        item, holder(claimant), HEARTBEAT_CUTOFF, NOW + 300, NOW, event("work.leased"), parked_at=parked_at
    )


def test_work_lease_to_a_node_with_only_a_gpu_blocked_is_leased(backend: Backend) -> None:
    """A latched or drained GPU leaves the node's other slots serving: the agent claims only for
    slots it may use, and only a drained node is refused here."""
    item, claimant = _queued_and_node(backend)
    backend.meanwhile("work.lease", "nodes", claimant.node_id, gpu_blocks=GPU_BLOCKED)
    assert _lease(backend, item, claimant).status == "leased"


def test_work_lease_queued_item_online_holder_is_leased(backend: Backend) -> None:
    item, claimant = _queued_and_node(backend)
    written = _lease(backend, item, claimant)
    assert backend.stores.work.get(item.work_id) == written
    assert (written.status, written.epoch, written.attempts, written.node_id) == ("leased", 1, 1, claimant.node_id)
    assert backend.stores.work.leases_held_by(claimant.node_id) == [written]
    assert backend.stores.work.queue_front("echo", 5) == []
    assert backend.event_types() == ["work.leased"]


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("work", {"status": "cancelled"}),  # cancelled at the epoch read
        ("work", {"epoch": 2, "attempts": 1}),  # leased and requeued meanwhile: queued again, one epoch on
        ("nodes", {"credential_sha256": "f" * 64}),  # the node re-enrolled: another credential
        ("nodes", {"credential_state": "revoked"}),
        ("nodes", {"liveness": "stale"}),
        ("nodes", {"last_heartbeat_at": HEARTBEAT_CUTOFF}),  # silent since the cutoff (at it: not after)
        ("nodes", {"capabilities": {"ocr", "cpu"}}),  # its inventory no longer lists the item's capability
        ("nodes", {"capabilities": None}),
        ("nodes", {"parked_at": NOW - 5}),  # parked since the claim's view was read
        ("nodes", {"gpu_blocks": NODE_DRAINED}),  # an admin drained it
        ("nodes", {"gpu_blocks": NODE_DRAINED | GPU_BLOCKED}),
    ],
    ids=[
        "status",
        "epoch",
        "credential",
        "revoked",
        "not_online",
        "heartbeat_too_old",
        "capability_dropped",
        "no_capabilities",
        "parked",
        "drained",
        "drained_and_gpu_blocked",
    ],
)
def test_work_lease_moved_meanwhile_is_refused(backend: Backend, kind: str, change: dict[str, Any]) -> None:
    item, claimant = _queued_and_node(backend)
    backend.meanwhile("work.lease", kind, item.work_id if kind == "work" else claimant.node_id, **change)
    refused = backend.refused(lambda: _lease(backend, item, claimant))
    # which part failed: the service reads the node only when the node's check failed
    assert refused.failed == (("work",) if kind == "work" else ("node",))


@pytest.mark.parametrize(
    ("stored", "claimed"),
    [(NOW - 20, NOW - 40), (None, NOW - 20)],
    ids=["parked-again-since", "unparked-since"],
)
def test_work_lease_by_a_view_of_another_parking_is_refused(
    backend: Backend, stored: float | None, claimed: float | None
) -> None:
    item, claimant = _queued_and_node(backend, parked_at=stored)
    refused = backend.refused(lambda: _lease(backend, item, claimant, parked_at=claimed))
    assert refused.failed == ("node",)


def test_work_lease_by_a_parked_node_that_says_so_is_leased(backend: Backend) -> None:
    item, claimant = _queued_and_node(backend, parked_at=NOW - 20)
    written = _lease(backend, item, claimant, parked_at=NOW - 20)
    assert (written.status, written.node_id) == ("leased", claimant.node_id)


# --- writes of a lease: renew, complete, requeue, bury -----------------------------------

LEASE_WRITES = ["renew", "complete", "requeue", "bury"]


EVENTS = {"renew": "work.renewed", "complete": "work.completed", "requeue": "work.requeued", "bury": "work.dead"}


def _lease_write(backend: Backend, method: str, item: Any, owner: Any, check: LeaseCheck | None = None) -> Any:
    work_store = backend.stores.work
    if owner is None:  # the sweep: no holder credential to check
        assert check is not None
        return getattr(work_store, method)(item, check, ERROR, NOW, event(EVENTS[method]))
    ours = holder(owner)
    if method == "renew":
        return work_store.renew(item, ours, NOW + 600, NOW, event(EVENTS[method]))
    if method == "complete":
        return work_store.complete(item, ours, RESULT, NOW, event(EVENTS[method]))
    check = check or LeaseCheck.of(ours)
    return getattr(work_store, method)(item, check, ERROR, NOW, event(EVENTS[method]))


def _leased(backend: Backend) -> tuple[Any, Any]:
    owner = node()
    item = work("leased", node_id=owner.node_id)
    backend.seed(owner)
    backend.seed(item)
    return backend.stores.work.get(item.work_id), owner


EXPECTED: dict[str, dict[str, Any]] = {
    "renew": {"status": "leased", "lease_expires_at": NOW + 600},
    "complete": {"status": "succeeded", "result": RESULT, "lease_expires_at": None, "finished_at": NOW},
    "requeue": {"status": "queued", "errors": [ERROR], "lease_expires_at": None, "queued_at": NOW},
    "bury": {"status": "dead", "errors": [ERROR], "lease_expires_at": None, "finished_at": NOW},
}


@pytest.mark.parametrize("counted", [True, False], ids=["counted", "node-fault"])
def test_work_requeue_counts_the_attempt_unless_told_not_to(backend: Backend, counted: bool) -> None:
    item, owner = _leased(backend)
    check = LeaseCheck.of(holder(owner))
    written = backend.stores.work.requeue(item, check, ERROR, NOW, event("work.requeued"), counted=counted)
    stored = backend.stores.work.get(item.work_id)
    assert stored == written and stored.status == "queued"
    assert stored.attempts == (item.attempts if counted else item.attempts - 1)


@pytest.mark.parametrize("method", LEASE_WRITES)
def test_work_lease_write_by_holder_is_written(backend: Backend, method: str) -> None:
    item, owner = _leased(backend)
    written = _lease_write(backend, method, item, owner)
    stored = backend.stores.work.get(item.work_id)
    assert stored == written
    assert {name: getattr(stored, name) for name in EXPECTED[method]} == EXPECTED[method]
    still_held = backend.stores.work.leases_held_by(owner.node_id)
    assert still_held == ([written] if method == "renew" else [])
    assert backend.stores.work.queue_front("echo", 5) == ([written] if method == "requeue" else [])
    assert backend.event_types() == [EVENTS[method]]


@pytest.mark.parametrize("method", LEASE_WRITES)
@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("work", {"status": "succeeded"}),  # finished at the epoch read
        ("work", {"epoch": 2}),  # the lease expired and the same node claimed the item again
        ("work", {"status": "leased", "node_id": "node_" + "9" * 32}),  # another holder at this epoch
        ("nodes", {"credential_sha256": "f" * 64}),
        ("nodes", {"credential_state": "revoked"}),
    ],
    ids=["status", "epoch", "holder", "credential", "revoked"],
)
def test_work_lease_write_moved_meanwhile_is_refused(
    backend: Backend, method: str, kind: str, change: dict[str, Any]
) -> None:
    item, owner = _leased(backend)
    backend.meanwhile(f"work.{method}", kind, item.work_id if kind == "work" else owner.node_id, **change)
    backend.refused(lambda: _lease_write(backend, method, item, owner))


@pytest.mark.parametrize("method", ["requeue", "bury"])
def test_work_expired_lease_failed_by_the_sweep_is_written(backend: Backend, method: str) -> None:
    item, owner = _leased(backend)
    check = LeaseCheck(expired_by=item.lease_expires_at)
    written = _lease_write(backend, method, item, owner, check)
    assert backend.stores.work.get(item.work_id) == written
    assert written.status == ("queued" if method == "requeue" else "dead")


@pytest.mark.parametrize("method", ["requeue", "bury"])
@pytest.mark.parametrize(
    "change",
    [{"status": "succeeded"}, {"epoch": 2}],
    ids=["status", "epoch"],
)
def test_work_expired_lease_finished_meanwhile_is_refused(
    backend: Backend, method: str, change: dict[str, Any]
) -> None:
    """The sweep's check names no holder: the status and the epoch alone fence it."""
    item, owner = _leased(backend)
    backend.meanwhile(f"work.{method}", "work", item.work_id, **change)
    backend.refused(lambda: _lease_write(backend, method, item, owner, LeaseCheck(expired_by=item.lease_expires_at)))


@pytest.mark.parametrize("method", ["requeue", "bury"])
def test_work_expired_lease_renewed_meanwhile_is_refused(backend: Backend, method: str) -> None:
    item, owner = _leased(backend)
    check = LeaseCheck(expired_by=item.lease_expires_at)
    backend.meanwhile(f"work.{method}", "work", item.work_id, lease_expires_at=item.lease_expires_at + 0.001)
    backend.refused(lambda: _lease_write(backend, method, item, owner, check))


# --- cancel -----------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["queued", "leased"])
def test_work_cancel_unchanged_item_is_cancelled(backend: Backend, status: str) -> None:
    item = work(status, node_id="node_" + "1" * 32 if status == "leased" else None)
    backend.seed(item)
    written = backend.stores.work.cancel(backend.stores.work.get(item.work_id), NOW, event("work.cancelled"))
    assert backend.stores.work.get(item.work_id) == written
    assert (written.status, written.queued_at, written.lease_expires_at) == ("cancelled", None, None)
    assert backend.stores.work.queue_front("echo", 5) == []
    assert backend.stores.work.expired_leases(NOW + 1000, 5) == []
    assert backend.event_types() == ["work.cancelled"]


@pytest.mark.parametrize(
    "change",
    [{"status": "leased", "node_id": "node_" + "2" * 32}, {"epoch": 1}],
    ids=["status", "epoch"],
)
def test_work_cancel_moved_meanwhile_is_refused(backend: Backend, change: dict[str, Any]) -> None:
    item = work()
    backend.seed(item)
    backend.meanwhile("work.cancel", "work", item.work_id, **change)
    backend.refused(lambda: backend.stores.work.cancel(item, NOW, event()))


# --- the queue and the lease index, however the store divides them ----------------------


def test_work_queue_front_reaches_every_queued_item_then_says_none(backend: Backend) -> None:
    """The store may keep a queue in parts (the DynamoDB store: 16 index shards, each item in a
    random one): leasing what the front offers, one at a time, still takes every queued item, and
    the front is empty only when none is left."""
    claimant = node(capabilities={"echo"})
    backend.seed(claimant)
    items = [work(queued_at=NOW - 100 + n) for n in range(12)]
    for item in items:
        backend.stores.work.create(item, event("work.submitted"))
    taken = set()
    for _ in items:
        front = backend.stores.work.queue_front("echo", 3)
        assert front and len(front) <= 3
        assert [item.queued_at for item in front] == sorted(item.queued_at for item in front)  # oldest first
        assert backend.stores.work.any_queued("echo")
        taken.add(_lease(backend, front[0], claimant).work_id)
    assert taken == {item.work_id for item in items}
    assert backend.stores.work.queue_front("echo", 3) == []
    assert not backend.stores.work.any_queued("echo")


def test_work_expired_leases_finds_every_expired_lease_earliest_first(backend: Backend) -> None:
    """The DynamoDB store spreads leases over 16 index partitions: the sweep still gets the
    earliest expired ones, at most ``limit``, and none that has not expired."""
    claimant = node(capabilities={"echo"})
    backend.seed(claimant)
    expiries = [NOW - 50 + n for n in range(10)] + [NOW + 500]
    for until in expiries:
        item = work()
        backend.stores.work.create(item, event("work.submitted"))
        backend.stores.work.lease(item, holder(claimant), HEARTBEAT_CUTOFF, until, NOW - 60, event("work.leased"))
    expired = backend.stores.work.expired_leases(NOW, 100)
    assert [item.lease_expires_at for item in expired] == expiries[:10]
    assert [item.lease_expires_at for item in backend.stores.work.expired_leases(NOW, 3)] == expiries[:3]


# --- the claim-time slot count ------------------------------------------------------------------


def _busy(backend: Backend, node_id: str) -> int | None:
    return backend.stores.nodes.get(node_id).slots_busy


@pytest.mark.parametrize(("schedulable", "busy"), [(None, None), (2, 1), (1, None), (3, -1)])
def test_work_lease_with_a_free_slot_takes_it(backend: Backend, schedulable: int | None, busy: int | None) -> None:
    item, claimant = _queued_and_node(backend, slots_schedulable=schedulable, slots_busy=busy)
    assert _lease(backend, item, claimant).status == "leased"
    assert _busy(backend, claimant.node_id) == (busy or 0) + 1


@pytest.mark.parametrize(("schedulable", "busy"), [(1, 1), (0, None), (2, 3)], ids=["full", "none_usable", "over"])
def test_work_lease_without_a_free_slot_is_refused_on_the_node(
    backend: Backend, schedulable: int, busy: int | None
) -> None:
    item, claimant = _queued_and_node(backend)
    backend.meanwhile("work.lease", "nodes", claimant.node_id, slots_schedulable=schedulable, slots_busy=busy)
    refused = backend.refused(lambda: _lease(backend, item, claimant))
    assert refused.failed == ("node",)


@pytest.mark.parametrize("method", LEASE_WRITES)
def test_work_lease_write_frees_the_holders_slot_unless_it_renews(backend: Backend, method: str) -> None:
    owner = node(slots_schedulable=2, slots_busy=2)
    item = work("leased", node_id=owner.node_id)
    backend.seed(owner)
    backend.seed(item)
    _lease_write(backend, method, backend.stores.work.get(item.work_id), owner)
    assert _busy(backend, owner.node_id) == (2 if method == "renew" else 1)


@pytest.mark.parametrize("method", ["requeue", "bury"])
def test_work_expired_lease_of_a_holder_that_is_gone_is_still_released(backend: Backend, method: str) -> None:
    """The sweep frees a slot where the holder exists, and never gets stuck where it does not."""
    gone = "node_" + "7" * 32
    item = work("leased", node_id=gone)
    backend.seed(item)
    check = LeaseCheck(expired_by=item.lease_expires_at)
    written = _lease_write(backend, method, backend.stores.work.get(item.work_id), None, check)
    assert written.status == ("queued" if method == "requeue" else "dead")
    assert backend.stores.nodes.get(gone) is None  # no node item made up to hold a count


def test_work_cancel_of_a_leased_item_whose_holder_is_gone_makes_no_node(backend: Backend) -> None:
    gone = "node_" + "6" * 32
    item = work("leased", node_id=gone)
    backend.seed(item)
    backend.stores.work.cancel(backend.stores.work.get(item.work_id), NOW, event("work.cancelled"))
    assert backend.stores.nodes.get(gone) is None


def test_work_cancel_of_a_leased_item_frees_its_holders_slot(backend: Backend) -> None:
    owner = node(slots_schedulable=1, slots_busy=1)
    item = work("leased", node_id=owner.node_id)
    backend.seed(owner)
    backend.seed(item)
    backend.stores.work.cancel(backend.stores.work.get(item.work_id), NOW, event("work.cancelled"))
    assert _busy(backend, owner.node_id) == 0
