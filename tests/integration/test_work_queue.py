"""The work queue over HTTP against the local stack: submit, claim, renew, complete, fail, cancel,
leases, fencing, the sweep's lease expiry and the heartbeat's hint."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import time
from typing import Any

import pytest
import requests
from chalicelib import instance
from chalicelib.domain import requests as typed
from chalicelib.domain.errors import GuardFailed
from chalicelib.services import nodes, sweep, work
from chalicelib.services.auth import NodeCaller
from chalicelib.stores.contract import Holder
from modelforge_protocol.credentials import sha256_hex

from tests.support.api import AgentIdentity, ControlPlane
from tests.support.snapshots import state, writes_so_far
from tests.support.stores import stores
from tests.support.work_items import claim_until, finish

ECHO = "diagnostic.echo"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def _settings(**changes: Any) -> Any:
    return dataclasses.replace(instance.get().settings, **changes)


def _submitted(cp: ControlPlane, document: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    response = cp.submit_work(ECHO, document if document is not None else {"n": time.time()}, **options)
    assert response.status_code == 201, response.text
    return response.json()


def _online(cp: ControlPlane, capabilities: tuple[str, ...] = ("cpu", ECHO)) -> AgentIdentity:
    identity = cp.worker_node(capabilities)
    assert cp.heartbeat(identity).status_code == 200
    return identity


def _item(work_id: str) -> Any:
    item = stores().work.get(work_id)
    assert item is not None
    return item


def test_submitted_work_is_claimed_completed_and_its_result_fetched(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp, {"hello": "world"})
    assert submitted["status"] == "queued" and submitted["attempts"] == 0 and submitted["max_attempts"] == 3
    assert submitted["lease_seconds"] == 60 and submitted["result"] is None
    node = _online(cp)
    claimed = claim_until(cp, node, submitted["work_id"])
    assert claimed["capability"] == ECHO and claimed["epoch"] == 1
    for url in (claimed["input_url"], claimed["result_upload_url"]):
        assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url  # SigV4: what current buckets accept
    # the input is exactly what was submitted, behind a presigned GET
    fetched = requests.get(claimed["input_url"], timeout=30, allow_redirects=False)
    assert fetched.status_code == 200 and json.loads(fetched.content) == {"hello": "world"}
    leased = cp.work(submitted["work_id"])
    assert (leased["status"], leased["node_id"], leased["attempts"]) == ("leased", node.node_id, 1)
    assert leased["lease_expires_at"] is not None

    body = b'{"sha256":"abc"}'
    done = finish(cp, node, claimed, body)
    assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
    final = cp.work(submitted["work_id"])
    assert final["status"] == "succeeded" and final["node_id"] == node.node_id and final["lease_expires_at"] is None
    assert final["result"]["sha256"] == hashlib.sha256(body).hexdigest() and final["result"]["size"] == len(body)
    result = requests.get(final["result"]["url"], timeout=30, allow_redirects=False)
    assert result.status_code == 200 and hashlib.sha256(result.content).hexdigest() == final["result"]["sha256"]


def test_a_node_that_does_not_serve_the_capability_gets_nothing(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    _submitted(cp)
    plain = _online(cp, ("cpu",))
    response = cp.claim(plain)
    assert response.status_code == 204 and response.content == b""


def test_complete_checks_the_uploaded_result(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp)
    node = _online(cp)
    claimed = claim_until(cp, node, submitted["work_id"])
    work_id, epoch = claimed["work_id"], claimed["epoch"]
    missing = cp.lease_call(node, work_id, "complete", {"epoch": epoch, "sha256": "0" * 64, "size": 2})
    assert missing.status_code == 409 and missing.json()["error"]["code"] == "result_missing"
    assert requests.put(claimed["result_upload_url"], data=b"{}", timeout=30).status_code == 200
    wrong = cp.lease_call(node, work_id, "complete", {"epoch": epoch, "sha256": "0" * 64, "size": 2})
    assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "result_checksum_mismatch"
    assert _item(work_id).status == "leased"


def test_stale_epochs_and_other_nodes_are_fenced_off_and_change_nothing(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp, lease_seconds=10)
    holder, other = _online(cp), _online(cp)
    first = claim_until(cp, holder, submitted["work_id"])
    # the lease expires and another node claims the item: the first holder's epoch is stale
    report = sweep.run(stores(), _settings(mass_stale_fraction=1.0), time.time() + 11)
    assert report.leases_expired >= 1
    assert cp.heartbeat(other).status_code == 200
    second = claim_until(cp, other, submitted["work_id"])
    assert second["epoch"] == first["epoch"] + 1
    before = dataclasses.asdict(_item(submitted["work_id"]))
    body = b"{}"
    requests.put(first["result_upload_url"], data=body, timeout=30)
    stale = {"epoch": first["epoch"]}
    for action, extra in (
        ("renew", {}),
        ("complete", {"sha256": hashlib.sha256(body).hexdigest(), "size": 2}),
        ("fail", {"reason": "late", "retryable": True}),
    ):
        refused = cp.lease_call(holder, submitted["work_id"], action, {**stale, **extra})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "lease_lost", (action, refused.text)
        # the current epoch, from the wrong node
        intruder = cp.lease_call(holder, submitted["work_id"], action, {"epoch": second["epoch"], **extra})
        assert intruder.status_code == 409 and intruder.json()["error"]["code"] == "lease_lost"
    assert dataclasses.asdict(_item(submitted["work_id"])) == before
    assert cp.lease_call(other, submitted["work_id"], "renew", {"epoch": second["epoch"]}).status_code == 200


def test_failures_requeue_until_max_attempts_then_the_item_is_dead_with_every_reason(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp, max_attempts=2)
    node = _online(cp)
    for attempt in (1, 2):
        claimed = claim_until(cp, node, submitted["work_id"])
        failed = cp.lease_call(
            node,
            claimed["work_id"],
            "fail",
            {"epoch": claimed["epoch"], "reason": f"boom {attempt}", "retryable": True},
        )
        assert failed.status_code == 200, failed.text
    final = cp.work(submitted["work_id"])
    assert final["status"] == "dead" and final["attempts"] == 2
    assert [error["reason"] for error in final["errors"]] == ["boom 1", "boom 2"]


def test_a_failure_that_is_not_retryable_ends_the_item_at_once(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp)
    node = _online(cp)
    claimed = claim_until(cp, node, submitted["work_id"])
    cp.lease_call(
        node, claimed["work_id"], "fail", {"epoch": claimed["epoch"], "reason": "undecodable image", "retryable": False}
    )
    final = cp.work(submitted["work_id"])
    assert final["status"] == "dead" and final["attempts"] == 1 and final["errors"][0]["retryable"] is False


def test_a_node_fault_puts_the_item_back_without_counting_the_attempt(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    """Over the wire: a node whose worker was busy fails its only attempt as a node fault; the
    item is queued again with no attempt counted, and the work view says so."""
    submitted = _submitted(cp, max_attempts=1)
    node = _online(cp)
    claimed = claim_until(cp, node, submitted["work_id"])
    body = {"epoch": claimed["epoch"], "reason": "worker_busy: every slot is taken", "retryable": True}
    failed = cp.lease_call(node, claimed["work_id"], "fail", {**body, "node_fault": True})
    assert failed.status_code == 200, failed.text
    item = cp.work(submitted["work_id"])
    assert (item["status"], item["attempts"]) == ("queued", 0)
    assert item["errors"][0]["node_fault"] is True
    refused = cp.lease_call(node, claimed["work_id"], "fail", {**body, "node_fault": "yes"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request", refused.text
    assert cp.work(submitted["work_id"]) == item  # a bad body changes nothing


def test_an_expired_lease_is_requeued_and_counts_the_attempt(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp, lease_seconds=10, max_attempts=1)
    node = _online(cp)
    claim_until(cp, node, submitted["work_id"])
    sweep.run(stores(), _settings(mass_stale_fraction=1.0), time.time() + 5)
    assert _item(submitted["work_id"]).status == "leased"  # not expired yet
    sweep.run(stores(), _settings(mass_stale_fraction=1.0), time.time() + 11)
    final = cp.work(submitted["work_id"])
    assert final["status"] == "dead" and final["errors"][0]["reason"].startswith("lease_expired")


def test_a_node_marked_offline_loses_its_leases_at_once(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    settings = _settings(mass_stale_fraction=1.0)
    submitted = _submitted(cp, lease_seconds=3600)
    node = cp.worker_node(("cpu", ECHO))
    caller = NodeCaller(node_id=node.node_id, credential_sha256=sha256_hex(node.credential))  # type: ignore[arg-type]
    # the node came online, claimed and went silent long ago: stale, then offline, long before its
    # lease would expire (its whole life at ``then``, as the sweep's index saw it come online then)
    then = time.time() - settings.offline_after_seconds - 10
    nodes.heartbeat(stores(), settings, caller, typed.heartbeat(cp.heartbeat_body()), then)  # pending -> online
    claimed = None
    for _ in range(50):  # items other tests left queued go to this node too; the sweep releases them all
        got = work.claim(stores(), settings, caller, then)
        assert got is not None, "the submitted item was not claimable"
        if got.item.work_id == submitted["work_id"]:
            claimed = {"epoch": got.item.epoch}
            break
    assert claimed is not None
    sweep.run(stores(), settings, then + settings.stale_after_seconds + 1)
    report = sweep.run(stores(), settings, time.time())
    assert stores().nodes.get(node.node_id).liveness == "offline"  # type: ignore[union-attr]
    assert report.leases_released >= 1
    item = _item(submitted["work_id"])
    assert item.status == "queued" and item.errors[-1]["reason"].startswith("node_offline")  # type: ignore[index]
    renew = cp.lease_call(node, submitted["work_id"], "renew", {"epoch": claimed["epoch"]})
    assert renew.status_code == 409 and renew.json()["error"]["code"] == "lease_lost"


def test_a_stale_node_gets_no_work_even_while_its_persisted_status_says_online(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    settings = _settings()
    submitted = _submitted(cp)
    node = cp.worker_node(("cpu", ECHO))
    caller = NodeCaller(node_id=node.node_id, credential_sha256=sha256_hex(node.credential))  # type: ignore[arg-type]
    nodes.heartbeat(
        stores(), settings, caller, typed.heartbeat(cp.heartbeat_body()), time.time() - settings.stale_after_seconds - 1
    )
    assert stores().nodes.get(node.node_id).liveness == "online"  # type: ignore[union-attr]  # no sweep ran
    refused = cp.claim(node)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "node_not_online"
    assert _item(submitted["work_id"]).status == "queued"
    # and the check is inside the claim's own transaction: the same write, with the node judged at
    # a later instant, is refused by DynamoDB itself and changes nothing
    item = _item(submitted["work_id"])
    with pytest.raises(GuardFailed) as refused_by_the_table:
        stores().work.lease(
            item,  # type: ignore[arg-type]
            Holder(node.node_id, caller.credential_sha256),
            time.time() + 1,
            time.time() + 60,
            time.time(),
            _event(item.work_id),
        )
    assert refused_by_the_table.value is not None
    # the item was queued at the epoch read, so the node's check is what refused the write
    assert (_item(submitted["work_id"]).status, _item(submitted["work_id"]).epoch) == ("queued", item.epoch)


def _event(work_id: str) -> Any:
    from chalicelib.domain.records import Event

    return Event("work.leased", {"work_id": work_id}, time.time())


def test_cancel_stops_queued_and_running_work_and_refuses_finished_work(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    queued = _submitted(cp)
    cancelled = cp.admin("POST", f"/api/v1/admin/work/{queued['work_id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = cp.admin("POST", f"/api/v1/admin/work/{queued['work_id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "work_finished"

    running = _submitted(cp)
    node = _online(cp)
    claimed = claim_until(cp, node, running["work_id"])
    assert cp.admin("POST", f"/api/v1/admin/work/{running['work_id']}/cancel").json()["status"] == "cancelled"
    renew = cp.lease_call(node, running["work_id"], "renew", {"epoch": claimed["epoch"]})
    assert renew.status_code == 409 and renew.json()["error"]["code"] == "work_cancelled"


def test_an_idempotent_submit_returns_the_same_item(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    key = f"retry-{time.time_ns()}"
    first = cp.submit_work(ECHO, {"a": 1}, idempotency_key=key)
    second = cp.submit_work(ECHO, {"a": 1}, idempotency_key=key)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["work_id"] == second.json()["work_id"]
    reused = cp.submit_work(ECHO, {"a": 2}, idempotency_key=key)
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "idempotency_key_reused"


def test_the_list_filters_by_status_and_capability(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    submitted = _submitted(cp)
    listing = cp.admin("GET", "/api/v1/admin/work", params={"status": "queued", "capability": ECHO, "limit": "100"})
    assert listing.status_code == 200
    found, token = list(listing.json()["work"]), listing.json()["next_token"]
    while token:
        page = cp.admin(
            "GET", "/api/v1/admin/work", params={"status": "queued", "capability": ECHO, "next_token": token}
        ).json()
        found += page["work"]
        token = page["next_token"]
    assert submitted["work_id"] in {item["work_id"] for item in found}
    assert {item["status"] for item in found} == {"queued"}
    bad = cp.admin("GET", "/api/v1/admin/work", params={"status": "running"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def test_the_heartbeat_hints_at_queued_work_for_the_nodes_capabilities_only(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    worker, plain = _online(cp, ("cpu", "ocr")), _online(cp, ("cpu",))
    instance.get().work_hint.forget()
    while cp.claim(worker).status_code == 200:  # drain what earlier tests left
        pass
    instance.get().work_hint.forget()
    assert cp.heartbeat(worker).json()["work_waiting"] is False
    image = base64.b64encode(PNG).decode()
    assert cp.submit_work("ocr", {"image_base64": image}).status_code == 201
    instance.get().work_hint.forget()
    assert cp.heartbeat(worker).json()["work_waiting"] is True
    assert cp.heartbeat(plain).json()["work_waiting"] is False


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"capability": "translate", "input": {}}, "invalid_request"),
        ({"capability": ECHO}, "invalid_request"),
        ({"capability": "ocr", "input": {}}, "invalid_request"),
        ({"capability": "ocr", "input": {"image_base64": "not base64!"}}, "invalid_input"),
        ({"capability": "ocr", "input": {"image_base64": base64.b64encode(b"GIF89a....").decode()}}, "invalid_input"),
        ({"capability": "ocr", "input": {"image_base64": 7}}, "invalid_request"),
        ({"capability": ECHO, "input": {}, "max_attempts": 11}, "invalid_request"),
        ({"capability": ECHO, "input": {}, "lease_seconds": 9}, "invalid_request"),
        ({"capability": ECHO, "input": {}, "extra": True}, "invalid_request"),
    ],
)
def test_bad_submissions_get_a_4xx_code_and_change_nothing(
    counted_stack, cp: ControlPlane, body: dict[str, Any], code: str
) -> None:  # type: ignore[no-untyped-def]
    counted_stack.drain_state_log()
    writes = writes_so_far(counted_stack)
    response = cp.admin("POST", "/api/v1/admin/work", json=body)
    assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
    counted_stack.drain_state_log()
    if writes_so_far(counted_stack) != writes:  # something wrote meanwhile: was it this request?
        before = state(counted_stack.aws_endpoint_url, counted_stack.names)
        cp.admin("POST", "/api/v1/admin/work", json=body)
        counted_stack.drain_state_log()
        assert state(counted_stack.aws_endpoint_url, counted_stack.names) == before


def test_an_oversized_submission_is_refused_before_it_is_read(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    from modelforge_protocol.work import MAX_SUBMIT_BODY_BYTES

    big = {"capability": "ocr", "input": {"image_base64": "A" * MAX_SUBMIT_BODY_BYTES}}
    response = cp.admin("POST", "/api/v1/admin/work", json=body_of(big))
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    # and the usual limit still holds everywhere else
    node = _online(cp)
    heavy = cp.request("POST", "/api/v1/agent/work/claim", headers=node.headers(), data=b"{" + b" " * 70_000 + b"}")
    assert heavy.status_code == 413


def body_of(document: dict[str, Any]) -> dict[str, Any]:
    return document


def test_claims_take_every_queued_item_whatever_its_queue_shard(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    """The queue is sharded (stores/work_store.py): claims take items from any shard, in no fixed
    order, and a claim answers 204 only when every shard is empty."""
    node = _online(cp)
    while (response := cp.claim(node)).status_code == 200:  # what earlier tests left queued
        finish(cp, node, response.json())
    submitted = {_submitted(cp)["work_id"] for _ in range(5)}
    claimed = {cp.claim(node).json()["work_id"] for _ in range(5)}
    assert claimed == submitted
    assert cp.claim(node).status_code == 204


def test_a_heartbeats_slots_reach_the_node_view_and_impossible_ones_are_refused(stack, cp: ControlPlane) -> None:  # type: ignore[no-untyped-def]
    node = _online(cp)
    assert cp.node(node.node_id)["slots"] is None  # never reported
    slots = {"total": 4, "busy": 1, "schedulable": 3}
    assert cp.heartbeat(node, slots=slots).status_code == 200
    shown = cp.node(node.node_id)
    assert shown["slots"] == slots
    refused = cp.heartbeat(node, slots={"total": 4, "busy": 5, "schedulable": 3})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request", refused.text
    assert "must not exceed total" in refused.json()["error"]["message"]
    assert cp.node(node.node_id)["slots"] == slots
