"""enrollments: minting, revoking and consuming tokens, decided against the in-memory stores."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import Conflict, DomainError, Gone, Invalid, NotFound, Unauthenticated
from chalicelib.services import enrollments
from modelforge_protocol import credentials

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import (
    NOW,
    SETTINGS,
    AgentIdentity,
    enroll_agent,
    enroll_body,
    enrollment_record,
    gpu_inventory,
    gpu_uuid,
    inventory_of,
    inventory_record,
)

CONSUMED_EVENTS = ["enrollment.consumed", "node.registered", "credential.issued", "inventory.replaced"]


@pytest.fixture()
def stores() -> MemoryStores:
    return memory_stores()


def _mint(stores: MemoryStores, expires_in: int = 900, now: float = NOW, **body: Any) -> enrollments.Minted:
    return enrollments.create(
        stores, typed.create_enrollment({"display_name": "GPU Node", "expires_in_seconds": expires_in, **body}), now
    )


# --- create, get, public state ------------------------------------------------------------------


def test_create_stores_a_pending_enrollment_and_only_the_token_digest(stores: MemoryStores) -> None:
    minted = _mint(stores, production_eligible=True)
    match = credentials.ENROLLMENT_TOKEN_RE.fullmatch(minted.token)
    assert match is not None and match.group(1) == minted.enrollment.enrollment_id
    stored = stores.enrollments.records[minted.enrollment.enrollment_id]
    assert stored == minted.enrollment
    assert stored.token_sha256 == credentials.sha256_hex(minted.token) and minted.token not in repr(stored)
    assert (stored.state, stored.production_eligible, stored.created_at, stored.expires_at) == (
        "pending",
        True,
        NOW,
        NOW + 900,
    )
    assert [(e.type, e.subject) for e in stores.journal.events] == [
        ("enrollment.created", {"enrollment_id": stored.enrollment_id})
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"display_name": "x", "expires_in_seconds": 59},
        {"display_name": "", "expires_in_seconds": 900},
        {"display_name": "x"},
    ],
    ids=["ttl-too-short", "empty-name", "no-ttl"],
)
def test_an_invalid_create_writes_nothing(stores: MemoryStores, body: dict[str, Any]) -> None:
    with pytest.raises(Invalid):
        enrollments.create(stores, typed.create_enrollment(body), NOW)
    assert stores.journal.calls == []


@pytest.mark.parametrize("enrollment_id", ["enr_" + "f" * 32, "enr_nope"])
def test_get_of_an_unknown_enrollment_is_not_found(stores: MemoryStores, enrollment_id: str) -> None:
    with pytest.raises(NotFound) as missing:
        enrollments.get(stores, enrollment_id)
    assert missing.value.code == "enrollment_not_found"
    assert stores.journal.reads == (1 if enrollment_id.endswith("f" * 32) else 0)


@pytest.mark.parametrize(
    ("state", "now", "public"),
    [
        ("pending", NOW + 899, "pending"),
        ("pending", NOW + 900, "expired"),
        ("consumed", NOW + 9999, "consumed"),
        ("revoked", NOW, "revoked"),
    ],
)
def test_public_state_derives_expiry_from_the_time(state: str, now: float, public: str) -> None:
    enrollment, _ = enrollment_record(state=state, expires_at=NOW + 900)
    assert enrollments.public_state(enrollment, now) == public


# --- revoke -------------------------------------------------------------------------------------


def test_revoke_a_pending_enrollment(stores: MemoryStores) -> None:
    minted = _mint(stores)
    revoked = enrollments.revoke(stores, minted.enrollment.enrollment_id, NOW + 5)
    assert (revoked.state, revoked.revoked_at) == ("revoked", NOW + 5)
    assert stores.journal.event_types() == ["enrollment.created", "enrollment.revoked"]


def test_an_expired_but_unused_enrollment_can_still_be_revoked(stores: MemoryStores) -> None:
    minted = _mint(stores, expires_in=60)
    assert enrollments.revoke(stores, minted.enrollment.enrollment_id, NOW + 3600).state == "revoked"


@pytest.mark.parametrize(("state", "code"), [("consumed", "enrollment_consumed"), ("revoked", "enrollment_revoked")])
def test_revoke_refuses_a_used_or_revoked_enrollment(stores: MemoryStores, state: str, code: str) -> None:
    enrollment, _ = enrollment_record(state=state)
    stores.enrollments.seed(enrollment)
    with pytest.raises(Conflict) as refused:
        enrollments.revoke(stores, enrollment.enrollment_id, NOW)
    assert refused.value.code == code
    assert stores.enrollments.records[enrollment.enrollment_id].state == state and stores.journal.writes == 0


def test_revoke_that_loses_to_an_enroll_says_consumed(stores: MemoryStores) -> None:
    minted = _mint(stores)

    def agent_enrolls_first() -> None:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, AgentIdentity())), NOW)

    stores.journal.before_next("enrollments.revoke", agent_enrolls_first)
    with pytest.raises(Conflict) as refused:
        enrollments.revoke(stores, minted.enrollment.enrollment_id, NOW)
    assert refused.value.code == "enrollment_consumed"
    assert "enrollment.revoked" not in stores.journal.event_types()


def test_revoke_of_an_unknown_enrollment_is_not_found_before_any_write(stores: MemoryStores) -> None:
    with pytest.raises(NotFound):
        enrollments.revoke(stores, "enr_" + "f" * 32, NOW)
    assert stores.journal.calls == ["enrollments.get"]


# --- enroll -------------------------------------------------------------------------------------


def test_enroll_creates_a_pending_node_its_inventory_claims_and_four_events(stores: MemoryStores) -> None:
    minted = _mint(stores, production_eligible=True)
    identity = AgentIdentity()
    inventory = gpu_inventory(2)
    stores.journal.reset_counts()
    enrolled = enrollments.enroll(
        stores,
        SETTINGS,
        typed.enroll(enroll_body(minted.token, identity, accelerator_mode="nvidia", inventory=inventory)),
        NOW,
    )
    node = enrolled.node
    assert not enrolled.replayed and credentials.NODE_ID_RE.fullmatch(node.node_id)
    assert stores.nodes.records[node.node_id] == node
    assert (node.liveness, node.credential_state, node.last_heartbeat_at) == ("pending", "active", None)
    assert node.credential_sha256 == credentials.sha256_hex(identity.credential)
    assert (node.accelerator_mode, node.hostname, node.production_eligible) == ("nvidia", "gpu_node", True)
    assert node.enrollment_id == minted.enrollment.enrollment_id

    enrollment = stores.enrollments.records[minted.enrollment.enrollment_id]
    assert (enrollment.state, enrollment.node_id, enrollment.consumed_at) == ("consumed", node.node_id, NOW)
    assert enrollment.idempotency_key_sha256 == credentials.sha256_hex(identity.idempotency_key)

    uuids = {gpu["uuid"] for gpu in inventory["gpus"]}
    stored_inventory = stores.nodes.inventories[node.node_id]
    assert stored_inventory.inventory == inventory and stored_inventory.claimed_uuids == uuids
    assert stores.nodes.claimed_by(node.node_id) == uuids
    assert stores.journal.event_types() == CONSUMED_EVENTS
    assert all(
        e.subject == {"enrollment_id": enrollment.enrollment_id, "node_id": node.node_id} for e in stores.journal.events
    )


def test_enroll_of_a_cpu_node_claims_nothing(stores: MemoryStores) -> None:
    agent = enroll_agent(stores)
    assert stores.nodes.inventories[agent.node_id].claimed_uuids is None
    assert stores.nodes.claimed_by(agent.node_id) == set()


@pytest.mark.parametrize("token", ["wrong-secret", "unknown-enrollment", "malformed"])
def test_an_unknown_token_is_unauthenticated(stores: MemoryStores, token: str) -> None:
    minted = _mint(stores)
    enrollment_id = minted.enrollment.enrollment_id
    presented = {
        "wrong-secret": credentials.new_enrollment_token(enrollment_id),
        "unknown-enrollment": credentials.new_enrollment_token("enr_" + "f" * 32),
        "malformed": "mfe.not-a-token",
    }[token]
    stores.journal.reset_counts()
    with pytest.raises(Unauthenticated) as refused:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(presented, AgentIdentity())), NOW)
    assert refused.value.code == "enrollment_token_unknown"
    assert stores.journal.writes == 0 and stores.journal.reads <= 1
    assert stores.enrollments.records[enrollment_id].state == "pending"


@pytest.mark.parametrize(
    ("setup", "error", "code"),
    [
        ("expired", Gone, "enrollment_token_expired"),
        ("revoked", Gone, "enrollment_token_revoked"),
        ("consumed", Conflict, "enrollment_token_consumed"),
    ],
)
def test_a_token_that_cannot_be_used_any_more_is_refused(
    stores: MemoryStores, setup: str, error: type[DomainError], code: str
) -> None:
    minted = _mint(stores)
    now = NOW
    if setup == "expired":
        now = NOW + 900  # expires_at itself is too late
    elif setup == "revoked":
        enrollments.revoke(stores, minted.enrollment.enrollment_id, NOW)
    else:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, AgentIdentity())), NOW)
    nodes_before = set(stores.nodes.records)
    stores.journal.reset_counts()
    with pytest.raises(error) as refused:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, AgentIdentity())), now)
    assert refused.value.code == code
    assert stores.journal.writes == 0 and set(stores.nodes.records) == nodes_before


def test_the_same_agent_retrying_gets_its_node_back_without_a_write(stores: MemoryStores) -> None:
    minted = _mint(stores)
    identity = AgentIdentity()
    body = enroll_body(minted.token, identity)
    first = enrollments.enroll(stores, SETTINGS, typed.enroll(body), NOW)
    stores.journal.reset_counts()
    again = enrollments.enroll(stores, SETTINGS, typed.enroll(body), NOW + 3600)  # even once the token expired
    assert again.replayed and again.node.node_id == first.node.node_id
    assert stores.journal.writes == 0 and len(stores.nodes.records) == 1


@pytest.mark.parametrize("changed", ["credential", "idempotency_key"])
def test_a_retry_with_other_secrets_is_refused_as_consumed(stores: MemoryStores, changed: str) -> None:
    minted = _mint(stores)
    identity = AgentIdentity()
    enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, identity)), NOW)
    other = dataclasses.replace(identity, **{changed: getattr(AgentIdentity(), changed)})
    with pytest.raises(Conflict) as refused:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, other)), NOW)
    assert refused.value.code == "enrollment_token_consumed"


def test_an_agent_that_loses_the_race_is_refused_and_writes_nothing(stores: MemoryStores) -> None:
    minted = _mint(stores)
    winner = AgentIdentity()

    def another_agent_enrolls_first() -> None:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, winner)), NOW)

    stores.journal.before_next("enrollments.consume", another_agent_enrolls_first)
    with pytest.raises(Conflict) as refused:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, AgentIdentity())), NOW)
    assert refused.value.code == "enrollment_token_consumed"
    [node] = stores.nodes.records.values()
    assert node.credential_sha256 == credentials.sha256_hex(winner.credential)
    assert stores.journal.event_types().count("node.registered") == 1


def test_a_retry_racing_its_own_first_attempt_gets_the_node_the_first_created(stores: MemoryStores) -> None:
    minted = _mint(stores)
    identity = AgentIdentity()
    body = enroll_body(minted.token, identity)
    first: list[enrollments.Enrolled] = []
    stores.journal.before_next(
        "enrollments.consume", lambda: first.append(enrollments.enroll(stores, SETTINGS, typed.enroll(body), NOW))
    )
    again = enrollments.enroll(stores, SETTINGS, typed.enroll(body), NOW)
    assert again.replayed and again.node.node_id == first[0].node.node_id and len(stores.nodes.records) == 1


def test_a_token_revoked_while_enrolling_is_gone(stores: MemoryStores) -> None:
    minted = _mint(stores)
    stores.journal.before_next(
        "enrollments.consume", lambda: enrollments.revoke(stores, minted.enrollment.enrollment_id, NOW)
    )
    with pytest.raises(Gone) as refused:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, AgentIdentity())), NOW)
    assert refused.value.code == "enrollment_token_revoked" and stores.nodes.records == {}


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"credential": "mfn.short"}, "invalid_request"),
        ({"idempotency_key": "not-a-key"}, "invalid_request"),
        ({"protocol_version": 0}, "protocol_incompatible"),
        ({"accelerator_mode": "tpu"}, "invalid_request"),
    ],
    ids=["credential-format", "idempotency-key-format", "protocol", "schema"],
)
def test_an_invalid_enroll_writes_nothing(stores: MemoryStores, overrides: dict[str, Any], code: str) -> None:
    minted = _mint(stores)
    stores.journal.reset_counts()
    with pytest.raises(Invalid) as refused:
        enrollments.enroll(stores, SETTINGS, typed.enroll(enroll_body(minted.token, AgentIdentity(), **overrides)), NOW)
    assert refused.value.code == code and stores.journal.calls == []


def test_enroll_flags_a_live_node_already_reporting_its_gpu(stores: MemoryStores) -> None:
    shared = gpu_uuid()
    old = enroll_agent(stores)
    stores.nodes.records[old.node_id].last_heartbeat_at = NOW - 5  # online
    stores.nodes.seed_inventory(inventory_record(old.node_id, inventory_of([shared])))
    new = enroll_agent(stores, inventory=inventory_of([shared]), accelerator_mode="nvidia")
    assert stores.nodes.records[new.node_id].duplicate_partners == {old.node_id}
    assert stores.nodes.records[old.node_id].duplicate_partners == {new.node_id}
    [event] = stores.journal.events_of("node.duplicate_suspected")
    assert event.subject["reported_by"] == new.node_id
