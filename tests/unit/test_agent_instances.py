"""Two agents on one identity (issue 21): heartbeats carry the agent process's random
``agent_instance_id``. A restart changes it once and flags nothing; heartbeats that go back to the
instance before within 3 heartbeat intervals flag the node in readiness and the node view. The
steady heartbeat still costs exactly one write; an agent that sends no id changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.api import views
from chalicelib.domain import requests as typed
from chalicelib.services import duplicate_identity, listing, nodes, readiness
from chalicelib.services.known_callers import KnownCallers

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, Agent, heartbeat_body, node_record

A, B, C = "a" * 32, "b" * 32, "c" * 32
#: what the node item keeps of each
FA, FB, FC = "a" * 8, "b" * 8, "c" * 8
#: SETTINGS hand out a 15 s interval: the window is 45 s
WINDOW = 45.0


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


@pytest.fixture()
def agent(stores: MemoryStores) -> Agent:
    seeded = Agent()
    stores.nodes.seed(node_record(seeded, state="online"))
    return seeded


def _beat(stores: MemoryStores, agent: Agent, at: float, instance: str | None, known: KnownCallers) -> None:
    body: dict[str, Any] = heartbeat_body()
    if instance is not None:
        body["agent_instance_id"] = instance
    nodes.heartbeat(stores, SETTINGS, agent.caller, typed.heartbeat(body), at, known)


def _state(stores: MemoryStores, agent: Agent) -> duplicate_identity.InstanceState | None:
    return duplicate_identity.InstanceState.of(stores.nodes.records[agent.node_id].agent_instance)


def _flagged(stores: MemoryStores, agent: Agent, at: float) -> float | None:
    return duplicate_identity.duplicate_instances_at(stores.nodes.records[agent.node_id], SETTINGS, at)


def _identity_check(stores: MemoryStores, agent: Agent, at: float) -> readiness.Check:
    return next(c for c in readiness.check(stores, SETTINGS, agent.node_id, at).checks if c.name == "identity_unique")


def test_the_window_is_three_heartbeat_intervals() -> None:
    assert duplicate_identity.instance_window_seconds(SETTINGS) == WINDOW


def test_one_instance_costs_one_write_per_heartbeat_and_flags_nothing(stores: MemoryStores, agent: Agent) -> None:
    known = KnownCallers()
    _beat(stores, agent, NOW, A, known)  # read once (not yet known), then remembered
    stores.journal.reset_counts()
    for beat in range(1, 5):
        _beat(stores, agent, NOW + 15 * beat, A, known)
    assert stores.journal.calls == ["nodes.record_heartbeat"] * 4
    assert (stores.journal.reads, stores.journal.writes) == (0, 4)
    assert stores.nodes.records[agent.node_id].agent_instance == FA  # 8 characters, under "ai"
    assert _flagged(stores, agent, NOW + 60) is None


def test_a_restart_changes_the_instance_once_and_flags_nothing(stores: MemoryStores, agent: Agent) -> None:
    known = KnownCallers()
    for beat, instance in enumerate([A, A, B, B, B]):
        _beat(stores, agent, NOW + 15 * beat, instance, known)
    assert _state(stores, agent) == duplicate_identity.InstanceState(FB, FA, int(NOW + 30))
    assert _flagged(stores, agent, NOW + 60) is None


def test_restarts_in_a_row_are_not_two_agents(stores: MemoryStores, agent: Agent) -> None:
    known = KnownCallers()
    for beat, instance in enumerate([A, B, C]):  # a crash loop: a new instance each time
        _beat(stores, agent, NOW + 5 * beat, instance, known)
    assert _state(stores, agent) == duplicate_identity.InstanceState(FC, FB, int(NOW + 10))


def test_two_instances_in_turn_flag_the_node_in_readiness_and_the_node_view(stores: MemoryStores, agent: Agent) -> None:
    known = KnownCallers()
    for beat, instance in enumerate([A, B, A, B]):
        _beat(stores, agent, NOW + 7 * beat, instance, known)
    assert _flagged(stores, agent, NOW + 21) == NOW + 21
    check = next(
        c for c in readiness.check(stores, SETTINGS, agent.node_id, NOW + 22).checks if c.name == "identity_unique"
    )
    assert not check.ok and "two agent processes" in check.detail and "stop the extra agent" in check.next_step
    view = views.node(listing.node(stores, agent.node_id), SETTINGS, NOW + 22)
    assert view["duplicate_agent_instances_at"] is not None


def test_the_flag_clears_a_window_after_the_second_agent_stopped(stores: MemoryStores, agent: Agent) -> None:
    known = KnownCallers()
    for beat, instance in enumerate([A, B, A, A, A]):
        _beat(stores, agent, NOW + 7 * beat, instance, known)
    assert _flagged(stores, agent, NOW + 14 + WINDOW) == NOW + 14
    assert _flagged(stores, agent, NOW + 14 + WINDOW + 1) is None
    check = _identity_check(stores, agent, NOW + 14 + WINDOW + 1)
    assert check.ok


def test_going_back_after_the_window_is_a_restart_not_two_agents(stores: MemoryStores, agent: Agent) -> None:
    known = KnownCallers()
    _beat(stores, agent, NOW, A, known)
    _beat(stores, agent, NOW + 15, B, known)
    _beat(stores, agent, NOW + 15 + WINDOW + 1, A, known)
    assert _state(stores, agent) == duplicate_identity.InstanceState(FA, FB, int(NOW + 15 + WINDOW + 1))


def test_a_heartbeat_without_an_instance_keeps_the_stored_one_and_flags_nothing(
    stores: MemoryStores, agent: Agent
) -> None:
    known = KnownCallers()
    for beat, instance in enumerate([A, None, A, None]):  # an older agent's beats, or a first beat
        _beat(stores, agent, NOW + 7 * beat, instance, known)
    assert stores.nodes.records[agent.node_id].agent_instance == FA


def test_another_instance_fails_the_steady_write_and_is_judged_after_one_read(
    stores: MemoryStores, agent: Agent
) -> None:
    known = KnownCallers()
    _beat(stores, agent, NOW, A, known)
    stores.journal.reset_counts()
    _beat(stores, agent, NOW + 7, B, known)
    assert stores.journal.calls == ["nodes.record_heartbeat", "nodes.get", "nodes.record_heartbeat"]
    assert stores.journal.writes == 1  # the refused guard wrote nothing


def test_what_a_change_left_is_cleared_by_a_later_read_once_the_window_passed(
    stores: MemoryStores, agent: Agent
) -> None:
    known = KnownCallers()
    for beat, instance in enumerate([A, B, A]):
        _beat(stores, agent, NOW + 7 * beat, instance, known)
    assert _state(stores, agent) == duplicate_identity.InstanceState(FA, FB, int(NOW + 14), int(NOW + 14))
    _beat(stores, agent, NOW + 21, A, known)  # the steady path writes nothing of it
    assert _state(stores, agent) == duplicate_identity.InstanceState(FA, FB, int(NOW + 14), int(NOW + 14))
    _beat(stores, agent, NOW + 14 + WINDOW + 1, A, KnownCallers())  # a Lambda instance that reads first
    assert stores.nodes.records[agent.node_id].agent_instance == FA


@pytest.mark.parametrize(
    "state",
    [
        duplicate_identity.InstanceState(FA),
        duplicate_identity.InstanceState(FA, FB, 1_800_000_000),
        duplicate_identity.InstanceState(FA, FB, 1_800_000_000, 1_800_000_007),
    ],
)
def test_the_stored_state_reads_back_as_written(state: duplicate_identity.InstanceState) -> None:
    assert duplicate_identity.InstanceState.of(state.stored()) == state
    assert len(duplicate_identity.InstanceState(FA).stored()) == 8
