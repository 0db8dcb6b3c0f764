"""dispatch: park and wake over the push channel, and the cancel notice, decided against the in-memory
stores: a node parks once when it becomes idle, a submit wakes at most WAKE_PER_ITEM parked nodes of
its capability (one message each), a gone connection is cleared, and no interleaving of a submit
with a node that is about to park leaves an item queued while a parked node sleeps."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.services import dispatch, work
from chalicelib.services.known_callers import ClaimView, KnownCallers
from chalicelib.services.queue_fronts import QueueFronts
from modelforge_protocol import work as protocol

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, node_record

ECHO, OCR = protocol.ECHO, protocol.OCR
WAKE = {"v": 1, "type": "wake"}


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


@pytest.fixture(autouse=True)
def oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work.random, "shuffle", lambda items: None)


def _connected(stores: MemoryStores, capabilities: set[str] | None = None, *, open_: bool = True) -> tuple[Agent, str]:
    """An online node serving ``capabilities`` (ECHO unless given) with a channel connection."""
    agent = Agent()
    connection = f"conn-{agent.node_id[-8:]}="
    stores.nodes.seed(
        node_record(
            agent, capabilities=capabilities or {ECHO}, channel_connection_id=connection, channel_connected_at=NOW
        )
    )
    if open_:
        stores.channel.open(connection)
    return agent, connection


def _parked(
    stores: MemoryStores, capabilities: set[str] | None = None, now: float = NOW, **options: Any
) -> tuple[Agent, str]:
    agent, connection = _connected(stores, capabilities, **options)
    assert work.claim(stores, SETTINGS, agent.caller, now) is None
    assert stores.nodes.records[agent.node_id].parked_at is not None
    return agent, connection


def _submit(stores: MemoryStores, capability: str = ECHO) -> str:
    document = {"image_base64": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"} if capability == OCR else {"text": "hi"}
    return work.submit(stores, typed.submit_work({"capability": capability, "input": document}), NOW).item.work_id


# --- park ----------------------------------------------------------------------------------------


def test_claim_with_nothing_queued_parks_a_connected_node_with_one_write(stores: MemoryStores) -> None:
    agent, _ = _connected(stores, {ECHO, OCR})
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None
    assert stores.nodes.records[agent.node_id].parked_at == NOW
    assert stores.journal.writes == 1 and stores.journal.events == []
    assert [p.node_id for p in stores.parking.parked(ECHO, 8)] == [p.node_id for p in stores.parking.parked(OCR, 8)]


def test_claim_of_a_parked_node_with_nothing_queued_writes_nothing(stores: MemoryStores) -> None:
    agent, _ = _parked(stores)
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW + 5) is None
    assert stores.journal.writes == 0


def test_claim_of_a_node_without_a_channel_never_parks(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, capabilities={ECHO}))
    stores.journal.reset_counts()
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is None
    assert stores.journal.writes == 0 and stores.parking.items == {}


def test_park_that_loses_to_a_reconnect_reports_not_parked(stores: MemoryStores) -> None:
    agent, _ = _connected(stores)
    node = stores.nodes.get(agent.node_id)
    assert node is not None
    stores.journal.before_next(
        "parking.park", lambda: setattr(stores.nodes.records[agent.node_id], "channel_connection_id", "newer=")
    )
    holder = work.Holder(agent.node_id, agent.credential_sha256)
    assert dispatch.park(stores, node, holder, [ECHO], NOW) is False
    assert stores.parking.items == {}


def test_claim_that_finds_an_item_after_parking_takes_it_and_unparks(stores: MemoryStores) -> None:
    agent, _ = _connected(stores)
    work_id: list[str] = []
    stores.journal.before_next("parking.park", lambda: work_id.append(_submit(stores)))  # lands before the re-check
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW)
    assert claimed is not None and claimed.item.work_id == work_id[0]
    assert stores.nodes.records[agent.node_id].parked_at is None and stores.parking.items == {}


def test_claim_on_a_view_of_a_node_parked_since_loses_one_write_then_takes_the_item_and_unparks(
    stores: MemoryStores,
) -> None:
    """Another instance parked the node after this one read it: the lease refuses the view's
    "not parked", the node is read, and the next try leases with the stamp and un-parks it."""
    agent, _ = _connected(stores)
    known = KnownCallers()
    known.remember_view(
        (agent.node_id, agent.credential_sha256), ClaimView.of(stores.nodes.records[agent.node_id], NOW)
    )
    work_id = _submit(stores)  # nobody parked: nobody woken
    stores.nodes.records[agent.node_id].parked_at = NOW  # then parked by a claim on another instance
    stores.parking.items = {(ECHO, agent.node_id): dispatch.Parked(agent.node_id, frozenset({ECHO}), NOW)}
    stores.journal.reset_counts()
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW + 1, known)
    assert claimed is not None and claimed.item.work_id == work_id
    assert stores.journal.calls.count("work.lease") == 2 and stores.journal.calls.count("nodes.get") == 1
    assert stores.nodes.records[agent.node_id].parked_at is None and stores.parking.items == {}


def test_claim_that_parks_keeps_no_view_of_its_node(stores: MemoryStores) -> None:
    """A wake un-parks the node behind this instance's back: a parked view would cost the woken
    node's claim a lost write, so the next claim reads the node instead (the caller stays known)."""
    agent, _ = _connected(stores)
    known = KnownCallers()
    key = (agent.node_id, agent.credential_sha256)
    assert work.claim(stores, SETTINGS, agent.caller, NOW, known) is None
    assert stores.nodes.records[agent.node_id].parked_at is not None
    assert key in known and known.claim_view(key, NOW) is None


def test_claim_of_a_parked_node_that_takes_an_item_unparks_it(stores: MemoryStores) -> None:
    agent, connection = _parked(stores)
    stores.channel.drop(connection)  # the wake finds nobody: the item stays queued for the hint
    work_id = _submit(stores)
    stores.nodes.records[agent.node_id].parked_at = NOW  # parked again (another connection)
    stores.parking.items = {(ECHO, agent.node_id): dispatch.Parked(agent.node_id, frozenset({ECHO}), NOW)}
    stores.nodes.records[agent.node_id].channel_connection_id = "again="
    claimed = work.claim(stores, SETTINGS, agent.caller, NOW + 1)
    assert claimed is not None and claimed.item.work_id == work_id
    assert stores.nodes.records[agent.node_id].parked_at is None and stores.parking.items == {}


# --- wake ----------------------------------------------------------------------------------------


def test_submit_wakes_a_parked_node_of_its_capability_once(stores: MemoryStores) -> None:
    agent, connection = _parked(stores)
    _submit(stores)
    assert stores.channel.messages_to(connection) == [WAKE]
    assert stores.nodes.records[agent.node_id].parked_at is None
    _submit(stores)  # no longer parked: not woken again
    assert stores.channel.messages_to(connection) == [WAKE]


@pytest.mark.parametrize("parked", [0, 1, 2, 3, 5])
def test_k_parked_nodes_get_at_most_k_messages_per_item_and_other_capabilities_none(
    stores: MemoryStores, parked: int
) -> None:
    ours = [_parked(stores, {ECHO})[1] for _ in range(parked)]
    others = [_parked(stores, {OCR})[1] for _ in range(3)]
    stores.channel.sent.clear()
    _submit(stores, ECHO)
    received = [len(stores.channel.messages_to(connection)) for connection in ours]
    assert sum(received) == min(parked, dispatch.WAKE_PER_ITEM) and max(received, default=0) <= 1
    assert all(stores.channel.messages_to(connection) == [] for connection in others)


def test_wake_of_items_costs_in_proportion_to_items_never_to_the_fleet(stores: MemoryStores) -> None:
    for _ in range(30):
        _parked(stores, {OCR})
    _parked(stores, {ECHO})
    stores.journal.reset_counts()
    _submit(stores, ECHO)
    # one read of the parked ECHO nodes, one un-park, one node read, the item's write
    assert stores.journal.calls.count("parking.parked") == 1 and stores.journal.reads <= 2 + 1
    assert stores.journal.writes == 2


def test_wake_to_a_gone_connection_clears_it_and_wakes_the_next_parked_node(stores: MemoryStores) -> None:
    gone, gone_connection = _parked(stores, now=NOW - 1)  # parked longest: read first
    stores.channel.drop(gone_connection)
    nodes = [_parked(stores) for _ in range(2)]
    _submit(stores)
    assert stores.channel.gone == [gone_connection]
    assert stores.nodes.records[gone.node_id].channel_connection_id is None
    assert [len(stores.channel.messages_to(connection)) for _, connection in nodes] == [1, 1]


def test_wake_skips_a_node_another_waker_won(stores: MemoryStores) -> None:
    first, first_connection = _parked(stores, now=NOW - 1)
    second, second_connection = _parked(stores)
    stores.journal.before_next(
        "parking.unpark", lambda: setattr(stores.nodes.records[first.node_id], "parked_at", None)
    )
    assert dispatch.wake(stores, ECHO, NOW) == 1
    assert stores.channel.messages_to(first_connection) == []
    assert stores.channel.messages_to(second_connection) == [WAKE]


def test_wake_that_cannot_reach_the_channel_does_not_fail_the_submit(
    stores: MemoryStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    _parked(stores)

    def broken(connection_id: str, message: dict[str, Any]) -> bool:
        raise ConnectionError("management API unreachable")

    monkeypatch.setattr(stores.channel, "send", broken)
    work_id = _submit(stores)
    assert stores.work.records[work_id].status == "queued"


def test_wake_of_a_revoked_node_sends_nothing(stores: MemoryStores) -> None:
    agent, connection = _parked(stores)
    stores.nodes.records[agent.node_id].credential_state = "revoked"
    assert dispatch.wake(stores, ECHO, NOW) == 0
    assert stores.channel.messages_to(connection) == []


def test_a_retryable_failure_wakes_a_parked_node_for_the_requeued_item(stores: MemoryStores) -> None:
    holder, _ = _connected(stores)
    work_id = _submit(stores)
    claimed = work.claim(stores, SETTINGS, holder.caller, NOW)
    assert claimed is not None
    _, parked_connection = _parked(stores)
    request = typed.fail_work({"epoch": claimed.item.epoch, "reason": "worker restarted", "retryable": True})
    assert work.fail(stores, holder.caller, work_id, request, NOW + 1, None).status == "queued"
    assert stores.channel.messages_to(parked_connection) == [WAKE]


# --- cancel --------------------------------------------------------------------------------------


def test_cancel_of_a_leased_item_tells_its_holder_to_renew(stores: MemoryStores) -> None:
    agent, connection = _connected(stores)
    work_id = _submit(stores)
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is not None
    work.cancel(stores, work_id, NOW + 1)
    assert stores.channel.messages_to(connection) == [{"v": 1, "type": "cancel", "work_id": work_id}]


def test_cancel_of_a_queued_item_sends_nothing(stores: MemoryStores) -> None:
    _, connection = _connected(stores)
    work.cancel(stores, _submit(stores), NOW + 1)
    assert stores.channel.sent == []


def test_cancel_of_an_item_whose_holder_has_no_channel_still_cancels(stores: MemoryStores) -> None:
    agent = Agent()
    stores.nodes.seed(node_record(agent, capabilities={ECHO}))
    work_id = _submit(stores)
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is not None
    assert work.cancel(stores, work_id, NOW + 1).status == "cancelled"
    assert stores.channel.sent == []


def test_cancel_notice_to_a_gone_connection_clears_it(stores: MemoryStores) -> None:
    agent, connection = _connected(stores)
    work_id = _submit(stores)
    assert work.claim(stores, SETTINGS, agent.caller, NOW) is not None
    stores.channel.drop(connection)
    assert work.cancel(stores, work_id, NOW + 1).status == "cancelled"
    assert stores.nodes.records[agent.node_id].channel_connection_id is None


# --- no lost wake-up: every interleaving of a claim that parks with a submit ----------------------

#: The claim's steps (query, park, query again) and the submit's (write the item, read parked nodes).
CLAIM_STEPS, SUBMIT_STEPS = ("query", "park", "query"), ("write", "read_parked")


def _interleavings() -> list[tuple[str, ...]]:
    orders = set()
    for places in itertools.combinations(range(5), 2):
        claim_steps, submit_steps = iter(CLAIM_STEPS), iter(SUBMIT_STEPS)
        orders.add(tuple(next(submit_steps) if i in places else next(claim_steps) for i in range(5)))
    return sorted(orders)


class Steps:
    """Runs the store calls of a claim and a submit (in two threads) in one given order: each call
    waits for its turn; an actor that finishes early gives up its remaining turns."""

    def __init__(self, order: tuple[str, ...]) -> None:
        self.order = [(("claim" if step in CLAIM_STEPS else "submit"), step) for step in order]
        self.condition = threading.Condition()

    def gate(self, actor: str, step: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:
            with self.condition:
                turn = self.condition.wait_for(lambda: not self.order or self.order[0] == (actor, step), timeout=10)
                assert turn, f"{actor}.{step} never got its turn in {self.order}"
            try:
                return call(*args, **kwargs)
            finally:
                with self.condition:
                    if self.order and self.order[0] == (actor, step):
                        self.order.pop(0)
                    self.condition.notify_all()

        return gated

    def finished(self, actor: str) -> None:
        with self.condition:
            self.order = [turn for turn in self.order if turn[0] != actor]
            self.condition.notify_all()


def _race(
    stores: MemoryStores, order: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, start: str = "node-read"
) -> tuple[Agent, str, str]:
    agent, connection = _connected(stores)
    remembered, fronts = KnownCallers(), QueueFronts()
    if start == "node-view":  # the claim acts on a view an earlier claim left (its empty queue is judged on a read)
        node = stores.nodes.records[agent.node_id]
        remembered.remember_view((agent.node_id, agent.credential_sha256), ClaimView.of(node, NOW - 1))
    if start == "stale-front":  # the instance remembers a front whose item was cancelled since: one
        # lost try, then the same fresh reads (memory never says "empty")
        stale = work.submit(stores, typed.submit_work({"capability": ECHO, "input": {"text": "x"}}), NOW - 1).item
        work.cancel(stores, stale.work_id, NOW - 1)
        fronts.keep([ECHO], [stale], NOW - 1)
    steps = Steps(order)
    queue_read = "queue_front"  # the claim's queue read
    for name, actor, step, store in (
        (queue_read, "claim", "query", stores.work),
        ("park", "claim", "park", stores.parking),
        ("create", "submit", "write", stores.work),
        ("parked", "submit", "read_parked", stores.parking),
    ):
        monkeypatch.setattr(store, name, steps.gate(actor, step, getattr(store, name)))
    submitted: list[str] = []
    failures: list[BaseException] = []

    def run(actor: str, body: Callable[[], object]) -> None:
        try:
            body()
        except BaseException as error:  # reported below
            failures.append(error)
        finally:
            steps.finished(actor)

    threads = [
        threading.Thread(
            target=run, args=("claim", lambda: work.claim(stores, SETTINGS, agent.caller, NOW, remembered, fronts))
        ),
        threading.Thread(target=run, args=("submit", lambda: submitted.append(_submit(stores)))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not failures, failures
    assert fronts.remembered(ECHO) == 0  # a stale front was tried and forgotten; a fresh read left none
    return agent, connection, submitted[0]


@pytest.mark.parametrize("start", ["node-read", "node-view", "stale-front"])
@pytest.mark.parametrize("order", _interleavings(), ids=lambda order: "-".join(order))
def test_no_interleaving_of_submit_and_park_leaves_an_item_queued_while_a_parked_node_sleeps(
    stores: MemoryStores, order: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    agent, connection, work_id = _race(stores, order, monkeypatch, start)
    item = stores.work.records[work_id]
    woken = stores.channel.messages_to(connection) == [WAKE]
    assert (item.status == "leased" and item.node_id == agent.node_id) or woken, (item.status, woken)
    if woken:  # a woken node is no longer parked: its next claim takes the item
        assert stores.nodes.records[agent.node_id].parked_at is None
        assert work.claim(stores, SETTINGS, agent.caller, NOW + 1) is not None or item.status == "leased"


def test_interleavings_cover_every_order_of_the_five_steps() -> None:
    assert len(_interleavings()) == 10  # 5 choose 2


def test_without_the_re_check_an_interleaving_loses_the_wake_up(
    stores: MemoryStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a claim that parks but does not look again (dispatch.park reporting
    "not parked") leaves the item queued while the node sleeps in the order query, write,
    read_parked, park: the re-check is what closes the race."""
    real_park = dispatch.park

    def park_without_recheck(*args: Any) -> bool:
        real_park(*args)
        return False

    monkeypatch.setattr(dispatch, "park", park_without_recheck)
    agent, connection, work_id = _race(stores, ("query", "write", "read_parked", "park", "query"), monkeypatch)
    assert stores.work.records[work_id].status == "queued"
    assert stores.channel.messages_to(connection) == []
    assert stores.nodes.records[agent.node_id].parked_at is not None  # parked, asleep, with work queued
