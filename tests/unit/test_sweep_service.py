"""sweep: liveness transitions, the mass-stale hold and the online-node counter, decided against
the in-memory stores."""

from __future__ import annotations

import pytest
from chalicelib.domain import liveness
from chalicelib.domain import requests as typed
from chalicelib.domain.records import MASS_STALE_HOLD, ONLINE_NODES, FleetState
from chalicelib.services import nodes, sweep

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, heartbeat_body, node_record, settings_with

LATE = NOW - 100  # stale by now, not offline
FRESH = NOW - 5


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _seed(
    stores: MemoryStores, count: int, state: str = "online", last_heartbeat_at: float | None = LATE
) -> list[Agent]:
    agents = [Agent() for _ in range(count)]
    for agent in agents:
        stores.nodes.seed(node_record(agent, state=state, last_heartbeat_at=last_heartbeat_at))
    return agents


def _counter(stores: MemoryStores, count: int, revision: int = 1) -> None:
    stores.fleet.seed(FleetState(ONLINE_NODES, count=count, revision=revision))


def _liveness(stores: MemoryStores, agents: list[Agent]) -> list[str]:
    return [stores.nodes.records[agent.node_id].liveness for agent in agents]


# --- transitions --------------------------------------------------------------------------------


def test_late_online_nodes_go_stale_and_late_stale_nodes_go_offline(stores: MemoryStores) -> None:
    [going_stale] = _seed(stores, 1)
    [fresh] = _seed(stores, 1, last_heartbeat_at=FRESH)
    [going_offline] = _seed(stores, 1, state="stale", last_heartbeat_at=NOW - SETTINGS.offline_after_seconds)
    [staying_stale] = _seed(stores, 1, state="stale", last_heartbeat_at=LATE)
    _seed(stores, 1, state="pending", last_heartbeat_at=None)  # never in the sweep's index
    _counter(stores, 2, revision=5)

    report = sweep.run(stores, SETTINGS, NOW, clock=lambda: NOW)
    assert report == sweep.SweepReport(
        items_read=2, stale_candidates=1, offline_candidates=1, transitioned=2, skipped=0, held=False
    )
    stale = stores.nodes.records[going_stale.node_id]
    assert (stale.liveness, stale.liveness_changed_at) == ("stale", NOW)
    assert stale.liveness_shard == liveness.index_partition("stale", going_stale.node_id)
    offline = stores.nodes.records[going_offline.node_id]
    assert (offline.liveness, offline.liveness_shard) == ("offline", None)
    assert _liveness(stores, [fresh, staying_stale]) == ["online", "stale"]
    # only online -> stale moves the counter
    assert (stores.fleet.records[ONLINE_NODES].count, stores.fleet.records[ONLINE_NODES].revision) == (1, 6)
    assert sorted((e.type, e.subject["from"], e.subject["to"], e.subject["cause"]) for e in stores.journal.events) == [
        ("node.liveness_changed", "online", "stale", "sweep"),
        ("node.liveness_changed", "stale", "offline", "sweep"),
    ]


def test_a_silent_node_goes_online_stale_offline_over_successive_sweeps(stores: MemoryStores) -> None:
    [agent] = _seed(stores, 1, last_heartbeat_at=NOW)
    _counter(stores, 1)
    assert sweep.run(stores, SETTINGS, NOW + SETTINGS.stale_after_seconds - 1).transitioned == 0
    assert sweep.run(stores, SETTINGS, NOW + SETTINGS.stale_after_seconds).transitioned == 1
    assert _liveness(stores, [agent]) == ["stale"]
    assert sweep.run(stores, SETTINGS, NOW + SETTINGS.offline_after_seconds - 1).transitioned == 0
    assert sweep.run(stores, SETTINGS, NOW + SETTINGS.offline_after_seconds).transitioned == 1
    assert _liveness(stores, [agent]) == ["offline"]
    assert sweep.run(stores, SETTINGS, NOW + 10 * SETTINGS.offline_after_seconds).items_read == 0
    assert stores.fleet.records[ONLINE_NODES].count == 0


def test_a_node_late_by_its_bucket_but_not_by_its_heartbeat_is_read_and_skipped(stores: MemoryStores) -> None:
    heartbeat = NOW - SETTINGS.stale_after_seconds + 10
    [agent] = _seed(stores, 1, last_heartbeat_at=heartbeat)
    assert liveness.bucket(heartbeat, SETTINGS.sweep_bucket_seconds) <= NOW - SETTINGS.stale_after_seconds
    report = sweep.run(stores, SETTINGS, NOW)
    assert (report.stale_candidates, report.transitioned, report.skipped) == (1, 0, 1)
    assert _liveness(stores, [agent]) == ["online"] and stores.journal.events == []


def test_a_heartbeat_between_the_read_and_the_write_wins(stores: MemoryStores) -> None:
    [agent] = _seed(stores, 1)
    _counter(stores, 1)

    def heartbeat_arrives() -> None:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW)

    stores.journal.before_next("nodes.set_liveness", heartbeat_arrives)
    report = sweep.run(stores, SETTINGS, NOW)
    assert (report.stale_candidates, report.transitioned, report.skipped) == (1, 0, 1)
    node = stores.nodes.records[agent.node_id]
    assert (node.liveness, node.last_heartbeat_at) == ("online", NOW)
    assert stores.fleet.records[ONLINE_NODES].count == 1 and stores.journal.events == []


def test_a_sweep_with_nothing_late_reads_no_counter_and_writes_nothing(stores: MemoryStores) -> None:
    _seed(stores, 3, last_heartbeat_at=FRESH)
    report = sweep.run(stores, SETTINGS, NOW)
    assert report == sweep.SweepReport(0, 0, 0, 0, 0, False)
    assert stores.journal.writes == 0
    assert stores.journal.calls.count("fleet.get") == 1  # the hold, not the counter
    assert "nodes.count_in_state" not in stores.journal.calls
    assert ONLINE_NODES not in stores.fleet.records and MASS_STALE_HOLD not in stores.fleet.records


# --- the mass-stale hold ------------------------------------------------------------------------


def test_a_mass_stale_sweep_holds_logs_once_and_releases_when_it_clears(stores: MemoryStores) -> None:
    late = _seed(stores, 12)
    _seed(stores, 8, last_heartbeat_at=FRESH)
    _counter(stores, 20)

    report = sweep.run(stores, SETTINGS, NOW, clock=lambda: NOW + 2)
    assert report == sweep.SweepReport(
        items_read=13, stale_candidates=12, offline_candidates=0, transitioned=0, skipped=0, held=True
    )
    assert set(_liveness(stores, late)) == {"online"}
    hold = stores.fleet.records[MASS_STALE_HOLD]
    assert (hold.active, hold.since, hold.revision) == (True, NOW, 1)
    assert hold.detail == {"would_go_stale": 12, "online": 20}
    [held] = stores.journal.events
    assert (held.type, held.subject, held.at) == ("sweep.mass_stale_held", {"control": MASS_STALE_HOLD}, NOW + 2)

    # held again: nothing new is written or logged
    writes = stores.journal.writes
    assert sweep.run(stores, SETTINGS, NOW + 1).held
    assert stores.journal.writes == writes and stores.journal.event_types() == ["sweep.mass_stale_held"]

    # most late nodes come back: the hold is released and the rest go stale in the same sweep
    for agent in late[:10]:
        nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(heartbeat_body()), NOW + 2)
    report = sweep.run(stores, SETTINGS, NOW + 3, clock=lambda: NOW)
    assert (report.held, report.transitioned) == (False, 2)
    hold = stores.fleet.records[MASS_STALE_HOLD]
    assert (hold.active, hold.since, hold.revision) == (False, None, 2)
    [released] = stores.journal.events_of("sweep.mass_stale_released")
    assert released.at == NOW + 3  # the sweep's time when the clock is behind it
    assert _liveness(stores, late[10:]) == ["stale", "stale"]
    assert stores.fleet.records[ONLINE_NODES].count == 18

    sweep.run(stores, SETTINGS, NOW + 4)
    assert len(stores.journal.events_of("sweep.mass_stale_released")) == 1
    assert len(stores.journal.events_of("sweep.mass_stale_held")) == 1


@pytest.mark.parametrize(
    ("late", "fresh", "held"),
    [
        (sweep.MASS_STALE_MIN_NODES - 1, 0, False),  # every online node, but too few to matter
        (10, 10, False),  # exactly the fraction is not more than it
        (11, 9, True),
    ],
    ids=["too-few", "at-the-fraction", "over-the-fraction"],
)
def test_the_hold_needs_enough_nodes_and_more_than_the_fraction(
    stores: MemoryStores, late: int, fresh: int, held: bool
) -> None:
    _seed(stores, late)
    _seed(stores, fresh, last_heartbeat_at=FRESH)
    _counter(stores, late + fresh)
    report = sweep.run(stores, SETTINGS, NOW)
    assert report.held is held and report.transitioned == (0 if held else late)


def test_the_fraction_is_a_setting(stores: MemoryStores) -> None:
    _seed(stores, 10)
    _seed(stores, 10, last_heartbeat_at=FRESH)
    _counter(stores, 20)
    assert sweep.run(stores, settings_with(MODELFORGE_SWEEP_MASS_STALE_FRACTION="0.4"), NOW).held


def test_a_hold_lost_to_another_sweep_still_holds_and_logs_nothing_of_its_own(stores: MemoryStores) -> None:
    late = _seed(stores, 12)
    _counter(stores, 12)

    def other_sweep_holds_first() -> None:
        stores.fleet.records[MASS_STALE_HOLD] = FleetState(MASS_STALE_HOLD, active=True, since=NOW - 1, revision=1)

    stores.journal.before_next("fleet.put", other_sweep_holds_first)
    report = sweep.run(stores, SETTINGS, NOW)
    assert (report.held, report.transitioned) == (True, 0)
    assert stores.fleet.records[MASS_STALE_HOLD].since == NOW - 1  # the other sweep's write stands
    assert stores.journal.events == [] and set(_liveness(stores, late)) == {"online"}


def test_a_release_lost_to_another_sweeps_hold_holds_too(stores: MemoryStores) -> None:
    late = _seed(stores, 2)
    _counter(stores, 2)
    stores.fleet.seed(FleetState(MASS_STALE_HOLD, active=True, since=NOW - 60, revision=1))

    def other_sweep_holds_again() -> None:
        stores.fleet.records[MASS_STALE_HOLD] = FleetState(MASS_STALE_HOLD, active=True, since=NOW - 1, revision=2)

    stores.journal.before_next("fleet.put", other_sweep_holds_again)
    report = sweep.run(stores, SETTINGS, NOW)
    assert (report.held, report.transitioned) == (True, 0)
    assert stores.journal.events == [] and _liveness(stores, late) == ["online", "online"]


def test_a_release_lost_to_another_sweeps_release_goes_on(stores: MemoryStores) -> None:
    late = _seed(stores, 2)
    _counter(stores, 2)
    stores.fleet.seed(FleetState(MASS_STALE_HOLD, active=True, since=NOW - 60, revision=1))

    def other_sweep_releases_first() -> None:
        stores.fleet.records[MASS_STALE_HOLD] = FleetState(MASS_STALE_HOLD, active=False, revision=2)

    stores.journal.before_next("fleet.put", other_sweep_releases_first)
    report = sweep.run(stores, SETTINGS, NOW)
    assert (report.held, report.transitioned) == (False, 2)
    assert stores.journal.events_of("sweep.mass_stale_released") == []
    assert _liveness(stores, late) == ["stale", "stale"]


# --- the online-node counter --------------------------------------------------------------------


@pytest.mark.parametrize("counter", [None, 5], ids=["missing", "smaller-than-the-late-nodes"])
def test_the_sweep_recounts_a_counter_that_cannot_be_right(stores: MemoryStores, counter: int | None) -> None:
    _seed(stores, 12)
    _seed(stores, 8, last_heartbeat_at=FRESH)
    if counter is not None:
        _counter(stores, counter, revision=3)
    report = sweep.run(stores, SETTINGS, NOW, clock=lambda: NOW + 1)
    assert report.held and report.items_read == 12 + 1 + 20
    stored = stores.fleet.records[ONLINE_NODES]
    assert (stored.count, stored.revision, stored.updated_at) == (20, 4 if counter else 1, NOW)
    [repaired] = stores.journal.events_of("sweep.online_counter_repaired")
    assert (repaired.subject, repaired.at) == ({"control": ONLINE_NODES}, NOW + 1)


def test_a_counter_large_enough_is_trusted_without_a_recount(stores: MemoryStores) -> None:
    _seed(stores, 12)
    _counter(stores, 100)  # wrong, but it cannot be proved wrong by the late nodes
    report = sweep.run(stores, SETTINGS, NOW)
    assert (report.held, report.items_read) == (False, 13)
    assert "nodes.count_in_state" not in stores.journal.calls
    assert stores.journal.events_of("sweep.online_counter_repaired") == []


def test_a_recount_that_a_transition_overtook_is_skipped(stores: MemoryStores) -> None:
    _seed(stores, 12)
    _counter(stores, 3, revision=3)
    stores.journal.before_next("fleet.recount_online_nodes", lambda: stores.fleet.add_online(+1))
    report = sweep.run(stores, SETTINGS, NOW)
    assert report.held  # decided on the recount (12 of 12)
    stored = stores.fleet.records[ONLINE_NODES]
    assert (stored.count, stored.revision) == (4, 4)  # the transition's ADD stands
    assert stores.journal.events_of("sweep.online_counter_repaired") == []


@pytest.mark.parametrize("counter", [None, FleetState(ONLINE_NODES, count=7, revision=4), FleetState(ONLINE_NODES)])
def test_repair_sets_the_counter_to_the_online_index(stores: MemoryStores, counter: FleetState | None) -> None:
    _seed(stores, 3, last_heartbeat_at=FRESH)
    _seed(stores, 2, state="stale")
    if counter is not None:
        stores.fleet.seed(counter)
    assert sweep.repair_online_counter(stores, NOW, clock=lambda: NOW) == 3
    stored = stores.fleet.records[ONLINE_NODES]
    assert (stored.count, stored.revision) == (3, (counter.revision or 0) + 1 if counter else 1)
    assert stores.journal.event_types() == ["sweep.online_counter_repaired"]


def test_repair_skips_when_the_counter_moved_and_still_returns_the_count(stores: MemoryStores) -> None:
    _seed(stores, 3, last_heartbeat_at=FRESH)
    _counter(stores, 9, revision=2)
    stores.journal.before_next("fleet.recount_online_nodes", lambda: stores.fleet.add_online(-1))
    assert sweep.repair_online_counter(stores, NOW) == 3
    assert (stores.fleet.records[ONLINE_NODES].count, stores.fleet.records[ONLINE_NODES].revision) == (8, 3)
    assert stores.journal.events == []
