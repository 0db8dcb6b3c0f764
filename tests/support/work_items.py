"""A node's side of a work item, over HTTP: claim a given item, upload its result and complete it."""

from __future__ import annotations

import hashlib
from typing import Any

import requests

from tests.support.api import AgentIdentity, ControlPlane


def finish(
    cp: ControlPlane, identity: AgentIdentity, claimed: dict[str, Any], body: bytes = b'{"ok":true}'
) -> requests.Response:
    """Upload ``body`` to the claim's presigned URL (which must accept it) and complete the item
    with its digest and size: the complete call's answer."""
    upload = requests.put(claimed["result_upload_url"], data=body, timeout=30, allow_redirects=False)
    assert upload.status_code == 200, upload.text
    return cp.lease_call(
        identity,
        claimed["work_id"],
        "complete",
        {"epoch": claimed["epoch"], "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)},
    )


def claim_until(cp: ControlPlane, identity: AgentIdentity, work_id: str) -> dict[str, Any]:
    """Claim until this item comes up, completing whatever else the node can serve that was queued
    before it (earlier tests may have left work)."""
    for _ in range(500):
        response = cp.claim(identity)
        assert response.status_code == 200, response.text
        claimed = response.json()
        if claimed["work_id"] == work_id:
            return claimed
        done = finish(cp, identity, claimed)
        assert done.status_code == 200, done.text
    raise AssertionError(f"{work_id} was never claimed")
