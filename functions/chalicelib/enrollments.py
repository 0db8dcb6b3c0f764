"""Enrollment: minting single-use tokens and consuming one to create a node."""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from typing import Any

from modelforge_protocol import credentials
from modelforge_protocol.versions import Component

from . import duplicate_identity, enrollment_store, node_store
from .errors import DomainError, Gone, GuardFailed, Unauthenticated, conflict, invalid_request, not_found
from .models import EnrollmentModel, InventoryModel, NodeModel
from .protocol_check import require_compatible
from .settings import Settings
from .state_log import outbox_item, put_change, update_change
from .validation import validate, validate_inventory

PENDING, CONSUMED, REVOKED, EXPIRED = "pending", "consumed", "revoked", "expired"


def public_state(enrollment: EnrollmentModel, now: float) -> str:
    if enrollment.state == PENDING and enrollment.expires_at <= now:
        return EXPIRED
    return enrollment.state


@dataclass(frozen=True)
class Minted:
    enrollment: EnrollmentModel
    token: str


def create(settings: Settings, body: dict[str, Any], now: float) -> Minted:
    validate(body, "CREATE_ENROLLMENT")
    enrollment_id = f"enr_{uuid.uuid4().hex}"
    token = credentials.new_enrollment_token(enrollment_id)
    enrollment = EnrollmentModel(
        enrollment_id,
        token_sha256=credentials.sha256_hex(token),
        display_name=body["display_name"],
        state=PENDING,
        production_eligible=bool(body.get("production_eligible", False)),
        created_at=round(now, 3),
        expires_at=round(now + int(body["expires_in_seconds"]), 3),
    )
    event = outbox_item(
        event_type="enrollment.created",
        now=now,
        subject={"enrollment_id": enrollment_id},
        changes=[put_change(enrollment)],
        retention_seconds=settings.outbox_retention_seconds,
    )
    enrollment_store.create(enrollment, event)
    return Minted(enrollment=enrollment, token=token)


def get(enrollment_id: str) -> EnrollmentModel:
    if not credentials.ENROLLMENT_ID_RE.fullmatch(enrollment_id):
        raise not_found("enrollment")
    enrollment = enrollment_store.get(enrollment_id)
    if enrollment is None:
        raise not_found("enrollment")
    return enrollment


def revoke(settings: Settings, enrollment_id: str, now: float) -> EnrollmentModel:
    get(enrollment_id)  # 404 for an unknown id before anything is written
    values = {"state": REVOKED, "revoked_at": round(now, 3)}
    event = outbox_item(
        event_type="enrollment.revoked",
        now=now,
        subject={"enrollment_id": enrollment_id},
        changes=[update_change(EnrollmentModel, enrollment_id, values)],
        retention_seconds=settings.outbox_retention_seconds,
    )
    try:
        enrollment_store.revoke(enrollment_id, values, event)
    except GuardFailed:
        current = get(enrollment_id)
        if current.state == CONSUMED:
            raise conflict("enrollment_consumed", "the token was already used; revoke the node's credential instead") from None
        raise conflict("enrollment_revoked", "the token was already revoked") from None
    return get(enrollment_id)


# --- consuming a token -------------------------------------------------------------------


def _token_unknown() -> Unauthenticated:
    return Unauthenticated("enrollment_token_unknown", "the enrollment token is not known")


def _refusal(enrollment: EnrollmentModel, now: float) -> DomainError:
    state = public_state(enrollment, now)
    if state == EXPIRED:
        return Gone("enrollment_token_expired", "the enrollment token has expired; ask an admin for a new one")
    if state == REVOKED:
        return Gone("enrollment_token_revoked", "the enrollment token was revoked; ask an admin for a new one")
    return conflict("enrollment_token_consumed", "the enrollment token was already used by another node")


@dataclass(frozen=True)
class Enrolled:
    node: NodeModel
    replayed: bool


def _replay(enrollment: EnrollmentModel, idempotency_sha256: str, credential_sha256: str) -> Enrolled | None:
    """The same agent retrying after a lost response gets its node back; nobody else does."""
    if enrollment.state != CONSUMED or enrollment.node_id is None:
        return None
    if not hmac.compare_digest(enrollment.idempotency_key_sha256 or "", idempotency_sha256):
        return None
    node = node_store.get(enrollment.node_id)
    if node is None or not hmac.compare_digest(node.credential_sha256, credential_sha256):
        return None
    return Enrolled(node=node, replayed=True)


def _check_secrets_format(body: dict[str, Any]) -> str:
    match = credentials.ENROLLMENT_TOKEN_RE.fullmatch(body["token"])
    if match is None:
        raise _token_unknown()
    problems = []
    if not credentials.NODE_CREDENTIAL_RE.fullmatch(body["credential"]):
        problems.append("credential: has an invalid format")
    if not credentials.IDEMPOTENCY_KEY_RE.fullmatch(body["idempotency_key"]):
        problems.append("idempotency_key: has an invalid format")
    if problems:
        raise invalid_request("; ".join(problems), problems=problems)
    return match.group(1)


def enroll(settings: Settings, body: dict[str, Any], now: float) -> Enrolled:
    protocol_version = require_compatible(Component.AGENT, body)
    validate(body, "ENROLL")
    validate_inventory(body["inventory"])
    enrollment_id = _check_secrets_format(body)
    token_sha256 = credentials.sha256_hex(body["token"])
    idempotency_sha256 = credentials.sha256_hex(body["idempotency_key"])
    credential_sha256 = credentials.sha256_hex(body["credential"])

    enrollment = enrollment_store.get(enrollment_id)
    if enrollment is None or not hmac.compare_digest(enrollment.token_sha256, token_sha256):
        raise _token_unknown()
    if public_state(enrollment, now) != PENDING:
        replayed = _replay(enrollment, idempotency_sha256, credential_sha256)
        if replayed:
            return replayed
        raise _refusal(enrollment, now)

    node_id = f"node_{uuid.uuid4().hex}"
    node = NodeModel(
        node_id,
        enrollment_id=enrollment_id,
        display_name=enrollment.display_name,
        hostname=body["hostname"],
        accelerator_mode=body["accelerator_mode"],
        production_eligible=enrollment.production_eligible,
        created_at=round(now, 3),
        agent_version=body["agent_version"],
        protocol_version=protocol_version,
        credential_sha256=credential_sha256,
        credential_state="active",
        credential_issued_at=round(now, 3),
        liveness="pending",
        liveness_changed_at=round(now, 3),
    )
    claims = duplicate_identity.claims(node_id, body["inventory"], now)
    inventory = InventoryModel(
        node_id,
        inventory=body["inventory"],
        updated_at=round(now, 3),
        revision=uuid.uuid4().hex,
        claimed_uuids={claim.gpu_uuid for claim in claims} or None,
    )
    enrollment_values = {
        "state": CONSUMED,
        "consumed_at": round(now, 3),
        "node_id": node_id,
        "idempotency_key_sha256": idempotency_sha256,
    }
    subject = {"enrollment_id": enrollment_id, "node_id": node_id}
    changes = {
        "enrollment.consumed": [update_change(EnrollmentModel, enrollment_id, enrollment_values)],
        "node.registered": [put_change(node)],
        "credential.issued": [],  # the credential is part of the node item put above
        "inventory.replaced": [put_change(inventory), *(put_change(claim) for claim in claims)],
    }
    events = [
        outbox_item(
            event_type=event_type,
            now=now,
            subject=subject,
            changes=event_changes,
            retention_seconds=settings.outbox_retention_seconds,
        )
        for event_type, event_changes in changes.items()
    ]
    try:
        enrollment_store.consume(
            enrollment_id=enrollment_id,
            token_sha256=token_sha256,
            now=now,
            enrollment_values=enrollment_values,
            node=node,
            inventory=inventory,
            claims=claims,
            events=events,
        )
    except GuardFailed:
        # another caller moved first (or the token expired or was revoked meanwhile)
        current = enrollment_store.get(enrollment_id)
        if current is None:
            raise _token_unknown() from None
        replayed = _replay(current, idempotency_sha256, credential_sha256)
        if replayed:
            return replayed
        raise _refusal(current, now) from None
    duplicate_identity.detect_and_flag(settings, node_id, duplicate_identity.gpu_uuids(body["inventory"]), set(), now)
    return Enrolled(node=node, replayed=False)
