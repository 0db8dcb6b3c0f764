"""Many agents presenting one enrollment token at the same instant, over HTTP."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

from tests.support.api import AgentIdentity, ControlPlane


@dataclass(frozen=True)
class RoundResult:
    statuses: dict[int, int]
    created: int
    nodes: int
    active_credentials: int
    enrollment_status: str

    @property
    def exactly_one_winner(self) -> bool:
        return self.created == 1 and self.nodes == 1 and self.active_credentials == 1

    @property
    def double_winner(self) -> bool:
        """Two callers both passed the single-use condition (not merely: nobody won)."""
        return self.created >= 2 or self.nodes >= 2


def enrollment_round(cp: ControlPlane, attempts: int = 60) -> RoundResult:
    minted = cp.mint(display_name="race")
    barrier = threading.Barrier(attempts)

    def attempt(index: int) -> int:
        identity = AgentIdentity()
        with requests.Session() as session:
            body = cp.enroll_body(minted["token"], identity, hostname=f"racer-{index}")
            barrier.wait(timeout=60)
            response = session.post(cp.base_url + "/api/v1/agent/enroll", json=body, timeout=120)
            return response.status_code

    with ThreadPoolExecutor(max_workers=attempts) as pool:
        statuses = collections.Counter(pool.map(attempt, range(attempts)))
    nodes = [node for node in cp.all_nodes() if node["enrollment_id"] == minted["enrollment_id"]]
    enrollment = cp.admin("GET", f"/api/v1/admin/node-enrollments/{minted['enrollment_id']}").json()
    return RoundResult(
        statuses=dict(statuses),
        created=statuses.get(201, 0),
        nodes=len(nodes),
        active_credentials=sum(1 for node in nodes if node["credential"]["state"] == "active"),
        enrollment_status=enrollment["status"],
    )
