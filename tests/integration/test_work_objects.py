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


def test_admins_read_the_input_and_the_sealed_result_through_the_api(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    original = b'{"text":"read me"}'
    item, claimed = _succeeded(cp, original)
    base = f"/api/v1/admin/work/{item['work_id']}"
    stored_input = requests.get(claimed["input_url"], timeout=30).content
    read_input = cp.admin("GET", f"{base}/input")
    assert read_input.status_code == 200 and read_input.headers["Content-Type"] == "application/json"
    assert read_input.content == stored_input and set(read_input.json()) == {"n"}
    assert requests.put(claimed["result_upload_url"], data=b'{"text":"replaced"}', timeout=30).status_code == 200
    read_result = cp.admin("GET", f"{base}/result")
    assert read_result.status_code == 200 and read_result.headers["Content-Type"] == "application/json"
    assert read_result.content == original


def test_work_object_reads_refuse_with_json_codes(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    queued = cp.submit_work(ECHO, {"n": time.time()}).json()
    base = f"/api/v1/admin/work/{queued['work_id']}"
    for path, status, code in (
        (f"{base}/result", 409, "result_not_ready"),
        ("/api/v1/admin/work/work_" + "0" * 32 + "/input", 404, "work_not_found"),
        ("/api/v1/admin/work/work_" + "0" * 32 + "/result", 404, "work_not_found"),
        (f"{base}/input?x=1", 400, None),
    ):
        refused = cp.admin("GET", path)
        assert refused.status_code == status, (path, refused.text)
        assert code is None or refused.json()["error"]["code"] == code
    for part in ("input", "result"):  # the admin token is required, as on every admin route
        anonymous = cp.request("GET", f"{base}/{part}")
        assert anonymous.status_code == 401 and "error" in anonymous.json()
        assert "n" not in anonymous.json()
