"""Per-GPU health on the control plane: what agents report, what is latched, drained or missing,
and what keeps a GPU (or a node) from work.

The agent grades each GPU (healthy | degraded | unschedulable | failed | unknown) and reports the
grades when they change (schemas.GPU_HEALTH_REPORT). The control plane keeps, per node, a
``GpuBook`` in the node's inventory item, written only when it changes:

- **Latches.** A hard fault (unschedulable or failed) is latched, keyed by GPU UUID and the host's
  boot id. A latch holds until the node reports from a new boot, or an admin clears it after repair.
  Restarting the agent on the same boot clears nothing: its fresh process may grade the GPU healthy
  (an Xid is an event, not a state), and the latch keeps it from work.
- **Re-checks.** Clearing a latch asks the agent to re-check that GPU (``recheck_gpus`` in the next
  heartbeat answer). The answer that carries it is recorded; the agent's first report after that
  answer decides: still hard-faulted latches again, otherwise the GPU serves.
- **Drains.** An admin drains a node (no new claims at all: the claim transaction checks it) or one
  GPU (the agent's slot for it takes no new work); running jobs finish.
- **Missing GPUs.** Every GPU a node ever reported is ``known``. One that no longer appears is
  ``failed`` with reason ``missing`` until an admin accepts the new set.

The node item carries only two bits (``Node.gpu_blocks``): GPU_BLOCKED (the heartbeat answer must
read the book: something is latched, drained or awaits a re-check) and NODE_DRAINED. So a steady
heartbeat of a healthy node reads and writes nothing more than before.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol import credentials
from modelforge_protocol.schemas import GPU_HEALTH_STATES, GPU_UUID_PATTERN, SCHEDULABLE_GPU_STATES

from chalicelib.domain import requests
from chalicelib.domain.errors import Conflict, GuardFailed, not_found
from chalicelib.domain.records import GPU_BLOCKED, NODE_DRAINED, Event, Inventory
from chalicelib.domain.timestamps import iso
from chalicelib.stores.contract import Holder, Stores

#: Worst first: a GPU's state is the worst of its own report and its latch.
_SEVERITY = {"failed": 4, "unschedulable": 3, "degraded": 2, "unknown": 1, "healthy": 0}
HARD_STATES = frozenset({"unschedulable", "failed"})
#: A read-decide-write that lost to a concurrent one retries from a fresh read this often.
_ATTEMPTS = 3
assert set(_SEVERITY) == set(GPU_HEALTH_STATES)


def worst(*states: str) -> str:
    return max(states, key=lambda state: _SEVERITY[state])


@dataclass
class GpuBook:
    """One node's GPU health as the control plane keeps it (the inventory item's ``gpu_state``)."""

    #: the boot the last report came from
    boot_id: str | None = None
    #: uuid -> {"state", "reasons": [GPU_REASON...], "at"}: each GPU's last reported grade
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: uuid -> {"boot_id", "state", "reasons", "at"}: latched hard faults
    latches: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: uuid -> {"cleared_at", "delivered_at"}: latches an admin cleared, awaiting the agent's re-check
    rechecks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the admin drained the whole node
    drained: bool = False
    #: GPUs the admin drained
    drained_gpus: set[str] = field(default_factory=set)
    #: every GPU the node reported since its set was last accepted
    known: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> GpuBook:
        stored = stored or {}
        return cls(
            boot_id=stored.get("boot_id"),
            reported=copy.deepcopy(stored.get("reported") or {}),
            latches=copy.deepcopy(stored.get("latches") or {}),
            rechecks=copy.deepcopy(stored.get("rechecks") or {}),
            drained=bool(stored.get("drained", False)),
            drained_gpus=set(stored.get("drained_gpus") or ()),
            known=set(stored.get("known") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "boot_id": self.boot_id,
            "reported": self.reported,
            "latches": self.latches,
            "rechecks": self.rechecks,
            "drained": self.drained,
            "drained_gpus": sorted(self.drained_gpus),
            "known": sorted(self.known),
        }

    def blocks(self) -> int:
        """The node item's bits for this book."""
        bits = GPU_BLOCKED if (self.latches or self.rechecks or self.drained_gpus) else 0
        return bits | (NODE_DRAINED if self.drained else 0)


# --- what readers see ---------------------------------------------------------------------------


def inventory_uuids(inventory: Inventory | None) -> list[str]:
    """The GPU UUIDs of the node's current inventory, by index."""
    gpus = (inventory.inventory.get("gpus") or []) if inventory is not None else []
    return [gpu["uuid"] for gpu in sorted(gpus, key=lambda gpu: gpu["index"])]


def gpu_views(inventory: Inventory | None) -> list[dict[str, Any]]:
    """Each GPU's effective health: the current inventory's GPUs, then the missing ones.

    ``state`` is the worst of the agent's grade and the latch; ``schedulable`` also counts drains.
    """
    book = GpuBook.of(inventory.gpu_state if inventory else None)
    current = inventory_uuids(inventory)
    views = [_gpu_view(book, uuid) for uuid in current]
    for uuid in sorted(book.known - set(current)):
        view = _gpu_view(book, uuid)
        since = iso((inventory.updated_at if inventory else 0) or 0)
        view.update(
            state="failed",
            missing=True,
            schedulable=False,
            reasons=[{"code": "missing", "action": "unknown", "since": since}, *view["reasons"]],
        )
        views.append(view)
    return views


def _gpu_view(book: GpuBook, uuid: str) -> dict[str, Any]:
    reported = book.reported.get(uuid)
    latch = book.latches.get(uuid)
    state = reported["state"] if reported else "unknown"
    reasons = list(reported["reasons"]) if reported else []
    if latch is not None:
        state = worst(state, latch["state"])
        codes = {reason["code"] for reason in reasons}
        reasons += [reason for reason in latch["reasons"] if reason["code"] not in codes]
    drained = uuid in book.drained_gpus or book.drained
    return {
        "uuid": uuid,
        "state": state,
        "reasons": reasons,
        "latched": latch is not None,
        "recheck_pending": uuid in book.rechecks,
        "drained": uuid in book.drained_gpus,
        "missing": False,
        "schedulable": state in SCHEDULABLE_GPU_STATES and not drained and latch is None,
        "reported": reported is not None,
    }


@dataclass(frozen=True)
class GpuAnswer:
    """What a heartbeat answer tells the agent (schemas.HEARTBEAT_ANSWER)."""

    drained: bool
    #: [{"uuid", "reason": "latched" | "drained"}]
    blocked: list[dict[str, str]]
    recheck: list[str]


def answer_of(book: GpuBook) -> GpuAnswer:
    blocked = [{"uuid": uuid, "reason": "latched"} for uuid in sorted(book.latches)]
    latched = set(book.latches)
    blocked += [{"uuid": uuid, "reason": "drained"} for uuid in sorted(book.drained_gpus - latched)]
    return GpuAnswer(drained=book.drained, blocked=blocked, recheck=sorted(book.rechecks))


# --- the agent's report -------------------------------------------------------------------------


def _reason_json(reason: requests.GpuReason) -> dict[str, Any]:
    shaped: dict[str, Any] = {"code": reason.code, "action": reason.action, "since": reason.since}
    if reason.xid is not None:
        shaped["xid"] = reason.xid
    if reason.value is not None:
        shaped["value"] = reason.value
    return shaped


def apply_report(
    book: GpuBook, boot_id: str | None, gpus: Iterable[requests.GpuHealthReport], now: float
) -> tuple[GpuBook, list[str]]:
    """The book after the agent's report at ``now``, and what changed (for the event): pure."""
    book = copy.deepcopy(book)
    changed: list[str] = []
    if boot_id is not None and boot_id != book.boot_id:
        released = sorted(uuid for uuid, latch in book.latches.items() if latch["boot_id"] != boot_id)
        for uuid in released:
            del book.latches[uuid]
            book.rechecks.pop(uuid, None)
        changed += [f"released:{uuid}" for uuid in released]
        book.boot_id = boot_id
    for gpu in gpus:
        reported = {"state": gpu.state, "reasons": [_reason_json(reason) for reason in gpu.reasons]}
        if {key: (book.reported.get(gpu.uuid) or {}).get(key) for key in reported} != reported:
            changed.append(f"reported:{gpu.uuid}")
        book.reported[gpu.uuid] = {**reported, "at": round(now, 3)}
        if gpu.uuid not in book.known:
            book.known.add(gpu.uuid)
            changed.append(f"known:{gpu.uuid}")
        recheck = book.rechecks.get(gpu.uuid)
        if recheck is not None:
            if recheck.get("delivered_at") is None or now <= recheck["delivered_at"]:
                continue  # sent before the agent learned of the clear: it decides nothing
            del book.rechecks[gpu.uuid]
            changed.append(f"rechecked:{gpu.uuid}")
        if gpu.state in HARD_STATES and gpu.uuid not in book.latches:
            book.latches[gpu.uuid] = {
                "boot_id": book.boot_id,
                "state": gpu.state,
                "reasons": reported["reasons"],
                "at": round(now, 3),
            }
            changed.append(f"latched:{gpu.uuid}")
        elif gpu.uuid in book.latches and _SEVERITY[gpu.state] > _SEVERITY[book.latches[gpu.uuid]["state"]]:
            book.latches[gpu.uuid].update(state=gpu.state, reasons=reported["reasons"])  # it got worse
            changed.append(f"latched:{gpu.uuid}")
    return book, changed


def report(
    stores: Stores, holder: Holder, boot_id: str | None, gpus: tuple[requests.GpuHealthReport, ...], now: float
) -> GpuAnswer:
    """Record the agent's report (one read; one transaction only when something changed)."""

    def decide(book: GpuBook, inventory: Inventory) -> tuple[GpuBook, list[str]]:
        return apply_report(book, boot_id, gpus, now)

    book = _write(stores, holder.node_id, decide, holder, "report", now)
    return answer_of(book)


def delivered(stores: Stores, holder: Holder, now: float) -> GpuAnswer | None:
    """The answer for a node whose GPUs are blocked, recording that this answer carries its
    pending re-checks (so the agent's next report decides them). None: the node has no inventory."""

    def decide(book: GpuBook, inventory: Inventory) -> tuple[GpuBook, list[str]]:
        book = copy.deepcopy(book)
        fresh = [uuid for uuid, recheck in book.rechecks.items() if recheck.get("delivered_at") is None]
        for uuid in fresh:
            book.rechecks[uuid]["delivered_at"] = round(now, 3)
        return book, [f"recheck_delivered:{uuid}" for uuid in fresh]

    try:
        return answer_of(_write(stores, holder.node_id, decide, holder, "recheck_delivered", now))
    except LookupError:
        return None


# --- admins -------------------------------------------------------------------------------------


def clear(stores: Stores, node_id: str, uuid: str, now: float) -> None:
    """Clear a latched fault after repair; the agent re-checks the GPU before it takes work."""

    def decide(book: GpuBook, inventory: Inventory) -> tuple[GpuBook, list[str]]:
        _require_gpu(book, inventory, uuid)
        if uuid not in book.latches:
            raise Conflict("gpu_fault_not_latched", f"GPU {uuid} has no latched fault to clear")
        book = copy.deepcopy(book)
        del book.latches[uuid]
        book.rechecks[uuid] = {"cleared_at": round(now, 3), "delivered_at": None}
        return book, [f"cleared:{uuid}"]

    _admin_write(stores, node_id, decide, "clear", now)


def drain(stores: Stores, node_id: str, uuid: str | None, drained: bool, now: float) -> None:
    """Drain (or undrain) the node, or one of its GPUs; changing nothing is not an error."""

    def decide(book: GpuBook, inventory: Inventory) -> tuple[GpuBook, list[str]]:
        book = copy.deepcopy(book)
        if uuid is None:
            changed = book.drained != drained
            book.drained = drained
            return book, ["node"] if changed else []
        _require_gpu(book, inventory, uuid)
        changed = (uuid in book.drained_gpus) != drained
        book.drained_gpus = book.drained_gpus | {uuid} if drained else book.drained_gpus - {uuid}
        return book, [uuid] if changed else []

    _admin_write(stores, node_id, decide, "drain" if drained else "undrain", now)


def accept_gpus(stores: Stores, node_id: str, now: float) -> None:
    """Accept the node's current GPU set: missing GPUs are forgotten, with their latches and drains."""

    def decide(book: GpuBook, inventory: Inventory) -> tuple[GpuBook, list[str]]:
        current = set(inventory_uuids(inventory))
        gone = book.known - current
        book = copy.deepcopy(book)
        book.known = current
        for uuid in gone:
            book.latches.pop(uuid, None)
            book.rechecks.pop(uuid, None)
            book.reported.pop(uuid, None)
            book.drained_gpus.discard(uuid)
        return book, [f"forgotten:{uuid}" for uuid in sorted(gone)]

    _admin_write(stores, node_id, decide, "accept_gpus", now)


def _require_gpu(book: GpuBook, inventory: Inventory, uuid: str) -> None:
    """404 unless the node reported this GPU (in its inventory or its health)."""
    seen = book.known | set(book.reported) | set(inventory_uuids(inventory))
    if not re.fullmatch(GPU_UUID_PATTERN, uuid) or uuid not in seen:
        raise not_found("gpu")


# --- the one read-decide-write ------------------------------------------------------------------


_Decide = Callable[[GpuBook, Inventory], tuple[GpuBook, list[str]]]


def _admin_write(stores: Stores, node_id: str, decide: _Decide, cause: str, now: float) -> None:
    if not credentials.NODE_ID_RE.fullmatch(node_id) or stores.nodes.get(node_id) is None:
        raise not_found("node")
    try:
        _write(stores, node_id, decide, None, cause, now)
    except LookupError:
        raise not_found("node") from None


def _write(stores: Stores, node_id: str, decide: _Decide, holder: Holder | None, cause: str, now: float) -> GpuBook:
    """Read the book, decide, and write it (with the node's block bits) only when ``decide``
    changed something; a concurrent write makes it decide again from a fresh read. LookupError:
    the node has no inventory."""
    for _ in range(_ATTEMPTS):
        inventory = stores.nodes.get_inventory(node_id)
        if inventory is None:
            raise LookupError(node_id)
        book, changed = decide(GpuBook.of(inventory.gpu_state), inventory)
        if not changed:
            return book
        revision = int(inventory.gpu_revision or 0) + 1
        event = Event("gpu.state_changed", {"node_id": node_id, "cause": cause}, now)
        try:
            stores.nodes.write_gpu_state(node_id, book.to_json(), revision, book.blocks(), holder, event)
        except GuardFailed:
            continue
        return book
    raise Conflict("gpu_state_conflict", "the node's GPU state changed concurrently; retry")
