"""The S3 state log: every transition once, immutable, and enough to rebuild the tables."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from typing import Any

import boto3
from chalicelib.stores.node_store import EPHEMERAL_ITEM_NAMES, HEARTBEAT_ITEM_NAMES
from chalicelib.stores.park_store import PARK_PREFIX
from chalicelib.stores.state_log import state_log_key
from modelforge_local_stack import provision
from modelforge_local_stack.replay import TABLE_ENV

from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.polling import wait_until
from tests.support.processes import cli_command, run_to_exit, start_local_up
from tests.support.snapshots import scan_table, state_log_objects


def _scenario(cp: ControlPlane) -> None:
    """Every kind of transition the control plane logs today."""
    cp.mint(display_name="never used")
    revoked = cp.mint(display_name="revoked")
    assert cp.admin("POST", f"/api/v1/admin/node-enrollments/{revoked['enrollment_id']}/revoke").status_code == 200
    kept = cp.enrolled_node()
    cp.heartbeat(kept)
    cp.heartbeat(kept)
    response = cp.request(
        "POST",
        "/api/v1/agent/inventory",
        headers=kept.headers(),
        json={"protocol_version": 1, "inventory": gpu_inventory(4)},
    )
    assert response.status_code == 200, response.text
    gone = cp.enrolled_node()
    cp.heartbeat(gone)
    assert cp.admin("POST", f"/api/v1/admin/nodes/{gone.node_id}/revoke-credential").status_code == 200


def _outbox_payloads(stack) -> dict[str, str]:  # type: ignore[no-untyped-def]
    items = scan_table(stack.aws_endpoint_url, stack.names["MODELFORGE_OUTBOX_TABLE"])
    return {item["event_id"]["S"]: item["payload"]["S"] for item in items}


def test_every_outbox_event_lands_in_s3_once_under_its_event_id(stack, cp: ControlPlane) -> None:
    _scenario(cp)
    stack.drain_state_log()
    objects = state_log_objects(stack.aws_endpoint_url, stack.names["MODELFORGE_STATE_LOG_BUCKET"])
    outbox = _outbox_payloads(stack)
    assert {f"events/{event_id}.json" for event_id in outbox} == set(objects)
    for event_id, payload in outbox.items():
        assert objects[f"events/{event_id}.json"] == payload.encode()
    types = {json.loads(body)["type"] for body in objects.values()}
    assert {
        "enrollment.created",
        "enrollment.revoked",
        "enrollment.consumed",
        "node.registered",
        "credential.issued",
        "credential.revoked",
        "inventory.replaced",
        "node.liveness_changed",
    } <= types


def _s3(stack):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=stack.aws_endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def _bucket_keys(s3, bucket: str) -> set[str]:  # type: ignore[no-untyped-def]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {entry["Key"] for page in pages for entry in page.get("Contents", [])}


def test_redelivered_stream_records_change_nothing(stack, cp: ControlPlane) -> None:
    """Stream records of events already shipped, redelivered with a tampered payload: nothing is
    shipped again and no object changes. Only this test's own events are redelivered (the
    handler writes under the key of the record's event id only, so they are all it could touch),
    and the bucket's key list shows that nothing else was written."""
    minted = cp.mint(display_name="redelivery")
    path = f"/api/v1/admin/node-enrollments/{minted['enrollment_id']}/revoke"
    assert cp.admin("POST", path).status_code == 200
    stack.drain_state_log()
    event_ids = [
        event_id
        for event_id, payload in _outbox_payloads(stack).items()
        if json.loads(payload)["subject"].get("enrollment_id") == minted["enrollment_id"]
    ]
    assert len(event_ids) == 2, event_ids  # enrollment.created and enrollment.revoked
    s3, bucket = _s3(stack), stack.names["MODELFORGE_STATE_LOG_BUCKET"]
    keys_before = _bucket_keys(s3, bucket)
    ours = [state_log_key(event_id) for event_id in event_ids]
    assert set(ours) <= keys_before, "the events were shipped before they are redelivered"
    before = {key: s3.get_object(Bucket=bucket, Key=key)["Body"].read() for key in ours}
    records = [
        {
            "eventID": f"redelivery-{index}",
            "eventName": "INSERT",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "eventSourceARN": "arn:aws:dynamodb:us-east-1:000000000000:table/outbox/stream/x",
            "dynamodb": {
                "ApproximateCreationDateTime": 0,
                "NewImage": {"event_id": {"S": event_id}, "payload": {"S": '{"tampered": true}'}},
                "SequenceNumber": str(index),
                "SizeBytes": 1,
                "StreamViewType": "NEW_IMAGE",
            },
        }
        for index, event_id in enumerate(event_ids)
    ]
    result = stack.app_module.state_log({"Records": records}, None)
    assert result == {"shipped": 0, "already_present": len(records)}
    assert _bucket_keys(s3, bucket) == keys_before
    assert {key: s3.get_object(Bucket=bucket, Key=key)["Body"].read() for key in ours} == before


def _comparable(items: list[dict], drop: tuple[str, ...] = ()) -> list[dict]:
    return sorted(
        ({key: value for key, value in item.items() if key not in drop} for item in items),
        key=lambda item: json.dumps(item, sort_keys=True),
    )


def _ephemeral(item: dict) -> bool:
    """A park item of the control table: ephemeral state, never logged (docs/DISPATCH.md)."""
    return str(item.get("name", {}).get("S", "")).startswith(PARK_PREFIX)


def test_log_replay_rebuilds_tables_equal_to_the_live_ones(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On its own control plane: other tests move clocks, which a real deployment never does."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the emulator takes any (and
        monkeypatch.setenv(name, "local")  # the session stack may not have set them yet)
    from tests.conftest import ADMIN_TOKEN

    # no scheduled sweep: the test runs the sweeps itself, on clocks it chooses
    env = {"MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN, "MODELFORGE_SWEEP_INTERVAL_SECONDS": "3600"}
    with start_local_up(tmp_path / "local-up.log", env=env) as running:
        _replay_and_compare(ControlPlane(running.api_url, ADMIN_TOKEN), running.emulator_url)


def _wait_until_shipped(endpoint: str, names: dict[str, str]) -> None:
    def shipped() -> bool:
        outbox = scan_table(endpoint, names["MODELFORGE_OUTBOX_TABLE"])
        return len(state_log_objects(endpoint, names["MODELFORGE_STATE_LOG_BUCKET"])) == len(outbox)

    wait_until(shipped, 30, "the state log to catch up with the outbox", interval=0.2)


#: The deployed sweep code, run in its own process against the local stack's tables, at the clocks
#: and mass-stale fractions given as JSON; "drop_counter" first removes the online-node counter,
#: as a deployment from before the counter (or a counter removed by hand) has none.
_SWEEPS = """
import dataclasses, json, sys
from chalicelib.services import sweep
from chalicelib import instance
from chalicelib.stores.models import ControlModel
from chalicelib.domain.records import ONLINE_NODES
for step in json.loads(sys.argv[1]):
    if step.get("drop_counter"):
        ControlModel(ONLINE_NODES).delete()
    settings = dataclasses.replace(instance.get().settings, mass_stale_fraction=step["fraction"])
    print(json.dumps(sweep.report_dict(sweep.run(instance.get().stores, settings, step["now"]))))
"""


def _run_sweeps(endpoint: str, names: dict[str, str], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from tests.conftest import ADMIN_TOKEN, repo_root

    env = {
        **names,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "MODELFORGE_ADMIN_TOKEN": ADMIN_TOKEN,
        "PYTHONPATH": str(repo_root() / "functions"),
    }
    done = run_to_exit([sys.executable, "-c", _SWEEPS, json.dumps(steps)], env, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _sweep_scenario(cp: ControlPlane, endpoint: str, names: dict[str, str]) -> None:
    """Sweep transitions, a mass-stale hold and its release, and a counter repair: every online
    node falls silent at once (held), the counter goes missing (repaired, still held), the sweep
    then applies the transitions (released: online -> stale), and later stale -> offline."""
    for identity in [cp.enrolled_node() for _ in range(10)]:
        assert cp.heartbeat(identity).status_code == 200
    stale, offline = (int(os.environ[f"MODELFORGE_NODE_{name}_AFTER_SECONDS"]) for name in ("STALE", "OFFLINE"))
    silent = time.time() + stale + 1  # later than every event so far: replay applies these last
    reports = _run_sweeps(
        endpoint,
        names,
        [
            {"now": silent, "fraction": 0.5},
            {"now": silent + 1, "fraction": 0.5, "drop_counter": True},
            {"now": silent + 2, "fraction": 1.0},
            {"now": silent - stale + offline, "fraction": 1.0},
        ],
    )
    online = reports[0]["stale_candidates"]
    assert online >= 10 and [r["held"] for r in reports] == [True, True, False, False]
    assert [r["transitioned"] for r in reports] == [0, 0, online, online]


def _work_scenario(cp: ControlPlane) -> None:
    """Work in every state: succeeded (after a renewal), re-queued after a failure, cancelled,
    dead, and one left leased for the sweeps below to take back."""
    import hashlib

    import requests

    node = cp.worker_node(("cpu", "diagnostic.echo"))
    assert cp.heartbeat(node).status_code == 200
    items = [cp.submit_work("diagnostic.echo", {"n": n}, lease_seconds=10, max_attempts=2).json() for n in range(5)]
    claims = []
    for _ in items[:4]:
        answer = cp.claim(node)
        assert answer.status_code == 200, answer.text
        claims.append(answer.json())
    done, failed, dead, left = claims
    assert cp.lease_call(node, done["work_id"], "renew", {"epoch": done["epoch"]}).status_code == 200
    body = b'{"ok":true}'
    assert requests.put(done["result_upload_url"], data=body, timeout=30).status_code == 200
    finish = {"epoch": done["epoch"], "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    assert cp.lease_call(node, done["work_id"], "complete", finish).status_code == 200
    retry = {"epoch": failed["epoch"], "reason": "flaky", "retryable": True}
    assert cp.lease_call(node, failed["work_id"], "fail", retry).status_code == 200
    final = {"epoch": dead["epoch"], "reason": "bad input", "retryable": False}
    assert cp.lease_call(node, dead["work_id"], "fail", final).status_code == 200
    queued = next(item for item in items if item["work_id"] not in {c["work_id"] for c in claims})
    assert cp.admin("POST", f"/api/v1/admin/work/{queued['work_id']}/cancel").status_code == 200
    assert left["work_id"]  # stays leased: its lease expires in the sweeps of _sweep_scenario


def _gpu_scenario(cp: ControlPlane) -> None:
    """GPU health: a report with a hard fault (latched), an admin's clear, a GPU drained and the
    node drained then undrained: each a gpu.state_changed event."""
    identity = AgentIdentity()
    inventory = {**gpu_inventory(2), "capabilities": ["cuda"]}
    inventory["gpus"] = [
        {**gpu, "uuid": f"GPU-5a7e1060-0000-4000-8000-00000000000{n}"} for n, gpu in enumerate(inventory["gpus"])
    ]
    assert cp.enroll(cp.mint()["token"], identity, accelerator_mode="nvidia", inventory=inventory).status_code == 201
    first, second = (gpu["uuid"] for gpu in inventory["gpus"])
    xid = {"code": "xid_79", "action": "reboot", "xid": 79, "since": "2026-12-02T10:00:00Z"}
    grades = [{"uuid": first, "state": "failed", "reasons": [xid]}, {"uuid": second, "state": "healthy", "reasons": []}]
    boot = "0b0b0b0b-0000-4000-8000-00000000beef"
    assert cp.heartbeat(identity, gpus=2, boot_id=boot, gpu_health={"gpus": grades}).status_code == 200
    node = f"/api/v1/admin/nodes/{identity.node_id}"
    assert cp.admin("POST", f"{node}/gpus/{first}/clear").status_code == 200
    assert cp.admin("POST", f"{node}/drain", json={"gpu_uuid": second}).status_code == 200
    assert cp.admin("POST", f"{node}/drain").status_code == 200
    assert cp.admin("POST", f"{node}/undrain").status_code == 200


def _delete_scenario(cp: ControlPlane) -> None:
    """A node deleted with everything of it: its inventory, GPU claims, GPU state, enrollment and a
    duplicate partner's flag (one node.deleted event); the partner stays."""
    shared = {**gpu_inventory(1), "capabilities": ["cuda"]}
    doomed, partner = AgentIdentity(), AgentIdentity()
    for twin in (doomed, partner):
        assert cp.enroll(cp.mint()["token"], twin, accelerator_mode="nvidia", inventory=shared).status_code == 201
    assert cp.heartbeat(doomed, gpus=1).status_code == 200
    assert cp.admin("POST", f"/api/v1/admin/nodes/{doomed.node_id}/drain").status_code == 200  # GPU state too
    assert cp.admin("POST", f"/api/v1/admin/nodes/{doomed.node_id}/revoke-credential").status_code == 200
    assert cp.admin("DELETE", f"/api/v1/admin/nodes/{doomed.node_id}").status_code == 200


def _replay_and_compare(cp: ControlPlane, endpoint: str) -> None:
    _scenario(cp)
    _work_scenario(cp)
    _gpu_scenario(cp)
    shared = gpu_inventory(1)
    twins = [AgentIdentity(), AgentIdentity()]
    for twin in twins:  # duplicate flags and GPU claims are state too
        assert cp.enroll(cp.mint()["token"], twin, accelerator_mode="nvidia", inventory=shared).status_code == 201
    _delete_scenario(cp)
    live_names = provision.resource_names("modelforge")
    _sweep_scenario(cp, endpoint, live_names)
    _wait_until_shipped(endpoint, live_names)
    logged = [
        json.loads(body) for body in state_log_objects(endpoint, live_names["MODELFORGE_STATE_LOG_BUCKET"]).values()
    ]
    assert {"sweep.mass_stale_held", "sweep.mass_stale_released", "sweep.online_counter_repaired", "node.deleted"} <= {
        event["type"] for event in logged
    }
    sweep_steps = {(e["subject"]["from"], e["subject"]["to"]) for e in logged if e["subject"].get("cause") == "sweep"}
    assert sweep_steps == {("online", "stale"), ("stale", "offline")}
    target = provision.resource_names(f"replay-{secrets.token_hex(4)}")
    provision.provision(endpoint, target)
    env = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}
    command = cli_command(
        "log", "replay", "--endpoint-url", endpoint, "--bucket", live_names["MODELFORGE_STATE_LOG_BUCKET"]
    )
    for logical, env_var in TABLE_ENV.items():
        command += [f"--{logical.replace('_', '-')}-table", target[env_var]]
    done = run_to_exit(command, env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("replayed ")

    for var, drop in (
        ("MODELFORGE_ENROLLMENTS_TABLE", ()),
        # heartbeat fields as of the last transition; the channel's and parking's never (ephemeral)
        ("MODELFORGE_NODES_TABLE", HEARTBEAT_ITEM_NAMES + EPHEMERAL_ITEM_NAMES),
        ("MODELFORGE_INVENTORIES_TABLE", ()),
        ("MODELFORGE_GPU_CLAIMS_TABLE", ()),
        ("MODELFORGE_CONTROL_TABLE", ()),  # the online-node counter (repaired once) and the hold
        ("MODELFORGE_WORK_TABLE", ()),  # every work state, lease renewals included
    ):
        live = [item for item in scan_table(endpoint, live_names[var]) if not _ephemeral(item)]
        rebuilt = scan_table(endpoint, target[var])
        assert live, var
        assert _comparable(rebuilt, drop) == _comparable(live, drop), var

    # replaying again into the now non-empty tables is refused, and changes nothing
    again = run_to_exit(command, env, timeout=120)
    assert again.returncode == 1 and "not empty" in again.stderr
