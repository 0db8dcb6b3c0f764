"""Enrollment: minting single-use tokens and consuming one to create a node."""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass

from modelforge_protocol import credentials

from chalicelib.config.settings import Settings
from chalicelib.domain import requests
from chalicelib.domain.errors import (
    DomainError,
    Gone,
    GuardFailed,
    Unauthenticated,
    conflict,
    invalid_request,
    not_found,
)
from chalicelib.domain.records import Enrollment, Event, Inventory, Node
from chalicelib.services import channel, duplicate_identity, simulated_nodes
from chalicelib.stores.contract import Stores

PENDING, CONSUMED, REVOKED, EXPIRED = "pending", "consumed", "revoked", "expired"


def public_state(enrollment: Enrollment, now: float) -> str:
    if enrollment.state == PENDING and enrollment.expires_at <= now:
        return EXPIRED
    return enrollment.state


@dataclass(frozen=True)
class Minted:
    enrollment: Enrollment
    token: str


def create(stores: Stores, request: requests.CreateEnrollment, now: float) -> Minted:
    enrollment_id = f"enr_{uuid.uuid4().hex}"
    token = credentials.new_enrollment_token(enrollment_id)
    enrollment = Enrollment(
        enrollment_id=enrollment_id,
        token_sha256=credentials.sha256_hex(token),
        display_name=request.display_name,
        state=PENDING,
        production_eligible=request.production_eligible,
        created_at=round(now, 3),
        expires_at=round(now + request.expires_in_seconds, 3),
    )
    stores.enrollments.create(enrollment, Event("enrollment.created", {"enrollment_id": enrollment_id}, now))
    return Minted(enrollment=enrollment, token=token)


def get(stores: Stores, enrollment_id: str) -> Enrollment:
    if not credentials.ENROLLMENT_ID_RE.fullmatch(enrollment_id):
        raise not_found("enrollment")
    enrollment = stores.enrollments.get(enrollment_id)
    if enrollment is None:
        raise not_found("enrollment")
    return enrollment


def revoke(stores: Stores, enrollment_id: str, now: float) -> Enrollment:
    get(stores, enrollment_id)  # 404 for an unknown id before anything is written
    try:
        stores.enrollments.revoke(
            enrollment_id, now, Event("enrollment.revoked", {"enrollment_id": enrollment_id}, now)
        )
    except GuardFailed:
        current = get(stores, enrollment_id)
        if current.state == CONSUMED:
            raise conflict(
                "enrollment_consumed", "the token was already used; revoke the node's credential instead"
            ) from None
        raise conflict("enrollment_revoked", "the token was already revoked") from None
    return get(stores, enrollment_id)


# --- consuming a token -------------------------------------------------------------------


def _token_unknown() -> Unauthenticated:
    return Unauthenticated("enrollment_token_unknown", "the enrollment token is not known")


def _refusal(enrollment: Enrollment, now: float) -> DomainError:
    state = public_state(enrollment, now)
    if state == EXPIRED:
        return Gone("enrollment_token_expired", "the enrollment token has expired; ask an admin for a new one")
    if state == REVOKED:
        return Gone("enrollment_token_revoked", "the enrollment token was revoked; ask an admin for a new one")
    return conflict("enrollment_token_consumed", "the enrollment token was already used by another node")


@dataclass(frozen=True)
class Enrolled:
    node: Node
    replayed: bool
    #: a channel ticket minted in the node's write (a channel is configured; not on a replay)
    ticket: channel.Ticket | None = None


def _replay(stores: Stores, enrollment: Enrollment, idempotency_sha256: str, credential_sha256: str) -> Enrolled | None:
    """The same agent retrying after a lost response gets its node back; nobody else does."""
    if enrollment.state != CONSUMED or enrollment.node_id is None:
        return None
    if not hmac.compare_digest(enrollment.idempotency_key_sha256 or "", idempotency_sha256):
        return None
    node = stores.nodes.get(enrollment.node_id)
    if node is None or not hmac.compare_digest(node.credential_sha256, credential_sha256):
        return None
    return Enrolled(node=node, replayed=True)


def _check_secrets_format(request: requests.Enroll) -> str:
    match = credentials.ENROLLMENT_TOKEN_RE.fullmatch(request.token)
    if match is None:
        raise _token_unknown()
    problems = []
    if not credentials.NODE_CREDENTIAL_RE.fullmatch(request.credential):
        problems.append("credential: has an invalid format")
    if not credentials.IDEMPOTENCY_KEY_RE.fullmatch(request.idempotency_key):
        problems.append("idempotency_key: has an invalid format")
    if problems:
        raise invalid_request("; ".join(problems), problems=problems)
    return str(match.group(1))


def enroll(stores: Stores, settings: Settings, request: requests.Enroll, now: float) -> Enrolled:
    enrollment_id = _check_secrets_format(request)
    token_sha256 = credentials.sha256_hex(request.token)
    idempotency_sha256 = credentials.sha256_hex(request.idempotency_key)
    credential_sha256 = credentials.sha256_hex(request.credential)

    enrollment = stores.enrollments.get(enrollment_id)
    if enrollment is None or not hmac.compare_digest(enrollment.token_sha256, token_sha256):
        raise _token_unknown()
    # a simulated node is refused once its token is known and before anything is written, so the
    # token stays usable (by the same host without its simulation, say)
    simulated_nodes.require_allowed(settings, request.inventory)
    if public_state(enrollment, now) != PENDING:
        replayed = _replay(stores, enrollment, idempotency_sha256, credential_sha256)
        if replayed:
            return replayed
        raise _refusal(enrollment, now)

    node_id = f"node_{uuid.uuid4().hex}"
    # the channel's first ticket rides in the node's own write (no extra write; never logged)
    ticket = channel.mint(now) if settings.channel_url else None
    node = Node(
        node_id=node_id,
        enrollment_id=enrollment_id,
        display_name=enrollment.display_name,
        hostname=request.hostname,
        accelerator_mode=request.accelerator_mode,
        production_eligible=enrollment.production_eligible,
        created_at=round(now, 3),
        agent_version=request.agent_version,
        protocol_version=request.protocol_version,
        credential_sha256=credential_sha256,
        credential_state="active",
        credential_issued_at=round(now, 3),
        liveness="pending",
        liveness_changed_at=round(now, 3),
        capabilities=set(request.inventory["capabilities"]) or None,
        channel_ticket_sha256=ticket.sha256 if ticket else None,
        channel_ticket_expires_at=ticket.expires_at if ticket else None,
    )
    uuids = duplicate_identity.gpu_uuids(request.inventory)
    inventory = Inventory(
        node_id=node_id,
        inventory=request.inventory,
        updated_at=round(now, 3),
        revision=uuid.uuid4().hex,
        claimed_uuids=set(uuids) or None,
    )
    try:
        stores.enrollments.consume(enrollment_id, token_sha256, idempotency_sha256, node, inventory, now)
    except GuardFailed:
        # another caller moved first (or the token expired or was revoked meanwhile)
        current = stores.enrollments.get(enrollment_id)
        if current is None:
            raise _token_unknown() from None
        replayed = _replay(stores, current, idempotency_sha256, credential_sha256)
        if replayed:
            return replayed
        raise _refusal(current, now) from None
    duplicate_identity.detect_and_flag(stores, settings, node_id, uuids, set(), now)
    return Enrolled(node=node, replayed=False, ticket=ticket)
