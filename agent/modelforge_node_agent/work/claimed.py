"""One claimed work item and the ways its job can end: ``Lease`` (the claim), ``Done`` (ran and
uploaded), ``Failed`` (to be failed, with a reason) and ``Interrupted`` (settle nothing more).
Plain data: no module of the work loop below this one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelforge_protocol import work
from modelforge_protocol.schemas import FEATURE_NODE_FAULT

from ..worker_client import printable


@dataclass(frozen=True)
class Lease:
    """A claimed work item; the URLs are bearer secrets (kept out of ``repr``, never logged)."""

    work_id: str
    capability: str
    epoch: int
    lease_seconds: int
    input_url: str = field(repr=False)
    result_upload_url: str = field(repr=False)

    @classmethod
    def from_claim(cls, answer: dict[str, Any]) -> Lease:
        return cls(
            answer["work_id"],
            answer["capability"],
            answer["epoch"],
            answer["lease_seconds"],
            answer["input_url"],
            answer["result_upload_url"],
        )

    def fields(self) -> dict[str, Any]:
        return {"work_id": self.work_id, "capability": self.capability, "epoch": self.epoch}


def default_renew_interval(lease_seconds: float) -> float:
    """Renew three times per lease: two renewals can be lost before the lease is."""
    return lease_seconds / 3


@dataclass(frozen=True)
class Done:
    """The job ran and its result was uploaded."""

    sha256: str
    size: int

    def complete_body(self, lease: Lease) -> dict[str, Any]:
        return {"epoch": lease.epoch, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class Failed:
    """The job is to be failed: ``reason`` (``code: what happened``), whether another try may succeed."""

    reason: str
    retryable: bool
    code: str
    #: the node failed, not the item (its worker was busy): sent as ``node_fault`` where the
    #: control plane lists that feature, so the item goes back without counting the attempt
    node_fault: bool = False

    def fail_body(self, lease: Lease, features: frozenset[str] = frozenset()) -> dict[str, Any]:
        reason = printable(self.reason, work.MAX_REASON_CHARS) or self.code
        body: dict[str, Any] = {"epoch": lease.epoch, "reason": reason, "retryable": self.retryable}
        if self.node_fault and FEATURE_NODE_FAULT in features:
            body["node_fault"] = True
        return body


class Interrupted(Exception):
    """The lease was lost or the agent is stopping: settle nothing more here."""
