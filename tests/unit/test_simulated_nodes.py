"""Simulated nodes: an inventory that says ``"simulated": true`` (an agent on an NVML simulation) is
refused on enroll and on inventory with 403 ``simulated_node_refused`` unless
MODELFORGE_ALLOW_SIMULATED_NODES is true; decided against the in-memory stores."""

from __future__ import annotations

from typing import Any

import pytest
from chalicelib.api import views
from chalicelib.api.error_answers import http_status
from chalicelib.config.settings import SettingsError
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Forbidden, Unauthenticated
from chalicelib.services import enrollments, listing, nodes, simulated_nodes
from modelforge_protocol import credentials

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    Agent,
    AgentIdentity,
    cpu_inventory,
    enroll_agent,
    enroll_body,
    gpu_inventory,
    inventory_body,
    node_record,
    settings_with,
)

ALLOWED = settings_with(MODELFORGE_ALLOW_SIMULATED_NODES="true")
NEXT_STEP = (
    "set MODELFORGE_ALLOW_SIMULATED_NODES=true on a development control plane, "
    "or run the agent without MODELFORGE_AGENT_NVML_SIMULATION"
)


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _simulated(gpus: int = 4) -> dict[str, Any]:
    return {**gpu_inventory(gpus), "simulated": True}


def _mint(stores: MemoryStores) -> enrollments.Minted:
    return enrollments.create(
        stores, typed.create_enrollment({"display_name": "Sim Node", "expires_in_seconds": 900}), NOW
    )


def _enroll(stores: MemoryStores, token: str, inventory: dict[str, Any], settings: Any = SETTINGS) -> Any:
    body = enroll_body(token, AgentIdentity(), accelerator_mode="nvidia", inventory=inventory)
    return enrollments.enroll(stores, settings, typed.enroll(body), NOW)


def _assert_refusal(error: Forbidden) -> None:
    assert error.code == "simulated_node_refused" and http_status(error) == 403
    assert error.body() == {
        "error": {
            "code": "simulated_node_refused",
            "message": "the control plane does not accept simulated nodes",
            "next_step": NEXT_STEP,
        }
    }


# --- the setting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "allowed"), [(None, False), ("false", False), ("true", True), ("TRUE", True)])
def test_the_setting_is_off_unless_true(raw: str | None, allowed: bool) -> None:
    settings = SETTINGS if raw is None else settings_with(MODELFORGE_ALLOW_SIMULATED_NODES=raw)
    assert settings.allow_simulated_nodes is allowed


def test_an_invalid_setting_is_refused_by_name() -> None:
    with pytest.raises(SettingsError) as refused:
        settings_with(MODELFORGE_ALLOW_SIMULATED_NODES="maybe")
    assert refused.value.problems == ["MODELFORGE_ALLOW_SIMULATED_NODES must be true or false"]


# --- enroll --------------------------------------------------------------------------------------


def test_enroll_of_a_simulated_node_is_refused_writes_nothing_and_leaves_the_token_usable(
    stores: MemoryStores,
) -> None:
    minted = _mint(stores)
    enrollment_id = minted.enrollment.enrollment_id
    stores.journal.reset_counts()
    with pytest.raises(Forbidden) as refused:
        _enroll(stores, minted.token, _simulated())
    _assert_refusal(refused.value)
    assert stores.journal.writes == 0 and stores.journal.calls == ["enrollments.get"]
    assert stores.nodes.records == {} and stores.nodes.inventories == {}
    assert stores.enrollments.records[enrollment_id].state == "pending"
    # the same token then enrolls the host without its simulation
    enrolled = _enroll(stores, minted.token, gpu_inventory(4))
    assert not enrolled.replayed and stores.enrollments.records[enrollment_id].state == "consumed"


def test_an_unknown_token_is_refused_as_unknown_before_the_simulation_is_judged(stores: MemoryStores) -> None:
    with pytest.raises(Unauthenticated) as refused:
        _enroll(stores, credentials.new_enrollment_token("enr_" + "f" * 32), _simulated())
    assert refused.value.code == "enrollment_token_unknown" and stores.journal.writes == 0


def test_enroll_of_a_simulated_node_is_accepted_when_allowed_and_its_view_says_simulated(
    stores: MemoryStores,
) -> None:
    minted = _mint(stores)
    inventory = _simulated()
    node = _enroll(stores, minted.token, inventory, ALLOWED).node
    assert stores.nodes.inventories[node.node_id].inventory == inventory
    assert stores.journal.event_types()[-4:] == [
        "enrollment.consumed",
        "node.registered",
        "credential.issued",
        "inventory.replaced",
    ]
    shown = views.node(listing.node(stores, node.node_id), ALLOWED, NOW)
    assert shown["simulated"] is True and shown["inventory"]["simulated"] is True


@pytest.mark.parametrize("settings", [SETTINGS, ALLOWED], ids=["default", "allowed"])
def test_a_real_node_enrolls_whatever_the_setting_and_is_not_simulated(stores: MemoryStores, settings: Any) -> None:
    agent = enroll_agent(stores, inventory=gpu_inventory(2), accelerator_mode="nvidia", settings=settings)
    assert views.node(listing.node(stores, agent.node_id), settings, NOW)["simulated"] is False


# --- inventory -----------------------------------------------------------------------------------


def _seed(stores: MemoryStores) -> Agent:
    agent = Agent()
    stores.nodes.seed(node_record(agent, accelerator_mode="nvidia"))
    return agent


def test_a_simulated_inventory_is_refused_after_the_caller_check_and_before_any_write(stores: MemoryStores) -> None:
    agent = _seed(stores)
    with pytest.raises(Forbidden) as refused:
        nodes.replace_inventory(
            stores, SETTINGS, agent.caller, typed.replace_inventory(inventory_body(_simulated())), NOW
        )
    _assert_refusal(refused.value)
    assert stores.journal.calls == ["nodes.get"] and agent.node_id not in stores.nodes.inventories


def test_a_simulated_inventory_from_an_unknown_caller_is_refused_as_unauthenticated(stores: MemoryStores) -> None:
    _seed(stores)
    with pytest.raises(Unauthenticated):
        nodes.replace_inventory(
            stores, SETTINGS, Agent().caller, typed.replace_inventory(inventory_body(_simulated())), NOW
        )
    assert stores.journal.writes == 0


def test_a_simulated_inventory_is_stored_when_allowed(stores: MemoryStores) -> None:
    agent = _seed(stores)
    document = _simulated(8)
    returned = nodes.replace_inventory(
        stores, ALLOWED, agent.caller, typed.replace_inventory(inventory_body(document)), NOW
    )
    assert returned.inventory == document and stores.nodes.inventories[agent.node_id].inventory["simulated"] is True


@pytest.mark.parametrize("settings", [SETTINGS, ALLOWED], ids=["default", "allowed"])
@pytest.mark.parametrize("document", [gpu_inventory(2), cpu_inventory()], ids=["gpu", "cpu"])
def test_a_real_inventory_is_stored_whatever_the_setting(
    stores: MemoryStores, settings: Any, document: dict[str, Any]
) -> None:
    agent = _seed(stores)
    nodes.replace_inventory(stores, settings, agent.caller, typed.replace_inventory(inventory_body(document)), NOW)
    assert stores.nodes.inventories[agent.node_id].inventory == document


def test_only_true_means_simulated() -> None:
    assert simulated_nodes.is_simulated(_simulated()) and not simulated_nodes.is_simulated(gpu_inventory(1))
