"""Readiness: is this exact node ready to serve, and if not, what to do next.

A node is not ready merely because it connected: each check below must pass, and each failing
check carries a concrete next step.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelforge_protocol import credentials
from modelforge_protocol.versions import Component, Verdict, next_step, verdict

from chalicelib.config.settings import Settings
from chalicelib.domain import liveness
from chalicelib.domain.channel_state import CONNECTED, channel_of
from chalicelib.domain.errors import not_found
from chalicelib.domain.records import NODE_DRAINED, Inventory, Node
from chalicelib.domain.timestamps import iso
from chalicelib.services import duplicate_identity, enrollments, gpu_health
from chalicelib.stores.contract import Stores

HEARTBEAT_HINT = "check the agent log for ConnectError on POST /api/v1/agent/heartbeat"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    #: what to do, when the check fails
    next_step: str | None


@dataclass(frozen=True)
class Readiness:
    #: None while no node has enrolled with the enrollment asked about
    node_id: str | None
    enrollment_id: str
    checks: list[Check]
    #: the node's liveness at the time of the check (None without a node)
    status: str | None = None

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)


def _check(name: str, ok: bool, detail: str, step: str) -> Check:
    return Check(name, ok, detail, None if ok else step)


def _connection(node: Node, settings: Settings, now: float) -> Check:
    if node.last_heartbeat_at is None:
        return _check(
            "connection",
            False,
            "the agent enrolled but has never sent a heartbeat",
            f"start the agent with its persisted identity; {HEARTBEAT_HINT}",
        )
    age = now - node.last_heartbeat_at
    ok = age < settings.stale_after_seconds
    return _check(
        "connection", ok,
        f"last heartbeat {age:.0f}s ago (stale after {settings.stale_after_seconds}s)",
        f"the agent stopped reaching the control plane: is it running? {HEARTBEAT_HINT}",
    )  # fmt: skip


def _push_channel(node: Node, settings: Settings) -> Check:
    """Never fails: a node in fallback claims on the heartbeat's hint (it only waits longer)."""
    state, reason = channel_of(node, bool(settings.channel_url))
    return _check("push_channel", True, CONNECTED if state == CONNECTED else f"fallback: {reason}", "")


def _gpu_health(node: Node, inventory: Inventory | None) -> Check:
    """Every GPU takes work (healthy, degraded or unknown, neither latched, drained nor missing), and
    the node is not drained. The detail names each GPU's state and NVIDIA's recommended action."""
    simulated = (
        " (simulated GPUs: an NVML simulation, not hardware)"
        if inventory and inventory.inventory.get("simulated")
        else ""
    )
    if (node.gpu_blocks or 0) & NODE_DRAINED:
        return _check(
            "gpu_health", False, f"an admin drained the node{simulated}", f"modelforge nodes undrain {node.node_id}"
        )
    views = gpu_health.gpu_views(inventory)
    if not views:
        return _check("gpu_health", True, f"no GPUs{simulated}", "")
    parts, steps = [], []
    for view in views:
        actions = sorted({reason["action"] for reason in view["reasons"]} - {"none"})
        held = [name for name in ("latched", "drained", "missing") if view[name]]
        parts.append(
            f"{view['uuid']}: {view['state']}"
            + (f" ({', '.join(held)})" if held else "")
            + (f", action {'/'.join(actions)}" if actions else "")
        )
        if view["missing"]:
            steps.append(f"{view['uuid']} is missing: reseat it, or modelforge nodes accept-gpus {node.node_id}")
        elif view["drained"]:
            steps.append(f"modelforge nodes undrain {node.node_id} --gpu {view['uuid']}")
        elif not view["schedulable"]:
            steps.append(
                f"{view['uuid']}: {'/'.join(actions) or 'inspect it'}, then modelforge nodes clear-gpu "
                f"{node.node_id} {view['uuid']} (a reboot clears it too)"
            )
    return _check("gpu_health", not steps, "; ".join(parts) + simulated, "; ".join(steps))


def _inventory_age(node: Node, inventory: Inventory | None, settings: Settings, now: float) -> Check:
    limit = settings.readiness_inventory_max_age_seconds
    hint = "check the agent log for ConnectError on POST /api/v1/agent/inventory"
    if inventory is None:
        return _check("inventory_age", False, "no inventory has been received", f"start the agent; {hint}")
    age = now - inventory.updated_at
    gpus = len(inventory.inventory.get("gpus", []))
    if age > limit:
        return _check("inventory_age", False, f"inventory older than {limit}s ({age:.0f}s)", hint)
    if node.accelerator_mode == "nvidia" and gpus == 0:
        return _check("inventory_age", False, f"inventory is {age:.0f}s old but lists no GPU in nvidia mode",
                      "run the agent's --preflight on the node; a GPU node must report its GPUs")  # fmt: skip
    if not inventory.inventory.get("capabilities"):
        return _check(
            "inventory_age", False, "inventory lists no capabilities", "update the agent; it must report capabilities"
        )
    return _check("inventory_age", True, f"inventory {age:.0f}s old (max {limit}s), {gpus} GPU(s)", "")


def _protocol(node: Node) -> Check:
    judged = verdict(Component.AGENT, int(node.protocol_version))
    return _check(
        "protocol_compatibility", judged is Verdict.COMPATIBLE,
        f"agent protocol {int(node.protocol_version)}: {judged.value}", next_step(Component.AGENT, judged),
    )  # fmt: skip


def _health(node: Node) -> Check:
    health = node.health or {}
    status = health.get("status")
    if status is None:
        return _check(
            "agent_health", False, "the agent has not reported its health", f"start the agent; {HEARTBEAT_HINT}"
        )
    return _check("agent_health", status == "ok", f"agent reports {status}",
                  "read the agent's log on the node for the reason it reports itself unhealthy")  # fmt: skip


def _telemetry_age(node: Node, inventory: Inventory | None, settings: Settings, now: float) -> Check:
    if node.last_heartbeat_at is None or node.telemetry is None:
        return _check("telemetry_age", False, "no telemetry has been received", f"start the agent; {HEARTBEAT_HINT}")
    age = now - node.last_heartbeat_at
    if age >= settings.stale_after_seconds:
        return _check(
            "telemetry_age", False, f"telemetry older than {settings.stale_after_seconds}s ({age:.0f}s)", HEARTBEAT_HINT
        )
    expected = len((inventory.inventory if inventory else {}).get("gpus", []))
    if node.accelerator_mode == "nvidia" and (expected == 0 or len(node.telemetry) != expected):
        return _check(
            "telemetry_age",
            False,
            f"telemetry covers {len(node.telemetry)} of {expected} GPU(s) in nvidia mode",
            "run the agent's --preflight on the node: NVIDIA_TELEMETRY_UNAVAILABLE means NVML cannot read a GPU",
        )
    return _check("telemetry_age", True, f"telemetry {age:.0f}s old for {len(node.telemetry)} GPU(s)", "")


def _worker(node: Node) -> Check:
    """What the agent last said of its runtime worker (heartbeat health)."""
    worker = (node.health or {}).get("worker")
    if worker is None:
        return _check("worker", True, "no runtime worker configured: the node serves no work", "")
    unavailable = ", ".join(f"{entry['name']} ({entry['reason']})" for entry in worker.get("unavailable", []))
    if worker.get("status") == "ok" and not unavailable:
        return _check("worker", True, "the runtime worker is reachable, compatible and healthy", "")
    detail = f"runtime worker {worker.get('status')}: {worker.get('detail') or 'no detail'}"
    if unavailable:
        detail += f"; unavailable: {unavailable}"
    step = "read the runtime worker's log on the node (python3 -m modelforge_runtime_worker.main)"
    if "artifact_quarantined" in unavailable:
        step = (
            "a model file failed its checksum and was moved to MODELFORGE_WORKER_QUARANTINE_ROOT: restore the "
            "artifact root from the worker's release (or remove the file so the worker repopulates it), "
            "then restart the worker"
        )
    elif worker.get("status") == "unreachable":
        step = "start the runtime worker and check MODELFORGE_AGENT_WORKER_URL points at its socket"
    elif worker.get("status") == "incompatible":
        step = "install a runtime worker whose protocol version this agent accepts (see COMPATIBILITY)"
    return _check("worker", False, detail, step)


def _identity_unique(stores: Stores, node: Node, inventory: Inventory | None, settings: Settings, now: float) -> Check:
    uuids = duplicate_identity.gpu_uuids(inventory.inventory if inventory else None)
    others = duplicate_identity.live_duplicates(stores, settings, node.node_id, uuids, now)
    instances_at = duplicate_identity.duplicate_instances_at(node, settings, now)
    if instances_at is not None:
        return _check(
            "identity_unique", False,
            f"heartbeats come from two agent processes in turn (last at {iso(instances_at)}): two agents run with "
            "this node's identity (a cloned disk or state volume, or an agent left running)",
            "stop the extra agent; a cloned machine needs its own identity: revoke this one "
            "(POST /api/v1/admin/nodes/<node_id>/revoke-credential) and enroll each machine with its own token",
        )  # fmt: skip
    if not others:
        return _check("identity_unique", True, "no other live node reports this node's GPUs", "")
    names = ", ".join(sorted(others))
    since = f" (flagged since {iso(node.duplicate_suspected_at)})" if node.duplicate_suspected_at else ""
    return _check(
        "identity_unique", False,
        f"GPU(s) also reported by live node(s) {names}{since}: one host is enrolled twice, or one of these "
        "nodes reports a GPU it does not have",
        "make the agent's state volume durable (MODELFORGE_AGENT_STATE_VOLUME on mounted storage), then revoke the "
        "identity that should not exist: POST /api/v1/admin/nodes/<node_id>/revoke-credential",
    )  # fmt: skip


def check(stores: Stores, settings: Settings, target_id: str, now: float) -> Readiness:
    """Readiness of a node id, or of the node an enrollment id produced."""
    if credentials.ENROLLMENT_ID_RE.fullmatch(target_id):
        enrollment = enrollments.get(stores, target_id)
        if enrollment.node_id is None:
            state = enrollments.public_state(enrollment, now)
            waiting = _check(
                "connection",
                False,
                f"enrollment is {state}: no node has enrolled with this token yet",
                "start the agent on the node with this enrollment's token (before it expires)",
            )
            return Readiness(node_id=None, enrollment_id=target_id, checks=[waiting])
        target_id = enrollment.node_id
    node = stores.nodes.get(target_id) if credentials.NODE_ID_RE.fullmatch(target_id) else None
    if node is None:
        raise not_found("node")
    inventory = stores.nodes.get_inventory(node.node_id)
    checks = [
        _connection(node, settings, now),
        _inventory_age(node, inventory, settings, now),
        _protocol(node),
        _health(node),
        _telemetry_age(node, inventory, settings, now),
        _identity_unique(stores, node, inventory, settings, now),
        _worker(node),
        _push_channel(node, settings),
        _gpu_health(node, inventory),
    ]
    status = liveness.derive(node.last_heartbeat_at, now, settings.stale_after_seconds, settings.offline_after_seconds)
    return Readiness(node_id=node.node_id, enrollment_id=node.enrollment_id, checks=checks, status=status)
