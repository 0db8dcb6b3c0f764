"""A work item's bytes over the wire: the result a succeeded item serves cannot change after
``complete`` (issue 21, second security pass, item 2), and admins read inputs and results
through the admin API (``GET /api/v1/admin/work/{work_id}/input`` and ``.../result``)."""

from __future__ import annotations

import hashlib
import json
import time

import requests

from tests.support.api import ControlPlane
from tests.support.work_items import claim_until, finish

ECHO = "diagnostic.echo"


def _succeeded(cp: ControlPlane, body: bytes) -> tuple[dict, dict]:
    """A submitted, claimed and completed echo item (with ``body`` as its result), and its claim."""
    submitted = cp.submit_work(ECHO, {"n": time.time()})
    assert submitted.status_code == 201, submitted.text
    node = cp.worker_node(("cpu", ECHO))
    assert cp.heartbeat(node).status_code == 200
    claimed = claim_until(cp, node, submitted.json()["work_id"])
    done = finish(cp, node, claimed, body)
    assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
    return cp.work(claimed["work_id"]), claimed


def test_a_result_replaced_after_complete_does_not_change_what_is_served(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    original = b'{"text":"the checked result"}'
    item, claimed = _succeeded(cp, original)
    # the upload URL is still valid (the lease plus 300 s): a second PUT is accepted by the bucket
    replaced = requests.put(claimed["result_upload_url"], data=b'{"text":"replaced"}', timeout=30)
    assert replaced.status_code == 200
    served = requests.get(item["result"]["url"], timeout=30, allow_redirects=False)
    assert served.status_code == 200 and served.content == original
    assert item["result"]["sha256"] == hashlib.sha256(original).hexdigest()
    assert json.loads(served.content) == {"text": "the checked result"}
