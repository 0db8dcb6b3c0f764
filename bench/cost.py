#!/usr/bin/env python
"""AWS cost model: what a node, a claim and the liveness sweep cost per month on AWS.

Run from the repository root:

    .venv/bin/python bench/cost.py [--heartbeats 60] [--claims 20] [--gpus 8] [--nodes 1000 10000] [--json]

Every count it prices is measured in this run: it starts the control plane in this process
(``LocalStack``: the deployed Chalice app, its sweep and its state-log handler, on the embedded
moto emulator, all on 127.0.0.1), drives it through the HTTP API with a simulated clock, and
prices each AWS request the emulator handles by DynamoDB's and S3's billing rules
(``modelforge_bench.cost_model``): write request units from the items' sizes before and after each write, the
global secondary index writes included, read request units from the items read. Only the prices
are written down, in one table (bench/aws_prices.json, with the date and source of each).

It prints what each operation uses, the cost per node-month at the control plane's default
heartbeat interval and at 30 s and 60 s for REST and HTTP APIs by service, the push channel
included (connection minutes, keep-alive messages, forced reconnects, ticket mints: counted from
the design by ``modelforge_bench.channel_cost``, priced with the measured handler figures), the
channel's lines apart, the cost per 1,000 claims and per 1,000 dispatched items (submission,
claim, upload, completion, the wake and the parks that follow), and the sweep's cost per month at
two fleet sizes. It exits 1 with a
``bench/cost.py: FAILED: ...`` line when a request fails or a measured profile is not what the
design promises (a steady heartbeat that is not one UpdateItem of one write unit, a heartbeat that
reads, a node item with 8 GPUs and the channel's attributes over 1 KB).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelforge_bench import channel_cost
from modelforge_bench import cost_model as model
from modelforge_bench import support as _support
from modelforge_bench.support import LOOPBACK, BenchFailure

REPO_ROOT = Path(__file__).resolve().parents[1]
CHALICE_CONFIG = REPO_ROOT / "functions" / ".chalice" / "config.json"
REGION = "us-east-1"
#: The intervals priced besides the control plane's default (15 s: what a node without a live channel
#: connection is answered, MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS's default).
OTHER_INTERVALS = (15, 30, 60)
FALLBACK_INTERVAL = 15
#: The goal, per node-month at the default interval, the push channel included (issue 19).
GOAL_USD = 0.20
#: One write unit: the largest node item a steady heartbeat may write.
WRITE_UNIT_BYTES = 1024
#: Untimed heartbeats after each change of interval (the function instance starts cold: the first
#: heartbeat of a node it does not know reads the node; the first one at a new bucket width moves
#: the index entry).
WARMUP_HEARTBEATS = 2
INVENTORY_RESENDS = 3
#: Nodes enrolled to measure a logged liveness transition (a node's first heartbeat).
TRANSITIONS = 3
ECHO = "diagnostic.echo"
LEASE_SECONDS = 3600
REQUEST_TIMEOUT_SECONDS = 30
#: Seeded nodes of the sweep phase heartbeated this long before the sweep runs.
FRESH_SECONDS = 5

MAX_HEARTBEATS = 600
MAX_CLAIMS = 200
MAX_GPUS = 64
MIN_FLEET, MAX_FLEET = 10, 20_000
#: The fleet sizes the sweep's monthly cost is printed for.
FLEET_SIZES = (1000, 10_000)

WRITE_OPERATIONS = ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem")
READ_OPERATIONS = ("GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems")


# --- pricing each AWS request the emulator handles ------------------------------------------------


class Meter:
    """The emulator's observer (``SerializingMiddleware.observe``): while ``active``, prices each app
    request by the billing rules, reading the items before and after each write."""

    def __init__(self, tables: dict[str, model.TableShape]) -> None:
        self.tables = tables
        self.active = False
        self._units = model.RequestUnits()
        self._lock = threading.Lock()

    def take(self) -> model.RequestUnits:
        with self._lock:
            taken, self._units = self._units, model.RequestUnits()
        return taken

    def __call__(self, request: Any) -> bytes:
        if not self.active:
            return bytes(request.forward())
        units = model.RequestUnits(operations={request.operation: 1})
        if request.operation.startswith("S3:"):
            response = request.forward()
            self._s3(request, units)
        elif request.operation in WRITE_OPERATIONS:
            response = self._write(request, units)
        elif request.operation in READ_OPERATIONS:
            response = self._read(request, units)
        else:
            response = request.forward()
        with self._lock:
            self._units.add(units)
        return bytes(response)

    def _shape(self, table: str, key: dict[str, Any]) -> model.TableShape:
        return self.tables.get(table) or model.TableShape(table, tuple(key))

    @staticmethod
    def _s3(request: Any, units: model.RequestUnits) -> None:
        method = request.operation.removeprefix("S3:")
        names_an_object = "/" in request.path.strip("/")
        if method in ("PUT", "POST", "COPY") or (method == "GET" and not names_an_object):  # a GET of a bucket lists it
            units.s3_put_class += 1
        elif method in ("GET", "HEAD"):
            units.s3_get_class += 1  # DELETE is free

    def _item(self, request: Any, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        item: dict[str, Any] | None = request.read(
            "GetItem", {"TableName": table, "Key": key, "ConsistentRead": True}
        ).get("Item")
        return item

    def _write(self, request: Any, units: model.RequestUnits) -> bytes:
        targets = model.write_targets(request.operation, json.loads(request.body or b"{}"), self.tables)
        before = [self._item(request, table, key) for _, table, key, _ in targets]
        response = request.forward()
        after = [self._item(request, table, key) for _, table, key, _ in targets]
        for (action, table, key, transactional), old, new in zip(targets, before, after, strict=True):
            units.add(model.write_request_units(action, self._shape(table, key), old, new, transactional=transactional))
        return bytes(response)

    def _read(self, request: Any, units: model.RequestUnits) -> bytes:
        payload = json.loads(request.body or b"{}")
        operation = request.operation
        counted: list[dict[str, Any]] | None = None
        if operation in ("Query", "Scan") and payload.get("Select") == "COUNT":
            # a count is billed for the items it read: read them the same way, without counting
            again = {key: value for key, value in payload.items() if key != "Select"}
            if "IndexName" in payload:
                again["Select"] = "ALL_PROJECTED_ATTRIBUTES"
            counted = request.read(operation, again).get("Items", [])
        response = request.forward()
        try:
            answer = json.loads(response or b"{}")
        except ValueError:
            answer = {}
        units.rru += read_units_of(operation, payload, answer, counted)
        return bytes(response)


def read_units_of(
    operation: str, payload: dict[str, Any], answer: dict[str, Any], counted: list[dict[str, Any]] | None
) -> float:
    """Read request units of one read request, from what it read."""
    size = model.item_size
    if operation == "GetItem":
        item = answer.get("Item")
        return model.read_request_units(
            [size(item) if item else 0], consistent=bool(payload.get("ConsistentRead")), per_item=True
        )
    if operation in ("Query", "Scan"):
        items = counted if counted is not None else answer.get("Items", [])
        consistent = bool(payload.get("ConsistentRead")) and "IndexName" not in payload
        return model.read_request_units([size(item) for item in items], consistent=consistent)
    if operation == "BatchGetItem":
        requested = payload.get("RequestItems", {})
        return sum(
            model.read_request_units(
                [size(item) for item in items],
                consistent=bool(requested.get(table, {}).get("ConsistentRead")),
                per_item=True,
            )
            for table, items in answer.get("Responses", {}).items()
        )
    # TransactGetItems
    return model.read_request_units(
        [size(entry.get("Item") or {}) for entry in answer.get("Responses", [])],
        consistent=True,
        transactional=True,
        per_item=True,
    )


# --- the app's log, as Lambda would ship it to CloudWatch Logs --------------------------------------


class LogCapture(logging.Handler):
    """Bytes of the app's JSON log lines at its configured level (what CloudWatch Logs ingests),
    and the access log's handler durations. The local stack's own lines are not the app's."""

    def __init__(self) -> None:
        from modelforge_logging.jsonlog import JsonFormatter

        super().__init__(level=logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self._bytes = 0
        self._durations: list[float] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("modelforge.local"):
            return
        line = self.format(record)
        with self._guard:
            self._bytes += len(line.encode("utf-8")) + 1
            if getattr(record, "event", None) == "http_request":
                self._durations.append(float(record.duration_ms))  # type: ignore[attr-defined]

    def take(self) -> tuple[int, list[float]]:
        with self._guard:
            taken = self._bytes, self._durations
            self._bytes, self._durations = 0, []
        return taken


class SimulatedClock:
    """The app's clock (``app._now``): the bench moves it, so heartbeats can be a month apart in
    no time."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


# --- measuring one operation ----------------------------------------------------------------------------


@dataclass
class Measured:
    """What one or more runs of an operation used, in total."""

    label: str
    runs: int = 0
    usage: model.Usage = field(default_factory=model.Usage)
    units: model.RequestUnits = field(default_factory=model.RequestUnits)
    handler_ms: list[float] = field(default_factory=list)

    def add(self, usage: model.Usage, units: model.RequestUnits, handler_ms: list[float]) -> None:
        self.runs += 1
        self.usage = self.usage + usage
        self.units.add(units)
        self.handler_ms.extend(handler_ms)

    @property
    def each(self) -> model.Usage:
        """The average usage of one run."""
        return self.usage.scaled(1 / max(1, self.runs))

    def per_run(self, value: float) -> float:
        return value / max(1, self.runs)

    def as_dict(self) -> dict[str, Any]:
        runs = max(1, self.runs)
        return {
            "runs": self.runs,
            "per_run": self.each.as_dict(),
            "operations_per_run": {name: count / runs for name, count in sorted(self.units.operations.items())},
            "table_wru_per_run": self.units.table_wru / runs,
            "index_wru_per_run": self.units.index_wru / runs,
            "rru_per_run": self.units.rru / runs,
            "handler_ms_median": _median(self.handler_ms),
        }


def _median(values: list[float]) -> float | None:
    return _support.percentile(values, 50) if values else None


def response_bytes(response: Any) -> int:
    """What an HTTP answer puts on the wire: status line, headers and body."""
    headers = sum(len(name) + len(value) + 4 for name, value in response.headers.items())
    return len(f"HTTP/1.1 {response.status_code} {response.reason}\r\n") + headers + 2 + len(response.content)


class Rig:
    """The local stack with its meter, log capture and simulated clock."""

    def __init__(self, stack: Any, meter: Meter, logs: LogCapture, clock: SimulatedClock) -> None:
        self.stack, self.meter, self.logs, self.clock = stack, meter, logs, clock

    def configure(self, interval: int, stale_after: int) -> Any:
        """Run the control plane with this heartbeat interval and stale threshold from now on."""
        from chalicelib import instance

        os.environ["MODELFORGE_HEARTBEAT_INTERVAL_SECONDS"] = str(interval)
        os.environ["MODELFORGE_NODE_STALE_AFTER_SECONDS"] = str(stale_after)
        instance.reset()
        return instance.settings()

    def measure(self, into: Measured, call: Callable[[], Any], *, api_requests: int, invocation: bool = False) -> Any:
        """Run ``call`` once and add what it used to ``into``: ``api_requests`` API requests (one
        function invocation each, timed by the access log), or, with ``invocation``, one function
        invocation timed around ``call``; then the state-log function ships the events it wrote."""
        self.stack.drain_state_log()  # nothing left over from before
        self.logs.take()
        self.meter.take()
        self.meter.active = True
        try:
            began = time.perf_counter()
            result = call()
            called_ms = (time.perf_counter() - began) * 1000
            began = time.perf_counter()
            shipped = self.stack.drain_state_log()
            drain_ms = (time.perf_counter() - began) * 1000
        finally:
            self.meter.active = False
        units = self.meter.take()
        log_bytes, durations = self.logs.take()
        if len(durations) != api_requests:
            raise BenchFailure(f"{into.label}: {len(durations)} access-log records for {api_requests} API requests")
        handler_ms = durations + ([called_ms] if invocation else [])
        invocations = len(handler_ms) + (1 if shipped else 0)
        # the state-log function's time is bounded by the drain's (which also reads the stream)
        billed = sum(math.ceil(ms) for ms in handler_ms) + (math.ceil(drain_ms) if shipped else 0)
        usage = model.Usage(
            api_requests=api_requests,
            lambda_invocations=invocations,
            lambda_billed_ms=billed,
            dynamodb_wru=units.wru,
            dynamodb_rru=units.rru,
            stream_reads_by_lambda=1 if shipped else 0,
            s3_put_class=units.s3_put_class,
            s3_get_class=units.s3_get_class,
            log_bytes=log_bytes + model.LAMBDA_PLATFORM_BYTES * invocations,
            scheduled_events=1 if invocation else 0,
            transfer_out_bytes=response_bytes(result) if api_requests else 0,
        )
        into.add(usage, units, handler_ms)
        return result


# --- nodes ------------------------------------------------------------------------------------------

#: A healthy node's health as this release's agent reports it, with a healthy runtime worker.
AGENT_HEALTH = {
    "status": "ok",
    "worker": {"status": "ok", "detail": "worker 1.3.0: diagnostic.echo, diagnostic.sleep, ocr", "unavailable": []},
}


@dataclass
class Node:
    identity: Any
    client: Any
    gpus: int
    #: what this release's agent draws per process and sends (feature ``agent_instance``)
    instance_id: str = field(default_factory=lambda: secrets.token_hex(16))

    def heartbeat(self) -> Any:
        # as this release's agent reports a node: its slots too (one per GPU, all busy: the largest
        # item) and its instance id (the node keeps a fingerprint of it)
        slots = {"total": max(1, self.gpus), "busy": max(1, self.gpus), "schedulable": max(1, self.gpus)}
        response = self.client.heartbeat(
            self.identity, gpus=self.gpus, slots=slots, health=AGENT_HEALTH, agent_instance_id=self.instance_id
        )
        if response.status_code != 200 or response.json().get("status") != "online":
            raise BenchFailure(f"a heartbeat answered {response.status_code}: {_support.brief(response.text)}")
        return response


def new_client(base_url: str) -> Any:
    import requests
    from modelforge_cli.api_client import ControlPlane

    session = requests.Session()
    session.trust_env = False  # no proxies, no netrc: 127.0.0.1 only
    return ControlPlane(
        base_url, os.environ["MODELFORGE_ADMIN_TOKEN"], session=session, timeout=REQUEST_TIMEOUT_SECONDS
    )


def enroll(base_url: str, gpus: int, inventory: dict[str, Any], name: str) -> Node:
    """Mint a token and enroll a node (its first heartbeat is the caller's)."""
    from modelforge_cli.api_client import AgentIdentity

    client = new_client(base_url)
    minted = client.admin(
        "POST", "/api/v1/admin/node-enrollments", json={"display_name": name, "expires_in_seconds": 900}
    )
    if minted.status_code != 201:
        raise BenchFailure(f"minting an enrollment token answered {minted.status_code}: {_support.brief(minted.text)}")
    identity = AgentIdentity()
    response = client.enroll(
        minted.json()["token"],
        identity,
        hostname=name,
        accelerator_mode="nvidia" if gpus else "cpu",
        inventory=inventory,
    )
    if response.status_code != 201:
        raise BenchFailure(f"enrolling {name} answered {response.status_code}: {_support.brief(response.text)}")
    return Node(identity, client, gpus)


def resend_inventory(node: Node, inventory: dict[str, Any]) -> Any:
    response = node.client.request(
        "POST",
        "/api/v1/agent/inventory",
        headers=node.identity.headers(),
        json={"protocol_version": 1, "inventory": inventory},
    )
    if response.status_code != 200:
        raise BenchFailure(f"an inventory re-send answered {response.status_code}: {_support.brief(response.text)}")
    return response


# --- the phases -------------------------------------------------------------------------------------


@dataclass
class HeartbeatPhase:
    interval: int
    stale_after: int
    measured: Measured


def heartbeat_phase(rig: Rig, node: Node, interval: int, stale_after: int, count: int) -> HeartbeatPhase:
    """``count`` steady heartbeats ``interval`` apart on the simulated clock, each measured."""
    rig.configure(interval, stale_after)
    for _ in range(WARMUP_HEARTBEATS):
        rig.clock.advance(interval)
        node.heartbeat()
    measured = Measured(f"heartbeat every {interval} s")
    for _ in range(count):
        rig.clock.advance(interval)
        rig.measure(measured, node.heartbeat, api_requests=1)
    return HeartbeatPhase(interval, stale_after, measured)


@dataclass
class WorkPhase:
    submission: Measured
    claim: Measured
    upload: Measured
    renewal: Measured
    completion: Measured
    #: a claim that finds nothing (204): what a woken node that lost the item pays
    empty_claim: Measured = field(default_factory=lambda: Measured("empty claim"))

    @property
    def claim_path(self) -> model.Usage:
        """One claim, its result upload and its completion."""
        return self.claim.each + self.upload.each + self.completion.each


def work_phase(rig: Rig, node: Node, count: int) -> WorkPhase:
    """``count`` echo items submitted, then each claimed, uploaded, renewed and completed."""
    phase = WorkPhase(
        *(Measured(label) for label in ("submission", "claim", "result upload", "lease renewal", "completion"))
    )
    for index in range(count):
        submit = functools.partial(
            node.client.submit_work, ECHO, {"bench": "cost", "index": index}, lease_seconds=LEASE_SECONDS
        )
        submitted = rig.measure(phase.submission, submit, api_requests=1)
        if submitted.status_code != 201:
            raise BenchFailure(f"submitting work answered {submitted.status_code}: {_support.brief(submitted.text)}")
    node.heartbeat()
    for _ in range(count):
        _claim_and_finish(rig, phase, node)
    empty = rig.measure(phase.empty_claim, lambda: node.client.claim(node.identity), api_requests=1)
    if empty.status_code != 204:
        raise BenchFailure(f"a claim of an empty queue answered {empty.status_code}: {_support.brief(empty.text)}")
    return phase


def _claim_and_finish(rig: Rig, phase: WorkPhase, node: Node) -> None:
    """One item: claimed, its result uploaded, its lease renewed, completed; each measured."""
    import hashlib

    import requests

    claimed = rig.measure(phase.claim, lambda: node.client.claim(node.identity), api_requests=1)
    if claimed.status_code != 200:
        raise BenchFailure(f"a claim answered {claimed.status_code}: {_support.brief(claimed.text)}")
    answer = claimed.json()
    body = json.dumps({"echo": answer["work_id"]}).encode()
    uploaded = rig.measure(
        phase.upload,
        lambda: requests.put(
            answer["result_upload_url"], data=body, timeout=REQUEST_TIMEOUT_SECONDS, allow_redirects=False
        ),
        api_requests=0,
    )
    if uploaded.status_code != 200:
        raise BenchFailure(f"a result upload answered {uploaded.status_code}")
    finished = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    for action, measured, extra in (("renew", phase.renewal, {}), ("complete", phase.completion, finished)):
        call = functools.partial(
            node.client.lease_call, node.identity, answer["work_id"], action, {"epoch": answer["epoch"], **extra}
        )
        done = rig.measure(measured, call, api_requests=1)
        if done.status_code != 200:
            raise BenchFailure(f"{action} answered {done.status_code}: {_support.brief(done.text)}")


@dataclass
class SweepRun:
    nodes: int
    measured: Measured
    seed_seconds: float


def sweep_phase(rig: Rig, sizes: list[int], settings: Any, keep_fresh: list[Node]) -> list[SweepRun]:
    """One scheduled sweep over a healthy fleet of each size (nodes seeded into the table)."""
    import sweep as sweep_bench
    from modelforge_local_stack.scheduler import scheduled_event

    client = sweep_bench.dynamodb_client(rig.stack.aws_endpoint_url)
    table = rig.stack.names["MODELFORGE_NODES_TABLE"]
    runs: list[SweepRun] = []
    seeded = 0
    try:
        for size in sizes:
            began = time.perf_counter()
            beat = rig.clock.now - FRESH_SECONDS
            items = [
                sweep_bench.node_item(sweep_bench.new_node_id(), beat, settings.sweep_bucket_seconds, beat - 3600)
                for _ in range(size - seeded)
            ]
            sweep_bench.put_nodes(client, table, items)
            seeded = size
            seed_seconds = time.perf_counter() - began
            for node in keep_fresh:
                node.heartbeat()
            measured = Measured(f"sweep run, {size} nodes")
            report = rig.measure(
                measured,
                lambda: rig.stack.app_module.liveness_sweep(scheduled_event(), None),
                api_requests=0,
                invocation=True,
            )
            if report.get("transitioned") or report.get("held"):
                raise BenchFailure(f"the sweep over {size} fresh nodes moved or held nodes: {report}")
            runs.append(SweepRun(size, measured, seed_seconds))
            _progress(f"sweep over {size} nodes measured (seeded in {seed_seconds:.1f} s)")
    finally:
        client.close()
    return runs


# --- the stack's deployment figures ---------------------------------------------------------------------


def lambda_memory_mb() -> int:
    """The functions' memory size as the deployed stage sets it (functions/.chalice/config.json)."""
    stage = json.loads(CHALICE_CONFIG.read_text())["stages"]["dev"]
    memory = stage.get("lambda_memory_size")
    if not isinstance(memory, int):
        raise BenchFailure(f"{CHALICE_CONFIG} sets no lambda_memory_size for the dev stage")
    return memory


def sweep_rate_seconds(app: Any) -> int:
    """The liveness sweep's schedule, from the Chalice app (``@app.schedule(Rate(...))``)."""
    from chalice import Rate

    for source in app.event_sources:
        if getattr(source, "name", None) == "liveness_sweep":
            rate = source.schedule_expression
            if isinstance(rate, Rate):
                return int(rate.value) * {"MINUTES": 60, "HOURS": 3600, "DAYS": 86400}[rate.unit]
            raise BenchFailure(f"the sweep's schedule {rate!r} is not a rate; its runs per month are not modelled")
    raise BenchFailure("the app has no liveness_sweep schedule")


def inventory_refresh_seconds() -> float:
    """How often the agent re-sends an unchanged inventory by default."""
    import tempfile

    from modelforge_node_agent.config import load_config
    from modelforge_protocol.credentials import new_enrollment_token

    with tempfile.TemporaryDirectory() as state:
        config = load_config(
            {
                "MODELFORGE_AGENT_CONTROL_PLANE_URL": "http://127.0.0.1:8000",
                # never used: the agent's settings need a token or an identity to be valid
                "MODELFORGE_AGENT_ENROLLMENT_TOKEN": new_enrollment_token("enr_" + "0" * 32),
                "MODELFORGE_AGENT_STATE_VOLUME": state,
            }
        )
    return float(config.inventory_refresh_seconds)


def table_shapes(names: dict[str, str]) -> dict[str, model.TableShape]:
    """The shape of each table of the stack, from infra/resources.json (the one catalogue)."""
    from modelforge_local_stack import provision

    shapes = {}
    for logical_id, resource in provision.load_resources().items():
        if resource["Type"] == "AWS::DynamoDB::Table":
            name = names[provision.RESOURCE_ENV[logical_id]]
            shapes[name] = model.table_shape(name, resource["Properties"])
    return shapes


# --- the benchmark ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--heartbeats", type=int, default=60, help=f"heartbeats measured at each interval (10..{MAX_HEARTBEATS})"
    )
    parser.add_argument(
        "--claims", type=int, default=20, help=f"work items submitted, claimed and completed (1..{MAX_CLAIMS})"
    )
    parser.add_argument(
        "--gpus", type=int, default=8, help=f"GPUs of the measured node, in its heartbeat telemetry (0..{MAX_GPUS})"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        nargs=2,
        default=list(FLEET_SIZES),
        metavar=("SMALL", "LARGE"),
        help=f"two fleet sizes the sweep is measured at ({MIN_FLEET}..{MAX_FLEET}, SMALL < LARGE); its cost at "
        f"{FLEET_SIZES[0]:,} and {FLEET_SIZES[1]:,} nodes is the straight line through them",
    )
    parser.add_argument(
        "--prices", type=Path, default=model.PRICES_FILE, help="the price table (default: bench/aws_prices.json)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of the tables")
    args = parser.parse_args(argv)
    if not 10 <= args.heartbeats <= MAX_HEARTBEATS:
        parser.error(f"--heartbeats must be from 10 to {MAX_HEARTBEATS}")
    if not 1 <= args.claims <= MAX_CLAIMS:
        parser.error(f"--claims must be from 1 to {MAX_CLAIMS}")
    if not 0 <= args.gpus <= MAX_GPUS:
        parser.error(f"--gpus must be from 0 to {MAX_GPUS}")
    small, large = args.nodes
    if not (MIN_FLEET <= small < large <= MAX_FLEET):
        parser.error(f"--nodes takes two sizes from {MIN_FLEET} to {MAX_FLEET}, the first smaller")
    return args


_quiet = False


def _progress(line: str) -> None:
    print(line, file=sys.stderr if _quiet else sys.stdout, flush=True)


def _quiet_app_log(capture: LogCapture) -> None:
    """The app's lines go to the capture, not stderr (its warnings and errors still show)."""
    for handler in logging.getLogger("modelforge").handlers:
        if getattr(handler, "_modelforge", False):
            handler.setLevel(logging.WARNING)
    logging.getLogger("modelforge").addHandler(capture)


def run(args: argparse.Namespace) -> int:
    global _quiet
    _quiet = args.json
    prices = model.Prices.load(args.prices)
    # the deployed log level (functions/.chalice/config.json), the documented thresholds, the default interval
    _support.prepare_stack_environment("INFO", keep_thresholds=False)
    os.environ.pop("MODELFORGE_HEARTBEAT_INTERVAL_SECONDS", None)
    from modelforge_cli.api_client import cpu_inventory, gpu_inventory
    from modelforge_local_stack.local_stack import LocalOptions, LocalStack

    wall_started = time.perf_counter()
    memory_mb = lambda_memory_mb()
    refresh_seconds = inventory_refresh_seconds()
    stack = LocalStack(
        LocalOptions(
            host=LOOPBACK,
            port=0,
            sweep_interval_seconds=3600,  # the bench runs the sweep itself
            stream_interval_seconds=3600,  # and ships the state log itself, inside each measurement
            resource_prefix=f"bench-cost-{secrets.token_hex(3)}",
        )
    )
    capture = LogCapture()
    try:
        stack.start()
        if stack.emulator is None or stack.emulator.middleware is None:
            raise BenchFailure("the local stack has no embedded emulator to measure")
        _support.require_loopback(stack.api_url, "the API server")
        _support.require_loopback(stack.aws_endpoint_url, "the AWS emulator")
        from chalicelib import instance

        _quiet_app_log(capture)
        meter = Meter(table_shapes(stack.names))
        stack.emulator.middleware.observe(meter)
        clock = SimulatedClock(time.time())
        stack.app_module._now = clock  # type: ignore[union-attr]
        rig = Rig(stack, meter, capture, clock)
        defaults = instance.settings()
        default_interval, default_stale = defaults.heartbeat_interval_seconds, defaults.stale_after_seconds
        stale_ratio = default_stale / default_interval
        intervals = sorted({default_interval, *OTHER_INTERVALS})
        sweep_seconds = sweep_rate_seconds(stack.app_module.app)  # type: ignore[union-attr]
        _progress(f"local stack: API {stack.api_url}, emulator {stack.aws_endpoint_url}")

        inventory = gpu_inventory(args.gpus) if args.gpus else cpu_inventory()
        node = enroll(stack.api_url, args.gpus, inventory, "cost-bench-node")
        node.heartbeat()  # pending -> online (measured below on a second node, once the function is warm)
        heartbeats = []
        for interval in intervals:
            stale = max(default_stale, round(stale_ratio * interval))
            heartbeats.append(heartbeat_phase(rig, node, interval, stale, args.heartbeats))
            _progress(f"{args.heartbeats} heartbeats every {interval} s measured (stale after {stale} s)")
        node_item = _raw_node_item(stack, node.identity.node_id)

        rig.configure(default_interval, default_stale)
        transition = Measured("liveness transition")
        newcomers = []
        for index in range(TRANSITIONS):
            newcomer = enroll(
                stack.api_url,
                args.gpus,
                gpu_inventory(args.gpus) if args.gpus else cpu_inventory(),
                f"cost-bench-new-{index}",
            )
            rig.measure(
                transition, newcomer.heartbeat, api_requests=1
            )  # its first heartbeat: pending -> online, logged
            newcomers.append(newcomer)
        resends = Measured("inventory re-send")
        for _ in range(INVENTORY_RESENDS):
            clock.advance(refresh_seconds)
            node.heartbeat()
            rig.measure(resends, lambda: resend_inventory(node, inventory), api_requests=1)

        worker = enroll(stack.api_url, 0, {**cpu_inventory(), "capabilities": ["cpu", ECHO]}, "cost-bench-worker")
        clock.advance(default_interval)
        worker.heartbeat()
        node.heartbeat()
        work = work_phase(rig, worker, args.claims)
        _progress(f"{args.claims} work items submitted, claimed, uploaded, renewed and completed")

        sweeps = sweep_phase(rig, list(args.nodes), instance.settings(), [node, worker, *newcomers])
    finally:
        logging.getLogger("modelforge").removeHandler(capture)
        stack.stop()

    report = build_report(
        args,
        prices,
        memory_mb,
        refresh_seconds,
        default_interval,
        sweep_seconds,
        transition,
        heartbeats,
        resends,
        work,
        sweeps,
        node_item,
    )
    report["wall_seconds"] = round(time.perf_counter() - wall_started, 1)
    problems = check(report)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print_report(report)
    for problem in problems:
        print(f"bench/cost.py: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _raw_node_item(stack: Any, node_id: str) -> dict[str, Any]:
    client = _support.emulator_dynamodb(stack.aws_endpoint_url, REGION, REQUEST_TIMEOUT_SECONDS)
    try:
        item = client.get_item(
            TableName=stack.names["MODELFORGE_NODES_TABLE"], Key={"node_id": {"S": node_id}}, ConsistentRead=True
        )
    finally:
        client.close()
    if "Item" not in item:
        raise BenchFailure(f"node {node_id} is missing from the nodes table")
    found: dict[str, Any] = item["Item"]
    return found


# --- the report -----------------------------------------------------------------------------------------


def _priced(usage: model.Usage, prices: model.Prices, deployment: model.Deployment) -> dict[str, Any]:
    lines = model.cost(usage, prices, deployment)
    largest, share = model.dominant(lines)
    return {"lines": lines, "total": model.total(lines), "largest": largest, "largest_share": share}


def build_report(
    args: argparse.Namespace,
    prices: model.Prices,
    memory_mb: int,
    refresh_seconds: float,
    default_interval: int,
    sweep_seconds: int,
    transition: Measured,
    heartbeats: list[HeartbeatPhase],
    resends: Measured,
    work: WorkPhase,
    sweeps: list[SweepRun],
    node_item: dict[str, Any],
) -> dict[str, Any]:
    deployments = {
        api: model.Deployment(api=api, architecture="x86_64", memory_mb=memory_mb) for api in ("rest", "http")
    }
    default_phase = next(phase for phase in heartbeats if phase.interval == default_interval)
    sizes = channel_cost.node_item_sizes(node_item)
    channel_lines = channel_cost.node_month(default_phase.measured.each, sizes)
    channel_usage = channel_cost.total(channel_lines)
    node_month: dict[str, Any] = {}
    for phase in heartbeats:
        without = model.node_month(phase.measured.each, phase.interval, resends.each, refresh_seconds)
        usage = without + channel_usage
        node_month[str(phase.interval)] = {
            "stale_after_seconds": phase.stale_after,
            "heartbeats_per_month": model.SECONDS_PER_MONTH / phase.interval,
            "usage": usage.as_dict(),
            "http_total_without_channel": model.total(model.cost(without, prices, deployments["http"])),
            **{api: _priced(usage, prices, deployment) for api, deployment in deployments.items()},
            "arm64_http_total": model.total(model.cost(usage, prices, model.Deployment("http", "arm64", memory_mb))),
        }
    item_lines = channel_cost.per_item(work.empty_claim.each, sizes)
    dispatched = work.submission.each + work.claim_path + channel_cost.total(item_lines)
    per_thousand = {
        label: {api: _priced(usage.scaled(1000), prices, deployment) for api, deployment in deployments.items()}
        for label, usage in (
            ("dispatched_items", dispatched),
            ("claims", work.claim_path),
            ("submissions", work.submission.each),
            ("renewals", work.renewal.each),
            ("liveness_transitions", transition.each),
        )
    }
    runs_per_month = model.SECONDS_PER_MONTH / sweep_seconds
    sweep_points = [(run.nodes, run.measured.each) for run in sweeps]
    sweep_month = {}
    for fleet in FLEET_SIZES:
        per_run = model.Usage(
            **{
                name: model.linear_fit([(size, getattr(usage, name)) for size, usage in sweep_points], fleet)
                for name in model.Usage.__dataclass_fields__
            }
        )
        # the emulator's times are noisy: never below the fastest run measured
        per_run.lambda_billed_ms = max(
            per_run.lambda_billed_ms, min(usage.lambda_billed_ms for _, usage in sweep_points)
        )
        sweep_month[str(fleet)] = {
            "per_run": per_run.as_dict(),
            **{
                api: _priced(per_run.scaled(runs_per_month), prices, deployment)
                for api, deployment in deployments.items()
            },
        }
    measured = {
        "liveness_transition": transition.as_dict(),
        **{
            f"heartbeat_{phase.interval}s": {"stale_after_seconds": phase.stale_after, **phase.measured.as_dict()}
            for phase in heartbeats
        },
        "inventory_resend": resends.as_dict(),
        **{
            f"work_{name}": getattr(work, name).as_dict()
            for name in ("submission", "claim", "upload", "renewal", "completion", "empty_claim")
        },
        **{
            f"sweep_run_{run.nodes}_nodes": {"seed_seconds": round(run.seed_seconds, 2), **run.measured.as_dict()}
            for run in sweeps
        },
    }
    default = node_month[str(default_interval)]
    return {
        "prices": {
            "file": prices.path,
            "region": prices.region,
            "currency": prices.currency,
            "entries": {key: vars(price) for key, price in prices.entries.items()},
        },
        "deployment": {
            "lambda_memory_mb": memory_mb,
            "lambda_architecture": "x86_64",
            "sweep_schedule": "EventBridge rule",
        },
        "inputs": {
            "gpus": args.gpus,
            "heartbeats_per_interval": args.heartbeats,
            "claims": args.claims,
            "sweep_measured_at_nodes": list(args.nodes),
            "default_heartbeat_interval_seconds": default_interval,
            "inventory_refresh_seconds": refresh_seconds,
            "sweep_every_seconds": sweep_seconds,
            "sweep_runs_per_month": runs_per_month,
            "hours_per_month": model.HOURS_PER_MONTH,
            "node_item_bytes": model.item_size(node_item),
            "node_item_write_units": model.write_units(model.item_size(node_item)),
            "lambda_platform_log_bytes_per_invocation": model.LAMBDA_PLATFORM_BYTES,
        },
        "measured": measured,
        "node_month": node_month,
        "goal": {
            "usd_per_node_month": GOAL_USD,
            "interval_seconds": default_interval,
            **{
                api: {
                    "total": default[api]["total"],
                    "met": default[api]["total"] <= GOAL_USD,
                    "largest": default[api]["largest"],
                }
                for api in deployments
            },
        },
        "per_thousand": per_thousand,
        "sweep_month": sweep_month,
        "channel": {
            "node_item_bytes": sizes.as_dict(),
            "connections_per_month": channel_cost.connections_per_month(),
            "keepalive_seconds": channel_cost.KEEPALIVE_SECONDS,
            "wake_per_item": channel_cost.WAKE_PER_ITEM,
            "node_month": {
                name: {"usage": usage.as_dict(), "http": _priced(usage, prices, deployments["http"])}
                for name, usage in channel_lines.items()
            },
            "per_thousand_items": {
                name: {
                    "usage": usage.scaled(1000).as_dict(),
                    "http": _priced(usage.scaled(1000), prices, deployments["http"]),
                }
                for name, usage in item_lines.items()
            },
        },
    }


def check(report: dict[str, Any]) -> list[str]:
    """What the design promises of the measured profiles."""
    problems = []
    sizes = report["channel"]["node_item_bytes"]
    if sizes["connected_parked"] > WRITE_UNIT_BYTES:
        problems.append(
            f"the node item with the channel's attributes is {sizes['connected_parked']} bytes: a heartbeat is"
            f" {sizes['heartbeat_write_units_connected_parked']} write units, not 1"
        )
    for state in ("with_ticket", "fallback_with_ticket"):
        if sizes[state] > WRITE_UNIT_BYTES:
            problems.append(f"the node item {state.replace('_', ' ')} is {sizes[state]} bytes: over one write unit")
    for key, figures in report["measured"].items():
        if key.startswith("heartbeat_"):
            if figures["operations_per_run"] != {"UpdateItem": 1.0}:
                problems.append(f"{key}: a steady heartbeat made {figures['operations_per_run']}, not one UpdateItem")
            if figures["table_wru_per_run"] != 1 or figures["index_wru_per_run"] != 0:
                problems.append(
                    f"{key}: a steady heartbeat wrote {figures['table_wru_per_run']} table and"
                    f" {figures['index_wru_per_run']} index write units, not 1 and 0"
                )
            if figures["rru_per_run"] != 0:
                problems.append(f"{key}: a steady heartbeat read ({figures['rru_per_run']} read units)")
            if figures["per_run"]["s3_put_class"] or figures["per_run"]["s3_get_class"]:
                problems.append(f"{key}: a steady heartbeat made S3 requests")
    return problems


def _usd(value: float) -> str:
    return f"{value:.4f}" if value < 10 else f"{value:,.2f}"


def print_report(report: dict[str, Any]) -> None:
    inputs, prices = report["inputs"], report["prices"]
    read_on = sorted({entry["read_on"] for entry in prices["entries"].values()})
    print()
    print(
        f"ModelForge AWS cost model: on-demand {prices['region']} list prices from {Path(prices['file']).name}"
        f" (read {', '.join(read_on)}); Lambda {report['deployment']['lambda_architecture']} at"
        f" {report['deployment']['lambda_memory_mb']} MB; a month is {inputs['hours_per_month']} h"
    )
    print("Counts measured in this run against the embedded emulator, running the deployed handlers.")
    _print_measured(report)
    _print_node_month(report)
    _print_channel(report)
    _print_per_thousand(report)
    _print_sweep(report)
    print()
    print(f"Prices ({prices['file']}):")
    for key, price in prices["entries"].items():
        print(
            f"  {key:<42} ${price['usd']:<13g} per {price['quantity']:>9,.0f} {price['unit']:<26} {price['source']}"
            f"  (read {price['read_on']})"
        )
    print(f"\ntotal wall time {report['wall_seconds']:.1f} s")


def _print_measured(report: dict[str, Any]) -> None:
    inputs = report["inputs"]
    print()
    print(f"[1] What one operation uses (averages; node with {inputs['gpus']} GPUs)")
    print(
        f"    {'operation':<34} {'runs':>4} {'API':>4} {'Lambda':>6} {'billed':>7} {'WRU':>5} {'=table':>6}"
        f" {'+index':>6}"
        f" {'RRU':>5} {'S3 put':>6} {'S3 get':>6} {'log B':>6} {'out B':>6}  DynamoDB and S3 requests"
    )
    for key, figures in report["measured"].items():
        each = figures["per_run"]
        ops = _support.format_ops(figures["operations_per_run"])
        label = key.replace("_", " ")
        print(
            f"    {label:<34} {figures['runs']:>4} {each['api_requests']:>4.2g} {each['lambda_invocations']:>6.3g}"
            f" {each['lambda_billed_ms']:>5.1f}ms {each['dynamodb_wru']:>5.2f} {figures['table_wru_per_run']:>6.2f}"
            f" {figures['index_wru_per_run']:>6.2f} {each['dynamodb_rru']:>5.2f} {each['s3_put_class']:>6.2f}"
            f" {each['s3_get_class']:>6.2f} {each['log_bytes']:>6.0f} {each['transfer_out_bytes']:>6.0f}  {ops}"
        )
    print(
        f"    node item after a heartbeat: {inputs['node_item_bytes']} bytes ="
        f" {inputs['node_item_write_units']} write unit(s);"
        f" each Lambda invocation also logs {inputs['lambda_platform_log_bytes_per_invocation']} bytes"
        " of START/END/REPORT lines"
    )
    print(
        "    API: API Gateway requests; Lambda: invocations (API function, plus the state-log function when events were"
        " shipped);\n    billed: Lambda ms rounded up per invocation"
        " (measured here, in one Python process with the emulator);"
        " WRU/RRU: DynamoDB\n    request units (index: global secondary index writes);"
        " log B: CloudWatch Logs bytes; out B: bytes"
        " of the HTTP answer"
    )


def _columns(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{interval} s {api.upper()}", figures[api])
        for interval, figures in report["node_month"].items()
        for api in ("rest", "http")
    ]


def _print_node_month(report: dict[str, Any]) -> None:
    inputs = report["inputs"]
    columns = _columns(report)
    print()
    print(
        "[2] Cost per node-month, US$: a heartbeat every interval"
        f" (stale threshold {_stale_note(report)}) and the inventory"
        f" re-sent every {inputs['inventory_refresh_seconds']:.0f} s"
    )
    print("    " + f"{'':<18}" + "".join(f"{name:>12}" for name, _ in columns))
    for line in model.LINES:
        print("    " + f"{line:<18}" + "".join(f"{_usd(figures['lines'][line]):>12}" for _, figures in columns))
    print("    " + f"{'total':<18}" + "".join(f"{_usd(figures['total']):>12}" for _, figures in columns))
    goal = report["goal"]
    for api in ("http", "rest"):
        verdict = goal[api]
        figures = report["node_month"][str(goal["interval_seconds"])][api]
        if verdict["met"]:
            text = "met"
        else:
            text = f"NOT met: the largest line is {figures['largest']} ({figures['largest_share']:.0%} of it)"
        print(
            f"    goal at most ${goal['usd_per_node_month']:.2f} per node-month"
            f" at the default {goal['interval_seconds']} s interval,"
            f" {api.upper()} API: ${verdict['total']:.4f}, {text}"
        )
    default = report["node_month"][str(goal["interval_seconds"])]
    fleet, sweep = max(report["sweep_month"].items(), key=lambda entry: int(entry[0]))
    share = sweep["http"]["total"] / int(fleet)
    print(
        f"    with the sweep's share at {int(fleet):,} nodes ([4]): HTTP API ${goal['http']['total'] + share:.4f}"
        f" (${share:.4f} a node)"
    )
    print(
        f"    (Lambda on arm64 instead: HTTP API ${default['arm64_http_total']:.4f} at the default interval;"
        f" without the push channel: HTTP API ${default['http_total_without_channel']:.4f})"
    )
    fallback = report["node_month"].get(str(FALLBACK_INTERVAL))
    if fallback is not None:
        print(
            f"    a node in fallback (no live channel connection, answered {FALLBACK_INTERVAL} s, no channel lines):"
            f" HTTP API ${fallback['http_total_without_channel']:.4f}"
        )


def _print_channel(report: dict[str, Any]) -> None:
    channel = report["channel"]
    sizes = channel["node_item_bytes"]
    print()
    print(
        "[2b] The push channel in [2], per node-month, HTTP API, US$ (counted from the design, not measured:"
        " a connection all month,"
    )
    print(
        f"    a ping every {channel['keepalive_seconds']} s, {channel['connections_per_month']:.1f} forced"
        " reconnects and ticket mints a month; each handler invocation costs what a heartbeat's did)"
    )
    names = list(channel["node_month"])
    print("    " + f"{'':<18}" + "".join(f"{name:>20}" for name in names))
    for line in model.LINES:
        values = [channel["node_month"][name]["http"]["lines"][line] for name in names]
        if any(values):
            print("    " + f"{line:<18}" + "".join(f"{_usd(value):>20}" for value in values))
    print("    " + f"{'total':<18}" + "".join(f"{_usd(channel['node_month'][n]['http']['total']):>20}" for n in names))
    print(
        f"    node item: {sizes['measured']} bytes as measured, {sizes['connected']} connected,"
        f" {sizes['connected_parked']} connected and parked ({sizes['heartbeat_write_units_connected_parked']}"
        f" write unit(s) a heartbeat), {sizes['with_ticket']} while a minted ticket is unused"
    )


def _stale_note(report: dict[str, Any]) -> str:
    return ", ".join(
        f"{figures['stale_after_seconds']} s at {interval} s" for interval, figures in report["node_month"].items()
    )


def _print_per_thousand(report: dict[str, Any]) -> None:
    per_thousand = report["per_thousand"]
    items = per_thousand["dispatched_items"]
    print()
    print(
        "[3] Cost per 1,000 dispatched items, US$: submission, claim, result upload and completion (measured),"
        f" the wake of {report['channel']['wake_per_item']}"
    )
    print("    parked nodes, their parks and the loser's empty claim (counted from the design)")
    print("    " + f"{'':<18}" + "".join(f"{'REST API':>12}{'HTTP API':>12}"))
    for line in model.LINES:
        print(
            "    " + f"{line:<18}" + f"{_usd(items['rest']['lines'][line]):>12}{_usd(items['http']['lines'][line]):>12}"
        )
    print("    " + f"{'total':<18}" + f"{_usd(items['rest']['total']):>12}{_usd(items['http']['total']):>12}")
    channel = report["channel"]["per_thousand_items"]
    print(
        "    of which the channel (HTTP API): "
        + ", ".join(f"{name} ${_usd(figures['http']['total'])}" for name, figures in channel.items())
    )
    print()
    print(
        "[3b] Cost per 1,000 claims, US$ (each: the claim, its result upload to S3 and its completion, with the events"
    )
    print("    they write shipped to the state log)")
    claims = per_thousand["claims"]
    print("    " + f"{'':<18}" + "".join(f"{'REST API':>12}{'HTTP API':>12}"))
    for line in model.LINES:
        print(
            "    "
            + f"{line:<18}"
            + f"{_usd(claims['rest']['lines'][line]):>12}{_usd(claims['http']['lines'][line]):>12}"
        )
    print("    " + f"{'total':<18}" + f"{_usd(claims['rest']['total']):>12}{_usd(claims['http']['total']):>12}")
    print(f"    largest line: {claims['http']['largest']} ({claims['http']['largest_share']:.0%} with the HTTP API)")
    for label in ("submissions", "renewals", "liveness_transitions"):
        figures = per_thousand[label]
        print(
            f"    per 1,000 {label.replace('_', ' ')}: REST ${_usd(figures['rest']['total'])},"
            f" HTTP ${_usd(figures['http']['total'])}"
            f" (largest line: {figures['http']['largest']})"
        )


def _print_sweep(report: dict[str, Any]) -> None:
    inputs = report["inputs"]
    print()
    print(
        f"[4] Liveness sweep: every {inputs['sweep_every_seconds']} s ="
        f" {inputs['sweep_runs_per_month']:,.0f} runs a month over a"
        f" healthy fleet; measured at {inputs['sweep_measured_at_nodes'][0]:,}"
        f" and {inputs['sweep_measured_at_nodes'][1]:,}"
        " nodes, a straight line through them"
    )
    print(
        f"    {'nodes':>7} {'RRU/run':>8} {'WRU/run':>8} {'ms/run':>7} | {'$/month':>9} {'$/node-month':>12}"
        "  largest line"
    )
    for fleet, figures in report["sweep_month"].items():
        per_run, priced = figures["per_run"], figures["http"]
        print(
            f"    {int(fleet):>7,} {per_run['dynamodb_rru']:>8.2f} {per_run['dynamodb_wru']:>8.2f}"
            f" {per_run['lambda_billed_ms']:>7.0f} |"
            f" {_usd(priced['total']):>9} {priced['total'] / int(fleet):>12.7f}"
            f"  {priced['largest']} ({priced['largest_share']:.0%})"
        )
    print(
        "    (steady heartbeats leave the sweep's index entry alone, so the index names every node online since"
        " before the\n"
        "    cutoff and the sweep reads each one's last heartbeat: an eventually consistent half read unit a node"
        " per run,\n"
        "    which grows with the fleet; writes only for late nodes. ms/run is measured here: the emulator walks"
        " the whole\n"
        "    table to answer an index query, which DynamoDB does not)"
    )


def main(argv: list[str] | None = None) -> int:
    return _support.run_main("cost.py", parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
