"""Schemathesis over every operation of the OpenAPI document, against the local stack over HTTP on
127.0.0.1, with the admin token and a real enrolled node's credential.

Checks, for every request: no 5xx; the answer conforms to the document (status code, content
type, headers, body schema); schema-invalid requests are refused; an operation that needs
authentication refuses a request without it; a method a path lacks is 405 with ``Allow``. And a
refused request (4xx) leaves the state unchanged:

- the embedded emulator counts the writes it accepts (``stack.aws_changes``, a write answered
  2xx); DynamoDB and S3 change nothing on a write they refuse (a failed condition, a cancelled
  transaction), so a refusal during which no write was accepted left every table and the bucket
  as they were. Refusals during which a write was attempted and refused are counted in the figures.

The document is the one the stack serves at ``GET /api/v1/openapi.json``; the test adds explicit
examples naming resources that exist (a node, an enrollment, work items leased to the node, a
valid enroll body), so that the answers of success are checked too, not only the refusals. The
fuzzing phase draws at most ``MAX_EXAMPLES`` cases per operation (the examples and coverage phases
add their own, bounded by the schema): about 2,200 cases in 40 s on two cores. The figures
(operations, cases, requests, statuses) are printed at the end; failures are pytest's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from modelforge_local_stack.emulator import operations_delta
from modelforge_protocol.credentials import new_idempotency_key, new_node_credential

from tests.conftest import ADMIN_TOKEN
from tests.support.api import AgentIdentity, ControlPlane, cpu_inventory, enroll_body, heartbeat_body
from tests.support.snapshots import accepted_writes, writes_so_far

#: Cases the fuzzing phase draws per operation (MODELFORGE_FUZZ_MAX_EXAMPLES overrides it).
MAX_EXAMPLES = int(os.environ.get("MODELFORGE_FUZZ_MAX_EXAMPLES", "50"))
#: The same cases on every run, so that CI does not turn red at random; MODELFORGE_FUZZ_SEED=random
#: (or another number) explores further, and a failure names the seed that reproduces it.
SEED = os.environ.get("MODELFORGE_FUZZ_SEED", "20261201")
ECHO = "diagnostic.echo"
#: The HTTP layer's own headers: the fuzzer leaves them to the transport (Hypothesis draws strings
#: it finds in this project's code, such as "Transfer-Encoding"). How the local server frames and
#: refuses requests is tested by test_http_server_hardening.py; the deployed gateway does its own.
TRANSPORT_HEADERS = frozenset(
    {"transfer-encoding", "content-length", "connection", "keep-alive", "host", "expect", "upgrade", "te", "trailer"}
)


class _AppRequests(logging.Handler):
    """Counts the requests the app answered (the access log's lines), the checks' probes included."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "http_request":
            self.count += 1


class Fuzz:
    """What the fuzz test shares across operations: the stack, the state it checks, the figures."""

    def __init__(self, stack: Any, found: dict[str, Any]) -> None:
        self.stack = stack
        #: the resources the explicit examples name (``_resources``)
        self.found = found
        self.session = requests.Session()
        self.session.hooks["response"].append(self._count)
        self.requests = 0
        self.cases: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.compared = 0
        self._before: dict[str, int] = {}
        self._accepted = 0
        self._lock = threading.Lock()

    def _count(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self.requests += 1

    # --- state ----------------------------------------------------------------------------

    def writes(self) -> dict[str, int]:
        return writes_so_far(self.stack)

    def before(self, case: schemathesis.Case) -> None:
        """Before a request: the write counts.

        The state-log events that earlier requests wrote are shipped first (the stream poller's
        delivery runs the deployed handler, whose S3 writes count like the API's): during a refused
        request nothing is left to ship, so any write counted is the request's own."""
        if self._before != self.writes():
            self.stack.drain_state_log()
        self._before = self.writes()
        self._accepted = accepted_writes(self.stack)

    def unchanged(self, ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> bool | None:
        """A check: a refused request (4xx) left the state as it was (AWS accepted no write)."""
        if not 400 <= response.status_code < 500:
            return None
        writes = self.writes()
        moved = operations_delta(self._before, writes)
        assert accepted_writes(self.stack) == self._accepted, (
            f"refused with {response.status_code} but AWS accepted a write ({moved})"
        )
        if moved:
            self.compared += 1
        return True


# --- resources the explicit examples name -----------------------------------------------------


def _claimed(cp: ControlPlane, node: AgentIdentity) -> dict[str, Any]:
    submitted = cp.submit_work(ECHO, {"fuzz": time.time()})
    assert submitted.status_code == 201, submitted.text
    claim = cp.claim(node)
    assert claim.status_code == 200, claim.text
    return claim.json()  # a queued echo work item: this one, or one an earlier test left


def _resources(cp: ControlPlane) -> dict[str, Any]:
    node = cp.worker_node(("cpu", ECHO))
    assert cp.heartbeat(node).status_code == 200
    victim = cp.enrolled_node()
    renew, complete, fail = (_claimed(cp, node) for _ in range(3))
    result = b'{"fuzz": true}'
    upload = requests.put(complete["result_upload_url"], data=result, timeout=30, allow_redirects=False)
    assert upload.status_code == 200, upload.text
    cancel = cp.submit_work(ECHO, {"fuzz": "cancel"}).json()
    newcomer = AgentIdentity(credential=new_node_credential(), idempotency_key=new_idempotency_key())
    return {
        "node": node,
        "node_enrollment_id": cp.node(str(node.node_id))["enrollment_id"],
        "victim": victim,
        "pending": cp.mint("fuzz pending")["enrollment_id"],
        "enroll": enroll_body(cp.mint("fuzz enroll")["token"], newcomer),
        "renew": renew,
        "complete": {**complete, "sha256": hashlib.sha256(result).hexdigest(), "size": len(result)},
        "fail": fail,
        "cancel": cancel["work_id"],
    }


def _with_examples(document: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """The served document, with explicit examples naming the resources above."""
    node, victim = found["node"], found["victim"]
    path_ids = {
        "getEnrollment": {"enrollment_id": [found["pending"]]},
        "revokeEnrollment": {"enrollment_id": [found["pending"]]},
        "getNode": {"node_id": [node.node_id]},
        "getNodeReadiness": {"node_id": [node.node_id, found["node_enrollment_id"], found["pending"]]},
        "revokeNodeCredential": {"node_id": [victim.node_id]},
        "getWork": {"work_id": [found["cancel"]]},
        "cancelWork": {"work_id": [found["cancel"]]},
        "renewLease": {"work_id": [found["renew"]["work_id"]]},
        "completeWork": {"work_id": [found["complete"]["work_id"]]},
        "failWork": {"work_id": [found["fail"]["work_id"]]},
    }
    bodies = {
        "createEnrollment": {"display_name": "fuzz", "expires_in_seconds": 300},
        "enroll": found["enroll"],
        "heartbeat": heartbeat_body(),
        "replaceInventory": {"protocol_version": 1, "inventory": {**cpu_inventory(), "capabilities": ["cpu", ECHO]}},
        "submitWork": {"capability": ECHO, "input": {"fuzz": 1}, "idempotency_key": "fuzz-example-1"},
        "renewLease": {"epoch": found["renew"]["epoch"]},
        "completeWork": {key: found["complete"][key] for key in ("epoch", "sha256", "size")},
        "failWork": {"epoch": found["fail"]["epoch"], "reason": "fuzz", "retryable": True},
        "claimWork": {},
    }
    for item in document["paths"].values():
        for operation in item.values():
            name = operation["operationId"]
            for parameter in operation.get("parameters", []):
                values = path_ids.get(name, {}).get(parameter["name"])
                if values:
                    parameter["examples"] = {f"existing{i}": {"value": value} for i, value in enumerate(values)}
            if name in bodies:
                operation["requestBody"]["content"]["application/json"]["example"] = bodies[name]
    return document


CONFIG = """
{seed}

[generation]
mode = "all"
max-examples = {max_examples}
no-shrink = true
database = "none"

[phases.stateful]
enabled = false

[checks.positive_data_acceptance]
# valid-looking requests are refused for what they name: an unknown id or token, a lease lost
enabled = false

[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 409, 410, 413, 415]

[auth.openapi.AdminToken]
api_key = "{admin_token}"

[auth.openapi.NodeCredential]
bearer = "{credential}"

[auth.openapi.NodeId]
api_key = "{node_id}"
"""


@pytest.fixture(scope="module")
def fuzz(stack: Any, request: pytest.FixtureRequest) -> Iterator[Fuzz]:
    if stack.emulator is None:
        pytest.skip("the state checks count AWS calls, which only the embedded emulator does")
    context = Fuzz(stack, _resources(ControlPlane(stack.api_url, ADMIN_TOKEN)))
    started, answered = time.monotonic(), _AppRequests()
    api_log = logging.getLogger("modelforge.api")
    api_log.addHandler(answered)
    try:
        yield context
    finally:
        api_log.removeHandler(answered)
    seconds = time.monotonic() - started
    statuses = ", ".join(f"{status}: {count}" for status, count in sorted(context.statuses.items()))
    summary = (
        f"API fuzz: {len(context.cases)} operations, {sum(context.cases.values())} cases, {context.requests} requests "
        f"({answered.count} answered by the app, probes included) in {seconds:.0f} s; statuses {{{statuses}}}; "
        f"{context.compared} refusals during which a write was attempted (AWS refused each)"
    )
    logging.getLogger("tests.fuzz").warning(summary)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # on the terminal, passed or not
            reporter.write_line("\n" + summary)


@pytest.fixture(scope="module")
def api_schema(fuzz: Fuzz) -> Any:
    node = fuzz.found["node"]
    document = requests.get(fuzz.stack.api_url + "/api/v1/openapi.json", timeout=30).json()
    config = schemathesis.Config.from_str(
        CONFIG.format(
            seed="" if SEED == "random" else f"seed = {int(SEED)}",
            max_examples=MAX_EXAMPLES,
            admin_token=ADMIN_TOKEN,
            credential=node.credential,
            node_id=node.node_id,
        )
    )
    schema = schemathesis.openapi.from_dict(_with_examples(document, fuzz.found), config=config)
    schema.config.update(base_url=fuzz.stack.api_url)
    return schema


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """schemathesis 4's pytest integration reads ``node._nodeid``, which pytest 9.2 nodes no longer
    carry (their id is ``nodeid``); it only renames the test for its report."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_every_operation_answers_as_documented_and_refusals_change_nothing(case: schemathesis.Case, fuzz: Fuzz) -> None:
    for name in [name for name in case.headers or {} if name.lower() in TRANSPORT_HEADERS]:
        del case.headers[name]
    fuzz.before(case)
    fuzz.cases[case.operation.label] += 1
    response = case.call_and_validate(session=fuzz.session, timeout=30, additional_checks=[fuzz.unchanged])
    fuzz.statuses[response.status_code] += 1
