"""Typed requests: what a route hands its service, built from a body the protocol's schema accepted.

Each builder judges the body the way the control plane always has (an agent's protocol version
first, then the schema of ``modelforge_protocol``, then the rules JSON Schema cannot say) and gives a
frozen dataclass with one field per property of the schema; an optional property the body leaves
out gets its default here. Services take these, never a raw body. Secrets (tokens, credentials,
idempotency keys) are left out of ``repr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol import work as work_protocol
from modelforge_protocol.versions import Component

from chalicelib.domain.errors import Invalid
from chalicelib.domain.protocol_check import require_compatible
from chalicelib.domain.validation import validate, validate_inventory, validate_with

# --- admins ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateEnrollment:
    display_name: str
    expires_in_seconds: int
    production_eligible: bool = False


def create_enrollment(body: dict[str, Any]) -> CreateEnrollment:
    validate(body, "CREATE_ENROLLMENT")
    return CreateEnrollment(
        display_name=body["display_name"],
        expires_in_seconds=int(body["expires_in_seconds"]),
        production_eligible=bool(body.get("production_eligible", False)),
    )


@dataclass(frozen=True)
class NodeAgentSettings:
    """The Enroll node wizard's choices (only their types are judged here; the service says what is wrong)."""

    control_plane_url: str
    hostname: str
    accelerator_mode: str
    state_volume: str
    image_source: str
    manifest_entry: str = ""
    image_reference: str = ""


def node_agent_settings(body: dict[str, Any]) -> NodeAgentSettings:
    validate(body, "NODE_AGENT_SETTINGS")
    return NodeAgentSettings(
        control_plane_url=body["control_plane_url"],
        hostname=body["hostname"],
        accelerator_mode=body["accelerator_mode"],
        state_volume=body["state_volume"],
        image_source=body["image_source"],
        manifest_entry=body.get("manifest_entry", ""),
        image_reference=body.get("image_reference", ""),
    )


@dataclass(frozen=True)
class SubmitWork:
    capability: str
    #: the work's input document (checked against its capability's schema by the work service)
    input: dict[str, Any]
    max_attempts: int = work_protocol.DEFAULT_ATTEMPTS
    lease_seconds: int = work_protocol.DEFAULT_LEASE_SECONDS
    idempotency_key: str | None = field(default=None, repr=False)


def submit_work(body: dict[str, Any]) -> SubmitWork:
    validate_with(body, work_protocol.SUBMIT_WORK)
    return SubmitWork(
        capability=body["capability"],
        input=body["input"],
        max_attempts=int(body.get("max_attempts", work_protocol.DEFAULT_ATTEMPTS)),
        lease_seconds=int(body.get("lease_seconds", work_protocol.DEFAULT_LEASE_SECONDS)),
        idempotency_key=body.get("idempotency_key"),
    )


# --- agents ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Enroll:
    token: str = field(repr=False)
    idempotency_key: str = field(repr=False)
    credential: str = field(repr=False)
    hostname: str
    agent_version: str
    protocol_version: int
    accelerator_mode: str
    #: the node's inventory document, as the protocol's INVENTORY schema has it
    inventory: dict[str, Any]


def enroll(body: dict[str, Any]) -> Enroll:
    protocol_version = require_compatible(Component.AGENT, body)
    validate(body, "ENROLL")
    validate_inventory(body["inventory"])
    return Enroll(
        token=body["token"],
        idempotency_key=body["idempotency_key"],
        credential=body["credential"],
        hostname=body["hostname"],
        agent_version=body["agent_version"],
        protocol_version=protocol_version,
        accelerator_mode=body["accelerator_mode"],
        inventory=body["inventory"],
    )


@dataclass(frozen=True)
class PushChannelReport:
    """The agent's push channel as its heartbeat reports it (schemas.PUSH_CHANNEL_REPORT)."""

    #: connected | connecting | fallback | off
    state: str
    #: the agent has no unexpired ticket with a minute left and wants one in this answer
    need_ticket: bool
    reason: str | None = None


@dataclass(frozen=True)
class GpuReason:
    """One reason behind a GPU's health state (schemas.GPU_REASON)."""

    code: str
    action: str
    #: the agent's clock, to the second: 2026-12-02T10:00:00Z
    since: str
    xid: int | None = None
    value: int | None = None


@dataclass(frozen=True)
class GpuHealthReport:
    """One GPU's health as the agent graded it (schemas.GPU_HEALTH)."""

    uuid: str
    state: str
    reasons: tuple[GpuReason, ...] = ()


@dataclass(frozen=True)
class Heartbeat:
    protocol_version: int
    agent_version: str
    #: the protocol's HEALTH document
    health: dict[str, Any]
    #: ``{"gpus": [...]}``, each GPU as the protocol's GPU_TELEMETRY
    telemetry: dict[str, Any]
    #: None: the agent did not report a channel (an agent older than the channel, or none advertised)
    push_channel: PushChannelReport | None = None
    #: the node's job slots: [total, busy, schedulable] (None: not reported)
    slots: list[int] | None = None
    #: the host's boot id (None: not reported): hard GPU faults are latched per GPU and boot
    boot_id: str | None = None
    #: every GPU's health when it changed (None: unchanged since the last report, or not reported)
    gpu_health: tuple[GpuHealthReport, ...] | None = None
    #: the agent process's random id (None: not reported, e.g. an agent older than the field)
    agent_instance_id: str | None = None


def heartbeat(body: dict[str, Any]) -> Heartbeat:
    protocol_version = require_compatible(Component.AGENT, body)
    validate(body, "HEARTBEAT")
    report = body.get("push_channel")
    return Heartbeat(
        protocol_version=protocol_version,
        agent_version=body["agent_version"],
        health=body["health"],
        telemetry=body["telemetry"],
        push_channel=None
        if report is None
        else PushChannelReport(state=report["state"], need_ticket=report["need_ticket"], reason=report.get("reason")),
        slots=_slots(body.get("slots")),
        boot_id=body.get("boot_id"),
        gpu_health=_gpu_health(body.get("gpu_health")),
        agent_instance_id=body.get("agent_instance_id"),
    )


def _gpu_health(report: dict[str, Any] | None) -> tuple[GpuHealthReport, ...] | None:
    """Each GPU once; the schema has bounded every field."""
    if report is None:
        return None
    gpus = tuple(
        GpuHealthReport(
            uuid=gpu["uuid"],
            state=gpu["state"],
            reasons=tuple(
                GpuReason(
                    code=reason["code"],
                    action=reason["action"],
                    since=reason["since"],
                    xid=reason.get("xid"),
                    value=reason.get("value"),
                )
                for reason in gpu["reasons"]
            ),
        )
        for gpu in report["gpus"]
    )
    uuids = [gpu.uuid for gpu in gpus]
    if len(set(uuids)) != len(uuids):
        raise Invalid("invalid_request", "gpu_health: each GPU may appear once")
    return gpus


def _slots(report: dict[str, int] | None) -> list[int] | None:
    """``[total, busy, schedulable]``; busy and schedulable are never more than total."""
    if report is None:
        return None
    total, busy, schedulable = report["total"], report["busy"], report["schedulable"]
    if busy > total or schedulable > total:
        raise Invalid(
            "invalid_request", f"slots: busy ({busy}) and schedulable ({schedulable}) must not exceed total ({total})"
        )
    return [total, busy, schedulable]


@dataclass(frozen=True)
class ReplaceInventory:
    protocol_version: int
    inventory: dict[str, Any]


def replace_inventory(body: dict[str, Any]) -> ReplaceInventory:
    protocol_version = require_compatible(Component.AGENT, body)
    validate(body, "REPLACE_INVENTORY")
    validate_inventory(body["inventory"])
    return ReplaceInventory(protocol_version=protocol_version, inventory=body["inventory"])


# --- agents: the lease holder ---------------------------------------------------------------------
#
# ``epoch`` is the number the body gave, as JSON Schema's "integer" accepts it (``2.0`` too): the
# control plane has always used it as given.


@dataclass(frozen=True)
class RenewWork:
    epoch: int


def renew_work(body: dict[str, Any]) -> RenewWork:
    validate_with(body, work_protocol.RENEW_WORK)
    return RenewWork(epoch=body["epoch"])


@dataclass(frozen=True)
class CompleteWork:
    epoch: int
    sha256: str
    size: int


def complete_work(body: dict[str, Any]) -> CompleteWork:
    validate_with(body, work_protocol.COMPLETE_WORK)
    return CompleteWork(epoch=body["epoch"], sha256=body["sha256"], size=body["size"])


@dataclass(frozen=True)
class FailWork:
    epoch: int
    reason: str
    retryable: bool
    #: the node failed, not the item: back to the queue without counting the attempt
    node_fault: bool = False


def fail_work(body: dict[str, Any]) -> FailWork:
    validate_with(body, work_protocol.FAIL_WORK)
    return FailWork(
        epoch=body["epoch"],
        reason=body["reason"],
        retryable=body["retryable"],
        node_fault=body.get("node_fault", False),
    )
