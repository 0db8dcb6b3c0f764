"""How resources look in API answers. Never a secret, never a secret's hash."""

from __future__ import annotations

from typing import Any

from modelforge_protocol.credentials import NODE_ID_HEADER
from modelforge_protocol.versions import ACCEPTED, IMAGE_TAG_VERSION, Component, verdict

from chalicelib.config.settings import Settings
from chalicelib.domain import liveness
from chalicelib.domain.channel_state import channel_of
from chalicelib.domain.records import (
    NODE_DRAINED,
    TELEMETRY_COLUMNS,
    ControlItem,
    Enrollment,
    Inventory,
    Node,
    WorkItem,
)
from chalicelib.domain.timestamps import iso
from chalicelib.services import duplicate_identity, gpu_health
from chalicelib.services.enrollments import public_state
from chalicelib.services.listing import NodeDetails, ShownWork, shown
from chalicelib.services.node_agent_settings import SettingsCheck
from chalicelib.services.readiness import Check, Readiness
from chalicelib.stores.contract import Stores


def enrollment(item: Enrollment, now: float) -> dict[str, Any]:
    return {
        "enrollment_id": item.enrollment_id,
        "display_name": item.display_name,
        "status": public_state(item, now),
        "production_eligible": item.production_eligible,
        "created_at": iso(item.created_at),
        "expires_at": iso(item.expires_at),
        "consumed_at": iso(item.consumed_at),
        "revoked_at": iso(item.revoked_at),
        "node_id": item.node_id,
    }


def inventory(item: Inventory | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {**item.inventory, "updated_at": iso(item.updated_at)}


def telemetry(node: Node) -> dict[str, Any] | None:
    if node.telemetry is None:
        return None
    return {
        "reported_at": iso(node.last_heartbeat_at),
        "gpus": [dict(zip(TELEMETRY_COLUMNS, row, strict=True)) for row in node.telemetry],
    }


def liveness_hold(hold: ControlItem | None) -> dict[str, Any] | None:
    """The sweep's mass-outage hold, when active: persisted transitions are paused."""
    if hold is None or not hold.active:
        return None
    return {
        "reason": "mass_stale_held",
        "since": iso(hold.since),
        "detail": hold.detail,
        "meaning": "many nodes went silent at once, so the sweep is not persisting liveness transitions; "
        "status here is still computed from each node's last heartbeat",
    }


def node(details: NodeDetails, settings: Settings, now: float) -> dict[str, Any]:
    item = details.node
    channel_state, channel_reason = channel_of(item, bool(settings.channel_url))
    return {
        "node_id": item.node_id,
        "enrollment_id": item.enrollment_id,
        "display_name": item.display_name,
        "hostname": item.hostname,
        "status": liveness.derive(
            item.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds
        ),
        "last_heartbeat_at": iso(item.last_heartbeat_at),
        "accelerator_mode": item.accelerator_mode,
        "production_eligible": item.production_eligible,
        "agent_version": item.agent_version,
        "protocol_version": int(item.protocol_version),
        "protocol_verdict": verdict(Component.AGENT, int(item.protocol_version)).value,
        "credential": {
            "state": item.credential_state,
            "issued_at": iso(item.credential_issued_at),
            "revoked_at": iso(item.credential_revoked_at),
        },
        "health": item.health,
        "telemetry": telemetry(item),
        "inventory": inventory(details.inventory),
        "duplicate_suspected": sorted(item.duplicate_partners or []),
        "duplicate_suspected_since": iso(item.duplicate_suspected_at),
        "duplicate_agent_instances_at": iso(duplicate_identity.duplicate_instances_at(item, settings, now)),
        "liveness_hold": liveness_hold(details.hold),
        "channel": channel_state,
        "channel_reason": channel_reason,
        "slots": None if item.slots is None else dict(zip(("total", "busy", "schedulable"), item.slots, strict=True)),
        "drained": bool((item.gpu_blocks or 0) & NODE_DRAINED),
        "gpu_health": gpu_health.gpu_views(details.inventory),
        "simulated": bool(details.inventory and details.inventory.inventory.get("simulated")),
        "created_at": iso(item.created_at),
    }


def work_of(stores: Stores, item: WorkItem) -> dict[str, Any]:
    """A work item just read or written, as admins see it."""
    return work_item(shown(stores, item))


def work_item(shown: ShownWork) -> dict[str, Any]:
    """A work item for admins, with a presigned GET of the result once succeeded."""
    item, result_url = shown.item, shown.result_url
    answer: dict[str, Any] = {
        "work_id": item.work_id,
        "capability": item.capability,
        "status": item.status,
        "attempts": item.attempts,
        "max_attempts": item.max_attempts,
        "lease_seconds": item.lease_seconds,
        "epoch": item.epoch,
        # the holder while leased, and the last holder once done (a re-queued item has none yet)
        "node_id": None if item.status == "queued" else item.node_id,
        "lease_expires_at": iso(item.lease_expires_at),
        "created_at": iso(item.created_at),
        "updated_at": iso(item.updated_at),
        "finished_at": iso(item.finished_at),
        "input": {"sha256": item.input_sha256, "size": item.input_size},
        "errors": [{**error, "at": iso(error.get("at"))} for error in item.errors or []],
        "result": None,
    }
    if item.result is not None and result_url is not None:
        answer["result"] = {"sha256": item.result["sha256"], "size": item.result["size"], "url": result_url}
    return answer


def work_claim(item: WorkItem, input_url: str, result_upload_url: str) -> dict[str, Any]:
    """What a node gets with its lease (the URLs are bearer secrets: never logged)."""
    return {
        "work_id": item.work_id,
        "capability": item.capability,
        "epoch": item.epoch,
        "lease_seconds": item.lease_seconds,
        "lease_expires_at": iso(item.lease_expires_at),
        "input_url": input_url,
        "result_upload_url": result_upload_url,
    }


def lease(item: WorkItem) -> dict[str, Any]:
    """The answer of renew, complete and fail."""
    return {
        "work_id": item.work_id,
        "status": item.status,
        "epoch": item.epoch,
        "lease_expires_at": iso(item.lease_expires_at),
    }


def accepted_versions(component: Component) -> dict[str, int]:
    accepted = ACCEPTED[component]
    return {"oldest": accepted.oldest, "newest": accepted.newest}


def node_auth_hint() -> dict[str, str]:
    """How an enrolled agent authenticates: its own credential, and its node id."""
    return {
        "scheme": "Bearer",
        "credential": "the credential the agent sent at enrollment",
        "node_id_header": NODE_ID_HEADER,
    }


def node_agent_settings(result: SettingsCheck) -> dict[str, Any]:
    """The settings check: every problem by field, or the node's .env settings in order."""
    return {
        "ok": result.ok,
        "release": IMAGE_TAG_VERSION,
        "problems": [{"field": problem.field, "message": problem.message} for problem in result.problems],
        "settings": [{"name": name, "value": value} for name, value in result.settings],
    }


def _check(check: Check) -> dict[str, Any]:
    return {"name": check.name, "ok": check.ok, "detail": check.detail, "next_step": check.next_step}


def readiness(result: Readiness, now: float) -> dict[str, Any]:
    """A readiness answer; before any node enrolled with the enrollment, only what is known."""
    answer: dict[str, Any] = {
        "node_id": result.node_id,
        "enrollment_id": result.enrollment_id,
        "ready": result.ready,
    }
    if result.node_id is not None:
        answer.update(status=result.status, checked_at=iso(now))
    answer["checks"] = [_check(check) for check in result.checks]
    return answer
