"""Every endpoint refuses bad input, and a refused request changes nothing.

Each refusal must be a 4xx answer whose JSON body is ``{"error": {"code": ..., "message": ...}}``
(extra detail fields such as ``problems`` or ``verdict`` are allowed inside ``error``), must
not echo a secret the caller sent, and must leave the whole state (every table and the
state-log bucket) exactly as it was. Everything runs over HTTP against the in-process stack.

Expiry is tested without waiting: the minimum TTL is 60 s, so the expired-token test mints a
60 s token and moves the app's clock (``app._now``) two minutes ahead for one request, plus a
unit-level check of the refusal itself. TOO_OLD cannot happen with the shipped range (1..1,
anything below 1 is UNKNOWN), so it is produced by narrowing the accepted range in-process.

"Changes nothing" is proven by the emulator's count of accepted writes
(``tests.support.snapshots.accepted_writes``): DynamoDB and S3 change nothing on a write they
refuse (a failed condition, a cancelled transaction), so a refused request during which no app
write was accepted left every table and the state-log bucket exactly as they were. Reading the
whole state twice per case instead cost about a second each (the session's state only grows).
The local-up cases below still compare the whole state, read from their own process.
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from modelforge_local_stack.emulator import operations_delta
from modelforge_protocol import credentials, schemas, versions
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER, NODE_ID_HEADER

from tests.support import api
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory, gpu_telemetry
from tests.support.polling import wait_until
from tests.support.processes import RunningProcess, start_local_up
from tests.support.snapshots import accepted_writes, state, writes_so_far

MAX = schemas.MAX_BODY_BYTES
VERDICTS = ("COMPATIBLE", "TOO_OLD", "TOO_NEW", "UNKNOWN")
JSON = {"Content-Type": "application/json"}

# --- assertions --------------------------------------------------------------------------


def _describe_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    lines = []
    for key in before:
        old, new = before[key], after.get(key)
        if old == new:
            continue
        if key == "state_log":
            added = sorted(set(new) - set(old))
            removed = sorted(set(old) - set(new))
            changed = sorted(name for name in set(old) & set(new) if old[name] != new[name])
            lines.append(f"  state_log: {len(added)} added {added[:3]}, {len(removed)} removed, {len(changed)} changed")
        else:
            old_items = {repr(sorted(item.items())) for item in old}
            new_items = {repr(sorted(item.items())) for item in new}
            appeared = sorted(new_items - old_items)
            lines.append(
                f"  {key}: {len(appeared)} item(s) new or changed, {len(old_items - new_items)} gone or changed;"
                f" first: {appeared[0][:300] if appeared else '-'}"
            )
    return "\n".join(lines)


def error_problems(
    response: requests.Response,
    status: int,
    code: str | None,
    secrets: tuple[str, ...] = (),
    mentions: str | None = None,
) -> list[str]:
    """What is wrong with a refusal (empty when it is the expected one)."""
    problems: list[str] = []
    shown = f"{response.status_code} {response.text[:400]!r}"
    if response.status_code != status:
        problems.append(f"expected status {status}, got {shown}")
    if not 400 <= response.status_code < 500:
        problems.append(f"not a 4xx answer: {shown}")
    if not response.headers.get("Content-Type", "").startswith("application/json"):
        problems.append(f"Content-Type is {response.headers.get('Content-Type')!r}")
    try:
        body = response.json()
    except ValueError:
        return problems + [f"body is not JSON: {shown}"]
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(error, dict):
        return problems + [f"body is not {{'error': {{...}}}}: {shown}"]
    if not isinstance(error.get("code"), str) or not error["code"]:
        problems.append(f"error.code missing or not a string: {shown}")
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append(f"error.message missing or not a string: {shown}")
    if code is not None and error.get("code") != code:
        problems.append(f"expected code {code!r}, got {error.get('code')!r}")
    if mentions is not None and mentions not in str(error.get("message")):
        problems.append(f"message does not name {mentions!r}: {error.get('message')!r}")
    for secret in secrets:
        if secret and len(secret) >= 8 and secret in response.text:
            problems.append(f"the answer echoes a secret that was sent ({secret[:8]}...)")
    return problems


def refused(
    stack: Any,
    send: Callable[[], requests.Response],
    status: int,
    code: str | None,
    *,
    secrets: tuple[str, ...] = (),
    mentions: str | None = None,
) -> dict[str, Any]:
    """Send one request; assert it was refused as expected and that AWS accepted no write meanwhile."""
    # ship the state-log events earlier requests left (the shipping function's S3 writes count
    # like the API's): during the refused request nothing is left to ship, so a write is its own
    stack.drain_state_log()
    operations, accepted = writes_so_far(stack), accepted_writes(stack)
    response = send()
    problems = error_problems(response, status, code, secrets, mentions)
    if accepted_writes(stack) != accepted:
        moved = operations_delta(operations, writes_so_far(stack))
        problems.append(f"the refused request changed the state: AWS accepted a write ({moved})")
    assert not problems, "\n".join(problems)
    return response.json()["error"]


# --- bodies and calls --------------------------------------------------------------------


def admin_headers(token: str) -> dict[str, str]:
    return {ADMIN_TOKEN_HEADER: token}


def enroll_body(token: str, identity: AgentIdentity, **overrides: Any) -> dict[str, Any]:
    """The shared valid request, as a 2-GPU nvidia node (its own GPU UUIDs each call)."""
    defaults = {"hostname": "gpu-node-1", "accelerator_mode": "nvidia", "inventory": gpu_inventory(2)}
    return api.enroll_body(token, identity, **{**defaults, **overrides})


def heartbeat_body(gpus: int = 2, **overrides: Any) -> dict[str, Any]:
    return api.heartbeat_body(gpus, **overrides)


def inventory_body(**overrides: Any) -> dict[str, Any]:
    return {"protocol_version": 1, "inventory": gpu_inventory(2), **overrides}


_UNSET: Any = object()


@dataclass
class Call:
    method: str
    path: str
    headers: dict[str, str]
    body: Any = _UNSET  # a valid JSON body for the endpoint; _UNSET sends none
    secrets: tuple[str, ...] = ()

    def send(
        self,
        cp: ControlPlane,
        *,
        body: Any = _UNSET,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: Any = None,
    ) -> requests.Response:
        merged = {**self.headers, **(headers or {})}
        if raw is not None:
            return cp.request(self.method, self.path, headers={**JSON, **merged}, data=raw, params=params)
        payload = self.body if body is _UNSET else body
        if payload is _UNSET:
            return cp.request(self.method, self.path, headers=merged, params=params)
        return cp.request(self.method, self.path, headers=merged, json=payload, params=params)


class Targets:
    """Live objects that valid requests act on. Refused requests must leave them alone;
    ``heal`` replaces any that a wrongly accepted request used up, so one server bug shows
    up in one test instead of cascading."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.token = ""
        self.enrollment_id = ""
        self.revoke_enrollment_id = ""
        self.agent = AgentIdentity()
        self.revoke_node_id = ""
        self._mint_token()
        self.revoke_enrollment_id = cp.mint(display_name="revoke target")["enrollment_id"]
        self._new_agent()
        self.revoke_node_id = cp.enrolled_node(display_name="revoke target node").node_id

    def _mint_token(self) -> None:
        minted = self.cp.mint(display_name="enroll target")
        self.token, self.enrollment_id = minted["token"], minted["enrollment_id"]

    def _new_agent(self) -> None:
        self.agent = self.cp.enrolled_node(display_name="agent target")
        beat = self.cp.heartbeat(self.agent)  # online: heartbeats take the steady-state path
        assert beat.status_code == 200, beat.text

    def _enrollment_status(self, enrollment_id: str) -> str:
        return self.cp.admin("GET", f"/api/v1/admin/node-enrollments/{enrollment_id}").json()["status"]

    def _credential_state(self, node_id: str) -> str:
        return self.cp.node(node_id)["credential"]["state"]

    def heal(self) -> None:
        if self._enrollment_status(self.enrollment_id) != "pending":
            self._mint_token()
        if self._enrollment_status(self.revoke_enrollment_id) != "pending":
            self.revoke_enrollment_id = self.cp.mint(display_name="revoke target")["enrollment_id"]
        if self._credential_state(self.agent.node_id or "") != "active":
            self._new_agent()
        if self._credential_state(self.revoke_node_id) != "active":
            self.revoke_node_id = self.cp.enrolled_node(display_name="revoke target node").node_id


@dataclass
class World:
    admin_token: str
    targets: Targets
    revoked: dict[str, Any]  # an enrollment revoked before use
    consumed: dict[str, Any]  # an enrollment used by `winner`
    winner: AgentIdentity
    other: AgentIdentity  # another active node (pending liveness)
    revoked_node: AgentIdentity  # a node whose credential was revoked


@pytest.fixture(scope="module")
def world(stack: Any, admin_token: str) -> World:
    cp = ControlPlane(stack.api_url, admin_token)
    targets = Targets(cp)
    revoked = cp.mint(display_name="revoked before use")
    answer = cp.admin("POST", f"/api/v1/admin/node-enrollments/{revoked['enrollment_id']}/revoke")
    assert answer.status_code == 200, answer.text
    consumed = cp.mint(display_name="used once")
    winner = AgentIdentity()
    answer = cp.enroll(consumed["token"], winner)
    assert answer.status_code == 201, answer.text
    other = cp.enrolled_node(display_name="another node")
    revoked_node = cp.enrolled_node(display_name="revoked node")
    answer = cp.admin("POST", f"/api/v1/admin/nodes/{revoked_node.node_id}/revoke-credential")
    assert answer.status_code == 200, answer.text
    return World(admin_token, targets, revoked, consumed, winner, other, revoked_node)


@pytest.fixture()
def targets(world: World) -> Targets:
    world.targets.heal()
    return world.targets


@pytest.fixture()
def fresh_agent(cp: ControlPlane) -> AgentIdentity:
    """An online node of its own, for requests that a server bug might accept and store."""
    identity = cp.enrolled_node(display_name="fresh agent")
    beat = cp.heartbeat(identity)
    assert beat.status_code == 200, beat.text
    return identity


@pytest.fixture()
def admin(world: World) -> dict[str, str]:
    return admin_headers(world.admin_token)


POST_ENDPOINTS = ("create_enrollment", "revoke_enrollment", "enroll", "heartbeat", "inventory", "revoke_credential")
#: POST endpoints whose body must be a non-empty JSON object (revoke endpoints accept no body).
BODY_ENDPOINTS = ("create_enrollment", "enroll", "heartbeat", "inventory")
ADMIN_ENDPOINTS = (
    "create_enrollment",
    "list_enrollments",
    "get_enrollment",
    "revoke_enrollment",
    "list_nodes",
    "get_node",
    "revoke_credential",
)
AGENT_ENDPOINTS = ("enroll", "heartbeat", "inventory")


def call_for(name: str, t: Targets, admin_token: str) -> Call:
    """A valid request to one endpoint; tests then break exactly one thing about it."""
    admin = admin_headers(admin_token)
    if name == "create_enrollment":
        return Call(
            "POST", "/api/v1/admin/node-enrollments", admin, {"display_name": "bad input", "expires_in_seconds": 900}
        )
    if name == "list_enrollments":
        return Call("GET", "/api/v1/admin/node-enrollments", admin)
    if name == "get_enrollment":
        return Call("GET", f"/api/v1/admin/node-enrollments/{t.enrollment_id}", admin)
    if name == "revoke_enrollment":
        return Call("POST", f"/api/v1/admin/node-enrollments/{t.revoke_enrollment_id}/revoke", admin, {})
    if name == "list_nodes":
        return Call("GET", "/api/v1/admin/nodes", admin)
    if name == "get_node":
        return Call("GET", f"/api/v1/admin/nodes/{t.agent.node_id}", admin)
    if name == "revoke_credential":
        return Call("POST", f"/api/v1/admin/nodes/{t.revoke_node_id}/revoke-credential", admin, {})
    if name == "enroll":
        identity = AgentIdentity()
        return Call(
            "POST",
            "/api/v1/agent/enroll",
            {},
            enroll_body(t.token, identity),
            (t.token, identity.credential, identity.idempotency_key),
        )
    if name == "heartbeat":
        return Call("POST", "/api/v1/agent/heartbeat", t.agent.headers(), heartbeat_body(), (t.agent.credential,))
    if name == "inventory":
        return Call("POST", "/api/v1/agent/inventory", t.agent.headers(), inventory_body(), (t.agent.credential,))
    raise AssertionError(name)


def b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# --- the state log around a refusal that a transaction decides ----------------------------


def _log_mirrors_outbox(snap: dict[str, Any]) -> list[str]:
    """Every outbox event is in the state log, and the log holds nothing else."""
    from chalicelib.stores.state_log import state_log_key

    events = {state_log_key(item["event_id"]["S"]) for item in snap["MODELFORGE_OUTBOX_TABLE"]}
    logged = set(snap["state_log"])
    problems = []
    if logged - events:
        problems.append(f"state log objects with no outbox event (phantoms): {sorted(logged - events)[:3]}")
    if events - logged:
        problems.append(f"outbox events never shipped to the state log: {sorted(events - logged)[:3]}")
    return problems


def _shipped_state(plane: RunningProcess) -> dict[str, Any]:
    """The whole state of ``plane`` once its state log holds every outbox event (its stream
    poller ships them a fraction of a second after they are written)."""
    from chalicelib.stores.state_log import state_log_key
    from modelforge_local_stack import provision

    names = provision.resource_names("modelforge")

    def caught_up() -> dict[str, Any] | None:
        snap = state(plane.emulator_url, names)
        events = {state_log_key(item["event_id"]["S"]) for item in snap["MODELFORGE_OUTBOX_TABLE"]}
        return snap if events <= set(snap["state_log"]) else None

    return wait_until(caught_up, 30, "the state log to ship every outbox event", interval=0.2)


def test_inventory_refused_by_a_cancelled_transaction_ships_no_phantom_event_and_log_keeps_shipping(
    tmp_path: Any, admin_token: str
) -> None:
    """The inventory endpoint learns that a credential is wrong from a cancelled
    TransactWriteItems (its node guard fails). That refusal must not put an event in the
    state log, and events written afterwards must still be shipped.

    On a control plane of its own, so that this refusal is its first cancelled transaction
    whatever ran before: while the local stack had this bug, the first cancelled transaction
    of a process was the one that left a phantom behind.
    """
    env = {"MODELFORGE_ADMIN_TOKEN": admin_token, "MODELFORGE_SWEEP_INTERVAL_SECONDS": "3600"}  # no sweep writes
    with start_local_up(tmp_path / "local-up.log", env=env) as plane:
        cp = ControlPlane(plane.api_url, admin_token)
        agent = cp.enrolled_node(display_name="agent target")
        beat = cp.heartbeat(agent)
        assert beat.status_code == 200, beat.text
        headers = _bearer(agent.credential, f"node_{uuid.uuid4().hex}")
        problems: list[str] = []
        before = _shipped_state(plane)
        response = cp.request("POST", "/api/v1/agent/inventory", headers=headers, json=inventory_body())
        after = _shipped_state(plane)
        problems += error_problems(response, 401, "credential_invalid", (agent.credential,))
        if after != before:
            problems.append("the refused request changed the state:\n" + _describe_change(before, after))
        cp.mint(display_name="minted after a refusal")  # a real event, which must reach the log
        problems += _log_mirrors_outbox(_shipped_state(plane))
    assert not problems, "\n".join(problems)


# --- admin authentication ----------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ADMIN_ENDPOINTS)
@pytest.mark.parametrize(
    "variant",
    ["absent", "empty", "sent_as_bearer_authorization", "sent_as_query_parameter"],
)
def test_admin_endpoint_without_admin_token_is_refused_401_admin_token_missing(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, variant: str
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    call.headers = {}
    params = None
    if variant == "empty":
        call.headers = {ADMIN_TOKEN_HEADER: ""}
    elif variant == "sent_as_bearer_authorization":
        call.headers = {"Authorization": f"Bearer {world.admin_token}"}
    elif variant == "sent_as_query_parameter":
        params = {"admin_token": world.admin_token}
    refused(
        stack,
        lambda: call.send(cp, params=params),
        401,
        "admin_token_missing",
        secrets=(world.admin_token,),
    )


@pytest.mark.parametrize("endpoint", ADMIN_ENDPOINTS)
@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(lambda real: "not-the-admin-token-" + "x" * 40, id="random"),
        pytest.param(lambda real: real + "x", id="one_char_appended"),
        pytest.param(lambda real: real.swapcase(), id="case_swapped"),
    ],
)
def test_admin_endpoint_with_wrong_admin_token_is_refused_403_admin_token_invalid(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, wrong: Callable[[str], str]
) -> None:
    presented = wrong(world.admin_token)
    call = call_for(endpoint, targets, world.admin_token)
    call.headers = admin_headers(presented)
    refused(
        stack,
        lambda: call.send(cp),
        403,
        "admin_token_invalid",
        secrets=(presented, world.admin_token),
    )


def test_admin_create_enrollment_with_wrong_token_and_bad_body_is_refused_403_before_validation(
    stack: Any, cp: ControlPlane
) -> None:
    refused(
        stack,
        lambda: cp.request(
            "POST",
            "/api/v1/admin/node-enrollments",
            headers=admin_headers("wrong-admin-token-" + "y" * 30),
            json={"display_name": "", "expires_in_seconds": 1},
        ),
        403,
        "admin_token_invalid",
    )


# --- create enrollment -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(59, id="59_below_min"),
        pytest.param(86401, id="86401_above_max"),
        pytest.param(0, id="zero"),
        pytest.param(-1, id="minus_one"),
        pytest.param(1.5, id="float_1.5"),
        pytest.param(900.5, id="float_900.5"),
        pytest.param("900", id="string_900"),
        pytest.param(True, id="true"),
        pytest.param(False, id="false"),
        pytest.param(None, id="null"),
        pytest.param([900], id="list"),
        pytest.param({"seconds": 900}, id="object"),
        pytest.param(10**30, id="huge_integer"),
        pytest.param(-(10**30), id="huge_negative_integer"),
    ],
)
def test_create_enrollment_bad_expires_in_seconds_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, admin: dict[str, str], value: Any
) -> None:
    body = {"display_name": "GPU node", "expires_in_seconds": value}
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/admin/node-enrollments", headers=admin, json=body),
        400,
        "invalid_request",
        mentions="expires_in_seconds",
    )


@pytest.mark.parametrize(
    "body, field",
    [
        pytest.param({"expires_in_seconds": 900}, "display_name", id="display_name_missing"),
        pytest.param({"display_name": "x"}, "expires_in_seconds", id="expires_in_seconds_missing"),
        pytest.param({}, "display_name", id="both_missing"),
        pytest.param({"display_name": "", "expires_in_seconds": 900}, "display_name", id="display_name_empty"),
        pytest.param({"display_name": "n" * 129, "expires_in_seconds": 900}, "display_name", id="display_name_129"),
        pytest.param({"display_name": "n" * 5000, "expires_in_seconds": 900}, "display_name", id="display_name_5000"),
        pytest.param(
            {"display_name": "é" * 129, "expires_in_seconds": 900}, "display_name", id="display_name_129_non_ascii"
        ),
        pytest.param({"display_name": 123, "expires_in_seconds": 900}, "display_name", id="display_name_integer"),
        pytest.param({"display_name": None, "expires_in_seconds": 900}, "display_name", id="display_name_null"),
        pytest.param({"display_name": ["x"], "expires_in_seconds": 900}, "display_name", id="display_name_list"),
        pytest.param({"display_name": {"a": "b"}, "expires_in_seconds": 900}, "display_name", id="display_name_object"),
        pytest.param({"display_name": True, "expires_in_seconds": 900}, "display_name", id="display_name_bool"),
        pytest.param(
            {"display_name": "x", "expires_in_seconds": 900, "production_eligible": "true"},
            "production_eligible",
            id="production_eligible_string",
        ),
        pytest.param(
            {"display_name": "x", "expires_in_seconds": 900, "production_eligible": 1},
            "production_eligible",
            id="production_eligible_integer",
        ),
        pytest.param(
            {"display_name": "x", "expires_in_seconds": 900, "production_eligible": None},
            "production_eligible",
            id="production_eligible_null",
        ),
    ],
)
def test_create_enrollment_bad_field_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, admin: dict[str, str], body: dict[str, Any], field: str
) -> None:
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/admin/node-enrollments", headers=admin, json=body),
        400,
        "invalid_request",
        mentions=field,
    )


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"token": "mfe.x"}, id="token"),
        pytest.param({"enrollment_id": "enr_" + "0" * 32}, id="enrollment_id"),
        pytest.param({"status": "consumed"}, id="status"),
        pytest.param({"expires_at": 4102444800}, id="expires_at"),
        pytest.param({"Display_Name": "x"}, id="case_variant_of_known_field"),
        pytest.param({"": 1}, id="empty_name"),
        pytest.param({"x" * 1000: 1}, id="very_long_name"),
    ],
)
def test_create_enrollment_unknown_field_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, admin: dict[str, str], extra: dict[str, Any]
) -> None:
    body = {"display_name": "GPU node", "expires_in_seconds": 900, **extra}
    error = refused(
        stack,
        lambda: cp.request("POST", "/api/v1/admin/node-enrollments", headers=admin, json=body),
        400,
        "invalid_request",
        mentions="unknown field",
    )
    assert len(error["message"]) < 1000, "the message repeats the whole unknown field name"


# --- bodies on every POST endpoint -------------------------------------------------------


NOT_JSON = [
    pytest.param(b"not json", id="text"),
    pytest.param(b"{", id="unterminated_object"),
    pytest.param(b"{'display_name': 'x'}", id="single_quotes"),
    pytest.param(b'{"a": 1,}', id="trailing_comma"),
    pytest.param(b'{"a": 1}{"b": 2}', id="two_objects"),
    pytest.param(b"\xff\xfe\xfd", id="invalid_utf8"),
    pytest.param(b"display_name=x&expires_in_seconds=900", id="form_encoded"),
]

NOT_AN_OBJECT = [
    pytest.param(b"[]", id="empty_list"),
    pytest.param(b'[{"display_name": "x"}]', id="list_of_object"),
    pytest.param(b'"a string"', id="string"),
    pytest.param(b"null", id="null"),
    pytest.param(b"42", id="number"),
    pytest.param(b"true", id="true"),
]


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize("raw", NOT_JSON)
def test_post_endpoint_non_json_body_is_refused_400_invalid_json(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, raw: bytes
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, raw=raw), 400, "invalid_json", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize("raw", NOT_AN_OBJECT)
def test_post_endpoint_json_that_is_not_an_object_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, raw: bytes
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, raw=raw), 400, "invalid_request", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * 50_000, id="50000_nested_lists"),
        pytest.param(b'{"a":' * 5_000 + b"1" + b"}" * 5_000, id="5000_nested_objects"),
    ],
)
def test_post_endpoint_deeply_nested_json_is_refused_400(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, raw: bytes
) -> None:
    """Under the size limit but deeper than the JSON parser can go: a 4xx, not a 500."""
    assert len(raw) <= MAX
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, raw=raw), 400, None, secrets=call.secrets)


_LONE_SURROGATE_MARK = "lone-surrogate-goes-here"
#: A free-text field of each body endpoint (no pattern would refuse it on its own).
_TEXT_FIELD: dict[str, Callable[[dict[str, Any]], None]] = {
    "create_enrollment": lambda body: body.update(display_name=_LONE_SURROGATE_MARK),
    "enroll": lambda body: body["inventory"]["gpus"][0].update(name=_LONE_SURROGATE_MARK),
    "heartbeat": lambda body: body["health"].update(detail=_LONE_SURROGATE_MARK),
    "inventory": lambda body: body["inventory"]["gpus"][0].update(name=_LONE_SURROGATE_MARK),
}


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize("escape", ["\\ud800", "x\\udfffy"])
def test_post_endpoint_string_with_a_lone_surrogate_is_refused_400_invalid_json(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, escape: str
) -> None:
    """A lone surrogate parses as JSON but cannot be stored or logged as UTF-8: refused, never a 500."""
    call = call_for(endpoint, targets, world.admin_token)
    body = json.loads(json.dumps(call.body))
    _TEXT_FIELD[endpoint](body)
    raw = json.dumps(body).replace(_LONE_SURROGATE_MARK, escape).encode()
    refused(stack, lambda: call.send(cp, raw=raw), 400, "invalid_json", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize("raw", [pytest.param(b"", id="empty"), pytest.param(b" \r\n\t ", id="whitespace")])
def test_post_endpoint_empty_body_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, raw: bytes
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, raw=raw), 400, "invalid_request", secrets=call.secrets)


def _padded(body: Any, size: int) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize(
    "shape",
    ["valid_body_padded_to_64KiB_plus_1", "long_string_field"],
)
def test_post_endpoint_body_over_64_kib_is_refused_413_payload_too_large(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, shape: str
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    if shape == "valid_body_padded_to_64KiB_plus_1":
        raw = _padded(call.body, MAX + 1)
    else:
        raw = json.dumps({**call.body, "padding": "a" * MAX}).encode()
    assert len(raw) > MAX
    refused(stack, lambda: call.send(cp, raw=raw), 413, "payload_too_large", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
def test_post_endpoint_whitespace_body_over_64_kib_is_refused_413_payload_too_large(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str
) -> None:
    """Size is judged before content: 64 KiB + 1 of blanks is too large, not 'empty'."""
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, raw=b" " * (MAX + 1)), 413, "payload_too_large", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
def test_post_endpoint_body_of_exactly_64_kib_is_judged_on_content_not_refused_413(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    body = {**call.body, "zz_padding": ""}
    overhead = len(json.dumps(body, separators=(",", ":")).encode())
    body["zz_padding"] = "a" * (MAX - overhead)
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) == MAX
    refused(stack, lambda: call.send(cp, raw=raw), 400, "invalid_request", secrets=call.secrets, mentions="zz_padding")


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize("declared", ["20000000"])
def test_post_endpoint_declared_length_over_server_limit_is_refused_413_payload_too_large(
    stack: Any, world: World, targets: Targets, endpoint: str, declared: str
) -> None:
    """A Content-Length over the server's 64 KiB cap is refused before the body is read."""
    call = call_for(endpoint, targets, world.admin_token)
    url = urlsplit(stack.api_url)
    head = [f"{call.method} {call.path} HTTP/1.1", f"Host: {url.netloc}", "Content-Type: application/json"]
    head += [f"{name}: {value}" for name, value in call.headers.items()]
    head += [f"Content-Length: {declared}", "Connection: close", "", ""]

    def send() -> requests.Response:
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall("\r\n".join(head).encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        status_line, _, rest = b"".join(chunks).partition(b"\r\n")
        header_block, _, payload = rest.partition(b"\r\n\r\n")
        response = requests.Response()
        response.status_code = int(status_line.split()[1])
        for line in header_block.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            response.headers[name.strip()] = value.strip()
        response._content = payload
        return response

    refused(stack, send, 413, "payload_too_large", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_post_endpoint_non_json_content_type_is_refused_415_unsupported_media_type(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, content_type: str
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    raw = json.dumps(call.body).encode()
    refused(
        stack,
        lambda: call.send(cp, raw=raw, headers={"Content-Type": content_type}),
        415,
        "unsupported_media_type",
        secrets=call.secrets,
    )


@pytest.mark.parametrize("endpoint", POST_ENDPOINTS)
@pytest.mark.parametrize("params", [{"dry_run": "true"}])
def test_post_endpoint_unknown_query_parameter_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, params: dict[str, str]
) -> None:
    """No POST endpoint takes query parameters; like the GET endpoints, refuse unknown ones."""
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, params=params), 400, "invalid_request", secrets=call.secrets)


@pytest.mark.parametrize("endpoint", ["revoke_enrollment", "revoke_credential"])
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"x": 1}, id="unknown_field"),
        pytest.param({"reason": "compromised"}, id="reason"),
        pytest.param({"state": "active"}, id="state"),
        pytest.param({"": None}, id="empty_name"),
    ],
)
def test_revoke_endpoint_non_empty_body_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, body: dict[str, Any]
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, body=body), 400, "invalid_request", mentions="unknown field")


# --- wrong methods -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/v1/health"),
        ("DELETE", "/api/v1/health"),
        ("POST", "/api/v1/compatibility"),
        ("PUT", "/api/v1/admin/node-enrollments"),
        ("DELETE", "/api/v1/admin/node-enrollments"),
        ("DELETE", "/api/v1/admin/node-enrollments/{enrollment_id}"),
        ("PATCH", "/api/v1/admin/node-enrollments/{enrollment_id}"),
        ("GET", "/api/v1/admin/node-enrollments/{enrollment_id}/revoke"),
        ("GET", "/api/v1/agent/enroll"),
        ("PUT", "/api/v1/agent/heartbeat"),
        ("GET", "/api/v1/agent/inventory"),
        ("POST", "/api/v1/admin/nodes"),
        ("PUT", "/api/v1/admin/nodes/{node_id}"),
        ("GET", "/api/v1/admin/nodes/{node_id}/revoke-credential"),
    ],
)
def test_endpoint_wrong_method_is_refused_405_in_error_shape(
    stack: Any, cp: ControlPlane, admin: dict[str, str], targets: Targets, method: str, path: str
) -> None:
    path = path.format(enrollment_id=targets.revoke_enrollment_id, node_id=targets.revoke_node_id)
    error = refused(stack, lambda: cp.request(method, path, headers={**admin, **JSON}, data=b"{}"), 405, None)
    assert error["code"].startswith("method_not_allowed")


# --- enroll: tokens ----------------------------------------------------------------------


MALFORMED_TOKENS = [
    pytest.param("", id="empty"),
    pytest.param("mfe.", id="prefix_only"),
    pytest.param("not-an-enrollment-token-at-all", id="junk"),
    pytest.param("mfe.enr_" + "0" * 32, id="no_secret"),
    pytest.param("mfe.enr_" + "0" * 32 + "." + "A" * 42, id="secret_42_chars"),
    pytest.param("mfe.enr_" + "0" * 32 + "." + "A" * 44, id="secret_44_chars"),
    pytest.param("mfe.enr_" + "0" * 32 + "." + "A" * 42 + "+", id="secret_bad_char"),
    pytest.param("mfe.enr_" + "G" * 32 + "." + "A" * 43, id="id_not_hex"),
    pytest.param("mfe.enr_" + "A" * 32 + "." + "A" * 43, id="id_upper_hex"),
    pytest.param("mfe.enr_" + "0" * 31 + "." + "A" * 43, id="id_31_hex"),
    pytest.param("mfe.node_" + "0" * 32 + "." + "A" * 43, id="node_id_inside"),
    pytest.param("MFE.enr_" + "0" * 32 + "." + "A" * 43, id="upper_prefix"),
    pytest.param("mfn." + "A" * 43, id="node_credential"),
    pytest.param("mfi." + "A" * 43, id="idempotency_key"),
    pytest.param("Bearer mfe.enr_" + "0" * 32 + "." + "A" * 43, id="with_scheme"),
    pytest.param(" mfe.enr_" + "0" * 32 + "." + "A" * 43, id="leading_space"),
]


@pytest.mark.parametrize("token", MALFORMED_TOKENS)
def test_enroll_malformed_token_is_refused_401_enrollment_token_unknown(
    stack: Any, cp: ControlPlane, token: str
) -> None:
    identity = AgentIdentity()
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(token, identity)),
        401,
        "enrollment_token_unknown",
        secrets=(token, identity.credential, identity.idempotency_key),
    )


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(123, id="integer"),
        pytest.param(None, id="null"),
        pytest.param(True, id="bool"),
        pytest.param(["mfe.x"], id="list"),
        pytest.param({"token": "mfe.x"}, id="object"),
        pytest.param("mfe.enr_" + "0" * 32 + "." + "A" * 300, id="over_256_chars"),
    ],
)
def test_enroll_token_of_wrong_type_or_size_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, token: Any
) -> None:
    identity = AgentIdentity()
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(token, identity)),
        400,
        "invalid_request",
        secrets=(identity.credential, identity.idempotency_key) + ((token,) if isinstance(token, str) else ()),
        mentions="token",
    )


@pytest.mark.parametrize("how", ["never_minted_id", "real_id_wrong_secret", "real_token_with_secret_changed"])
def test_enroll_unknown_well_formed_token_is_refused_401_enrollment_token_unknown(
    stack: Any, cp: ControlPlane, targets: Targets, how: str
) -> None:
    if how == "never_minted_id":
        token = credentials.new_enrollment_token(f"enr_{uuid.uuid4().hex}")
    elif how == "real_id_wrong_secret":
        token = credentials.new_enrollment_token(targets.enrollment_id)
    else:
        last = targets.token[-1]
        token = targets.token[:-1] + ("B" if last != "B" else "C")
    assert credentials.ENROLLMENT_TOKEN_RE.match(token)
    identity = AgentIdentity()
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(token, identity)),
        401,
        "enrollment_token_unknown",
        secrets=(token, targets.token, identity.credential, identity.idempotency_key),
    )


def test_enroll_expired_token_is_refused_410_enrollment_token_expired(
    stack: Any, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mint with the minimum TTL (60 s), then move the app's clock 2 minutes on: no sleep."""
    minted = cp.mint(display_name="expires soon", expires_in_seconds=60)
    app_module = stack.app_module
    real_now = app_module._now
    monkeypatch.setattr(app_module, "_now", lambda: real_now() + 120)
    identity = AgentIdentity()
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(minted["token"], identity)),
        410,
        "enrollment_token_expired",
        secrets=(minted["token"], identity.credential, identity.idempotency_key),
    )


def test_enrollment_refusal_past_expiry_is_410_enrollment_token_expired_unit() -> None:
    """Unit level: a pending token is refused as expired from the instant it expires."""
    from chalicelib.domain.errors import Gone
    from chalicelib.domain.records import Enrollment
    from chalicelib.services import enrollments

    item = Enrollment(
        enrollment_id="enr_" + "0" * 32,
        token_sha256="0" * 64,
        display_name="x",
        state=enrollments.PENDING,
        production_eligible=False,
        created_at=1000.0,
        expires_at=1060.0,
    )
    assert enrollments.public_state(item, 1059.999) == enrollments.PENDING
    assert enrollments.public_state(item, 1060.0) == enrollments.EXPIRED
    error = enrollments._refusal(item, 1060.0)
    assert (type(error), error.code) == (Gone, "enrollment_token_expired")  # app.py answers Gone with 410
    item.state = enrollments.REVOKED
    error = enrollments._refusal(item, 5000.0)
    assert (type(error), error.code) == (Gone, "enrollment_token_revoked")


def test_enroll_revoked_token_is_refused_410_enrollment_token_revoked(
    stack: Any, cp: ControlPlane, world: World
) -> None:
    identity = AgentIdentity()
    token = world.revoked["token"]
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(token, identity)),
        410,
        "enrollment_token_revoked",
        secrets=(token, identity.credential, identity.idempotency_key),
    )


@pytest.mark.parametrize(
    "who", ["new_agent", "same_idempotency_key_other_credential", "same_credential_other_idempotency_key"]
)
def test_enroll_consumed_token_is_refused_409_enrollment_token_consumed(
    stack: Any, cp: ControlPlane, world: World, who: str
) -> None:
    identity = AgentIdentity()
    if who == "same_idempotency_key_other_credential":
        identity.idempotency_key = world.winner.idempotency_key
    elif who == "same_credential_other_idempotency_key":
        identity.credential = world.winner.credential
    token = world.consumed["token"]
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(token, identity)),
        409,
        "enrollment_token_consumed",
        secrets=(token, identity.credential, identity.idempotency_key, world.winner.credential),
    )


# --- enroll: the agent's own secrets -----------------------------------------------------


def _malformed_secrets(prefix: str) -> list[Any]:
    other = "mfi." if prefix == "mfn." else "mfn."
    return [
        pytest.param("", id="empty"),
        pytest.param(prefix, id="prefix_only"),
        pytest.param(prefix + "A" * 42, id="42_chars"),
        pytest.param(prefix + "A" * 44, id="44_chars"),
        pytest.param(prefix + "A" * 42 + "+", id="plus_char"),
        pytest.param(prefix + "A" * 42 + "=", id="padding_char"),
        pytest.param(prefix + "A" * 42 + "é", id="non_ascii_char"),
        pytest.param(other + "A" * 43, id="other_prefix"),
        pytest.param("mfe." + "A" * 43, id="token_prefix"),
        pytest.param(prefix.upper() + "A" * 43, id="upper_prefix"),
        pytest.param("A" * 43, id="no_prefix"),
        pytest.param("Bearer " + prefix + "A" * 43, id="with_scheme"),
        pytest.param(" " + prefix + "A" * 43, id="leading_space"),
        pytest.param(prefix + "A" * 43 + " ", id="trailing_space"),
        pytest.param(prefix + "A" * 250, id="256_chars"),
    ]


@pytest.mark.parametrize("credential", _malformed_secrets("mfn."))
def test_enroll_malformed_credential_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, credential: str
) -> None:
    identity = AgentIdentity(credential=credential)
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(targets.token, identity)),
        400,
        "invalid_request",
        secrets=(targets.token, credential, identity.idempotency_key),
        mentions="credential",
    )


@pytest.mark.parametrize("key", _malformed_secrets("mfi."))
def test_enroll_malformed_idempotency_key_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, key: str
) -> None:
    identity = AgentIdentity(idempotency_key=key)
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(targets.token, identity)),
        400,
        "invalid_request",
        secrets=(targets.token, key, identity.credential),
        mentions="idempotency_key",
    )


@pytest.mark.parametrize("field", ["credential", "idempotency_key"])
def test_enroll_secret_with_trailing_newline_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, field: str
) -> None:
    """``mfn.<43>\\n`` is not the documented format (and can never be sent in a header)."""
    identity = AgentIdentity()
    setattr(identity, field, getattr(identity, field) + "\n")
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=enroll_body(targets.token, identity)),
        400,
        "invalid_request",
        secrets=(targets.token, identity.credential.strip(), identity.idempotency_key.strip()),
        mentions=field,
    )


# --- enroll: other fields ----------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["token", "idempotency_key", "credential", "hostname", "agent_version", "accelerator_mode", "inventory"]
)
def test_enroll_missing_field_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, field: str
) -> None:
    identity = AgentIdentity()
    body = enroll_body(targets.token, identity)
    del body[field]
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=body),
        400,
        "invalid_request",
        secrets=(targets.token, identity.credential, identity.idempotency_key),
        mentions=field,
    )


ENROLL_BAD_FIELDS = [
    # secrets of the wrong type
    ("credential", 123),
    ("credential", None),
    ("credential", ["mfn.x"]),
    ("idempotency_key", 123),
    ("idempotency_key", None),
    ("idempotency_key", {"k": "v"}),
    ("hostname", ""),
    ("hostname", "-leading-dash"),
    ("hostname", ".leading-dot"),
    ("hostname", "has space"),
    ("hostname", "has/slash"),
    ("hostname", "hôst"),
    ("hostname", "h" * 254),
    ("hostname", 123),
    ("hostname", None),
    ("agent_version", ""),
    ("agent_version", "1" * 65),
    ("agent_version", "1.3 beta"),
    ("agent_version", "1.3.0;rm"),
    ("agent_version", 13),
    ("agent_version", None),
    ("accelerator_mode", "tpu"),
    ("accelerator_mode", ""),
    ("accelerator_mode", "NVIDIA"),
    ("accelerator_mode", None),
    ("accelerator_mode", ["cpu"]),
    ("credential", "mfn." + "A" * 253),
    ("idempotency_key", "mfi." + "A" * 253),
]


@pytest.mark.parametrize("field, value", ENROLL_BAD_FIELDS)
def test_enroll_bad_field_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, field: str, value: Any
) -> None:
    identity = AgentIdentity()
    body = enroll_body(targets.token, identity, **{field: value})
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=body),
        400,
        "invalid_request",
        secrets=(targets.token, identity.credential, identity.idempotency_key),
        mentions=field,
    )


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"node_id": "node_" + "0" * 32}, id="node_id"),
        pytest.param({"production_eligible": True}, id="production_eligible"),
        pytest.param({"display_name": "x"}, id="display_name"),
        pytest.param({"Token": "x"}, id="case_variant"),
    ],
)
def test_enroll_unknown_field_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, extra: dict[str, Any]
) -> None:
    identity = AgentIdentity()
    body = {**enroll_body(targets.token, identity), **extra}
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=body),
        400,
        "invalid_request",
        secrets=(targets.token, identity.credential, identity.idempotency_key),
        mentions="unknown field",
    )


# --- inventories (enroll and inventory endpoints) ----------------------------------------


def _inv(change: Callable[[dict[str, Any]], Any]) -> Callable[[], Any]:
    def build() -> Any:
        inventory = gpu_inventory(2)
        replaced = change(inventory)
        return inventory if replaced is None else replaced

    return build


def _distinct_capabilities(count: int) -> list[str]:
    return [f"cap{index}" for index in range(count)]


BAD_INVENTORIES = [
    pytest.param(_inv(lambda inv: "x"), "inventory", id="string"),
    pytest.param(_inv(lambda inv: []), "inventory", id="list"),
    pytest.param(lambda: None, "inventory", id="null"),
    pytest.param(_inv(lambda inv: inv.pop("gpus") and None), "gpus", id="missing_gpus"),
    pytest.param(_inv(lambda inv: inv.pop("capabilities") and None), "capabilities", id="missing_capabilities"),
    pytest.param(_inv(lambda inv: inv.pop("cpu") and None), "cpu", id="missing_cpu"),
    pytest.param(_inv(lambda inv: inv.pop("memory_total_bytes") and None), "memory_total_bytes", id="missing_memory"),
    pytest.param(_inv(lambda inv: inv.update(extra=1)), "unknown field", id="unknown_field"),
    pytest.param(_inv(lambda inv: inv.update(gpus={"0": {}})), "gpus", id="gpus_not_list"),
    pytest.param(lambda: gpu_inventory(65), "gpus", id="65_gpus"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(index=-1)), "index", id="gpu_index_negative"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(index=64)), "index", id="gpu_index_64"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(index="0")), "index", id="gpu_index_string"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(index=0.5)), "index", id="gpu_index_float"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(uuid="not-a-gpu-uuid")), "uuid", id="gpu_uuid_bad"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(uuid="GPU-1234567")), "uuid", id="gpu_uuid_short"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(name="")), "name", id="gpu_name_empty"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(name="n" * 129)), "name", id="gpu_name_129"),
    pytest.param(
        _inv(lambda inv: inv["gpus"][0].update(memory_total_bytes=-1)), "memory_total_bytes", id="gpu_memory_negative"
    ),
    pytest.param(
        _inv(lambda inv: inv["gpus"][0].update(memory_total_bytes=2**63)), "memory_total_bytes", id="gpu_memory_2_63"
    ),
    pytest.param(
        _inv(lambda inv: inv["gpus"][0].update(memory_total_bytes=1.5)), "memory_total_bytes", id="gpu_memory_float"
    ),
    pytest.param(
        _inv(lambda inv: inv["gpus"][0].update(driver_version="570 124")), "driver_version", id="gpu_driver_space"
    ),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(cuda_version="")), "cuda_version", id="gpu_cuda_empty"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].pop("uuid") and None), "uuid", id="gpu_missing_uuid"),
    pytest.param(_inv(lambda inv: inv["gpus"][0].update(serial="x")), "unknown field", id="gpu_unknown_field"),
    pytest.param(_inv(lambda inv: inv["gpus"].append("GPU-0")), "gpus", id="gpu_not_object"),
    pytest.param(_inv(lambda inv: inv["gpus"][1].update(index=0)), "gpus", id="duplicate_gpu_indexes"),
    pytest.param(
        _inv(lambda inv: inv["gpus"][1].update(uuid=inv["gpus"][0]["uuid"])), "gpus", id="duplicate_gpu_uuids"
    ),
    pytest.param(
        _inv(lambda inv: inv.update(capabilities=["cuda", "cuda"])), "capabilities", id="capabilities_duplicate"
    ),
    pytest.param(_inv(lambda inv: inv.update(capabilities=["CUDA"])), "capabilities", id="capability_upper"),
    pytest.param(_inv(lambda inv: inv.update(capabilities=[""])), "capabilities", id="capability_empty"),
    pytest.param(_inv(lambda inv: inv.update(capabilities=["c" * 65])), "capabilities", id="capability_65_chars"),
    pytest.param(_inv(lambda inv: inv.update(capabilities=[1])), "capabilities", id="capability_integer"),
    pytest.param(
        _inv(lambda inv: inv.update(capabilities=_distinct_capabilities(65))), "capabilities", id="65_capabilities"
    ),
    pytest.param(_inv(lambda inv: inv.update(capabilities="cuda")), "capabilities", id="capabilities_string"),
    pytest.param(_inv(lambda inv: inv["cpu"].pop("model") and None), "model", id="cpu_missing_model"),
    pytest.param(_inv(lambda inv: inv["cpu"].update(model="m" * 129)), "model", id="cpu_model_129"),
    pytest.param(_inv(lambda inv: inv["cpu"].update(logical_cores=0)), "logical_cores", id="cpu_cores_0"),
    pytest.param(_inv(lambda inv: inv["cpu"].update(logical_cores=4097)), "logical_cores", id="cpu_cores_4097"),
    pytest.param(_inv(lambda inv: inv["cpu"].update(logical_cores="8")), "logical_cores", id="cpu_cores_string"),
    pytest.param(_inv(lambda inv: inv["cpu"].update(logical_cores=True)), "logical_cores", id="cpu_cores_bool"),
    pytest.param(_inv(lambda inv: inv["cpu"].update(sockets=2)), "unknown field", id="cpu_unknown_field"),
    pytest.param(_inv(lambda inv: inv.update(cpu="x86")), "cpu", id="cpu_string"),
    pytest.param(_inv(lambda inv: inv.update(memory_total_bytes=-1)), "memory_total_bytes", id="memory_negative"),
    pytest.param(_inv(lambda inv: inv.update(memory_total_bytes="8G")), "memory_total_bytes", id="memory_string"),
    pytest.param(_inv(lambda inv: inv.update(memory_total_bytes=False)), "memory_total_bytes", id="memory_bool"),
]


@pytest.mark.parametrize("build, mentions", BAD_INVENTORIES)
def test_enroll_bad_inventory_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, build: Callable[[], Any], mentions: str
) -> None:
    identity = AgentIdentity()
    body = enroll_body(targets.token, identity, inventory=build())
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/enroll", json=body),
        400,
        "invalid_request",
        secrets=(targets.token, identity.credential, identity.idempotency_key),
        mentions=mentions,
    )


@pytest.mark.parametrize("build, mentions", BAD_INVENTORIES)
def test_inventory_bad_inventory_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, build: Callable[[], Any], mentions: str
) -> None:
    body = inventory_body(inventory=build())
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/inventory", headers=targets.agent.headers(), json=body),
        400,
        "invalid_request",
        secrets=(targets.agent.credential,),
        mentions=mentions,
    )


@pytest.mark.parametrize(
    "body, mentions",
    [
        pytest.param({"protocol_version": 1}, "inventory", id="missing_inventory"),
        pytest.param(inventory_body(node_id="node_" + "0" * 32), "unknown field", id="unknown_field_node_id"),
        pytest.param(inventory_body(agent_version="1.3.0"), "unknown field", id="unknown_field_agent_version"),
        pytest.param({"protocol_version": 1, "gpus": []}, "inventory", id="inventory_fields_at_top_level"),
    ],
)
def test_inventory_bad_body_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, body: dict[str, Any], mentions: str
) -> None:
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/inventory", headers=targets.agent.headers(), json=body),
        400,
        "invalid_request",
        secrets=(targets.agent.credential,),
        mentions=mentions,
    )


# --- protocol version (enroll, heartbeat, inventory) ---------------------------------------


_MISSING: Any = object()

PROTOCOL_CASES = [
    pytest.param(_MISSING, "UNKNOWN", id="missing"),
    pytest.param(None, "UNKNOWN", id="null"),
    pytest.param("1", "UNKNOWN", id="string_1"),
    pytest.param("", "UNKNOWN", id="empty_string"),
    pytest.param(1.0, "UNKNOWN", id="float_1.0"),
    pytest.param(1.5, "UNKNOWN", id="float_1.5"),
    pytest.param(True, "UNKNOWN", id="true"),
    pytest.param(False, "UNKNOWN", id="false"),
    pytest.param(0, "UNKNOWN", id="zero"),
    pytest.param(-1, "UNKNOWN", id="minus_one"),
    pytest.param([1], "UNKNOWN", id="list"),
    pytest.param({"major": 1}, "UNKNOWN", id="object"),
    pytest.param(2, "TOO_NEW", id="two"),
    pytest.param(2**70, "TOO_NEW", id="huge"),
]


def _agent_request(
    endpoint: str, targets: Targets, protocol_version: Any
) -> tuple[Callable[[ControlPlane], requests.Response], tuple[str, ...]]:
    if endpoint == "enroll":
        identity = AgentIdentity()
        body = enroll_body(targets.token, identity)
        secrets: tuple[str, ...] = (targets.token, identity.credential, identity.idempotency_key)
        headers: dict[str, str] = {}
        path = "/api/v1/agent/enroll"
    else:
        body = heartbeat_body() if endpoint == "heartbeat" else inventory_body()
        secrets = (targets.agent.credential,)
        headers = targets.agent.headers()
        path = f"/api/v1/agent/{endpoint}"
    if protocol_version is _MISSING:
        del body["protocol_version"]
    else:
        body["protocol_version"] = protocol_version
    return (lambda cp: cp.request("POST", path, headers=headers, json=body)), secrets


def _assert_one_verdict(error: dict[str, Any], expected: str, text: str) -> None:
    assert error["verdict"] == expected, error
    assert isinstance(error.get("next_step"), str) and error["next_step"], error
    named = [name for name in VERDICTS if name in text]
    assert named == [expected], f"verdict names in the answer: {named}"


@pytest.mark.parametrize("endpoint", AGENT_ENDPOINTS)
@pytest.mark.parametrize("protocol_version, expected", PROTOCOL_CASES)
def test_agent_endpoint_bad_protocol_version_is_refused_400_protocol_incompatible_with_one_verdict(
    stack: Any, cp: ControlPlane, targets: Targets, endpoint: str, protocol_version: Any, expected: str
) -> None:
    send, secrets = _agent_request(endpoint, targets, protocol_version)
    answers: list[requests.Response] = []

    def send_and_keep() -> requests.Response:
        answers.append(send(cp))
        return answers[-1]

    error = refused(stack, send_and_keep, 400, "protocol_incompatible", secrets=secrets)
    _assert_one_verdict(error, expected, answers[0].text)


@pytest.mark.parametrize("endpoint", AGENT_ENDPOINTS)
def test_agent_endpoint_protocol_version_below_accepted_range_is_refused_400_too_old(
    stack: Any, cp: ControlPlane, targets: Targets, monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    """With the shipped range 1..1 nothing is TOO_OLD; narrow the range to 2..3 in-process."""
    monkeypatch.setitem(versions.ACCEPTED, versions.Component.AGENT, versions.AcceptedRange(oldest=2, newest=3))
    send, secrets = _agent_request(endpoint, targets, 1)
    answers: list[requests.Response] = []

    def send_and_keep() -> requests.Response:
        answers.append(send(cp))
        return answers[-1]

    error = refused(stack, send_and_keep, 400, "protocol_incompatible", secrets=secrets)
    _assert_one_verdict(error, "TOO_OLD", answers[0].text)


# --- heartbeat ---------------------------------------------------------------------------


def _hb(change: Callable[[dict[str, Any]], Any]) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        body = heartbeat_body(2)
        change(body)
        return body

    return build


def _gpu(body: dict[str, Any], **values: Any) -> None:
    body["telemetry"]["gpus"][0].update(values)


BAD_HEARTBEATS = [
    pytest.param(_hb(lambda b: b.pop("agent_version")), "agent_version", id="missing_agent_version"),
    pytest.param(_hb(lambda b: b.pop("health")), "health", id="missing_health"),
    pytest.param(_hb(lambda b: b.pop("telemetry")), "telemetry", id="missing_telemetry"),
    pytest.param(_hb(lambda b: b.update(agent_version="")), "agent_version", id="agent_version_empty"),
    pytest.param(_hb(lambda b: b.update(agent_version="1" * 65)), "agent_version", id="agent_version_65"),
    pytest.param(_hb(lambda b: b.update(agent_version="1.3 beta")), "agent_version", id="agent_version_space"),
    pytest.param(_hb(lambda b: b.update(agent_version=13)), "agent_version", id="agent_version_integer"),
    pytest.param(_hb(lambda b: b.update(health="ok")), "health", id="health_string"),
    pytest.param(_hb(lambda b: b.update(health={})), "status", id="health_missing_status"),
    pytest.param(_hb(lambda b: b.update(health={"status": "great"})), "status", id="health_status_unknown"),
    pytest.param(_hb(lambda b: b.update(health={"status": "OK"})), "status", id="health_status_upper"),
    pytest.param(_hb(lambda b: b.update(health={"status": None})), "status", id="health_status_null"),
    pytest.param(
        _hb(lambda b: b.update(health={"status": "ok", "detail": "d" * 513})), "detail", id="health_detail_513"
    ),
    pytest.param(_hb(lambda b: b.update(health={"status": "ok", "detail": 5})), "detail", id="health_detail_integer"),
    pytest.param(
        _hb(lambda b: b.update(health={"status": "ok", "since": 1})), "unknown field", id="health_unknown_field"
    ),
    pytest.param(_hb(lambda b: b.update(telemetry=[])), "telemetry", id="telemetry_list"),
    pytest.param(_hb(lambda b: b.update(telemetry={})), "gpus", id="telemetry_missing_gpus"),
    pytest.param(_hb(lambda b: b.update(telemetry={"gpus": {}})), "gpus", id="telemetry_gpus_object"),
    pytest.param(_hb(lambda b: b["telemetry"].update(cpu=1)), "unknown field", id="telemetry_unknown_field"),
    pytest.param(_hb(lambda b: b.update(telemetry=gpu_telemetry(65))), "gpus", id="65_gpus"),
    pytest.param(_hb(lambda b: _gpu(b, index=1)), "unique", id="duplicate_gpu_indexes_adjacent"),
    pytest.param(
        _hb(lambda b: b["telemetry"].update(gpus=gpu_telemetry(3)["gpus"] + [gpu_telemetry(1)["gpus"][0]])),
        "unique",
        id="duplicate_gpu_indexes_apart",
    ),
    pytest.param(_hb(lambda b: _gpu(b, index=-1)), "index", id="gpu_index_negative"),
    pytest.param(_hb(lambda b: _gpu(b, index=64)), "index", id="gpu_index_64"),
    pytest.param(_hb(lambda b: _gpu(b, index="0")), "index", id="gpu_index_string"),
    pytest.param(_hb(lambda b: _gpu(b, index=None)), "index", id="gpu_index_null"),
    pytest.param(_hb(lambda b: _gpu(b, utilization_percent=100.1)), "utilization_percent", id="utilization_100.1"),
    pytest.param(_hb(lambda b: _gpu(b, utilization_percent=-0.1)), "utilization_percent", id="utilization_negative"),
    pytest.param(_hb(lambda b: _gpu(b, utilization_percent="50")), "utilization_percent", id="utilization_string"),
    pytest.param(_hb(lambda b: _gpu(b, utilization_percent=True)), "utilization_percent", id="utilization_bool"),
    pytest.param(_hb(lambda b: _gpu(b, memory_used_bytes=-1)), "memory_used_bytes", id="memory_used_negative"),
    pytest.param(_hb(lambda b: _gpu(b, memory_used_bytes=2**63)), "memory_used_bytes", id="memory_used_2_63"),
    pytest.param(_hb(lambda b: _gpu(b, memory_total_bytes=1.5)), "memory_total_bytes", id="memory_total_float"),
    pytest.param(_hb(lambda b: _gpu(b, temperature_celsius=-51)), "temperature_celsius", id="temperature_minus_51"),
    pytest.param(_hb(lambda b: _gpu(b, temperature_celsius=201)), "temperature_celsius", id="temperature_201"),
    pytest.param(_hb(lambda b: _gpu(b, power_watts=-1)), "power_watts", id="power_negative"),
    pytest.param(_hb(lambda b: _gpu(b, power_watts=100001)), "power_watts", id="power_100001"),
    pytest.param(_hb(lambda b: b["telemetry"]["gpus"][0].pop("power_watts")), "power_watts", id="gpu_missing_field"),
    pytest.param(_hb(lambda b: _gpu(b, fan_percent=30)), "unknown field", id="gpu_unknown_field"),
    pytest.param(_hb(lambda b: b["telemetry"]["gpus"].append(7)), "gpus", id="gpu_not_object"),
    pytest.param(_hb(lambda b: b.update(node_id="node_" + "0" * 32)), "unknown field", id="unknown_field"),
]


@pytest.mark.parametrize("build, mentions", BAD_HEARTBEATS)
def test_heartbeat_bad_body_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, targets: Targets, build: Callable[[], Any], mentions: str
) -> None:
    body = build()
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/heartbeat", headers=targets.agent.headers(), json=body),
        400,
        "invalid_request",
        secrets=(targets.agent.credential,),
        mentions=mentions,
    )


@pytest.mark.parametrize(
    "field, literal",
    [
        ("utilization_percent", "NaN"),
        ("temperature_celsius", "NaN"),
        ("power_watts", "NaN"),
        ("utilization_percent", "Infinity"),
        ("temperature_celsius", "-Infinity"),
    ],
)
def test_heartbeat_non_finite_number_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, fresh_agent: AgentIdentity, literal: str, field: str
) -> None:
    """Python's json accepts NaN/Infinity; they are not JSON and must not be stored."""
    body = heartbeat_body(1)
    body["telemetry"]["gpus"][0][field] = "@@NUMBER@@"
    raw = json.dumps(body).replace('"@@NUMBER@@"', literal).encode()
    refused(
        stack,
        lambda: cp.request("POST", "/api/v1/agent/heartbeat", headers={**JSON, **fresh_agent.headers()}, data=raw),
        400,
        None,
        secrets=(fresh_agent.credential,),
    )


# --- node authentication (heartbeat, inventory) ------------------------------------------


def _bearer(credential: str, node_id: str | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {credential}"}
    if node_id is not None:
        headers[NODE_ID_HEADER] = node_id
    return headers


NODE_AUTH_CASES: list[Any] = [
    pytest.param(lambda w, t: {}, "credential_missing", id="no_headers"),
    pytest.param(lambda w, t: {NODE_ID_HEADER: t.agent.node_id}, "credential_missing", id="no_authorization"),
    pytest.param(lambda w, t: _bearer(t.agent.credential, None), "credential_missing", id="no_node_id"),
    pytest.param(
        lambda w, t: {"Authorization": "", NODE_ID_HEADER: t.agent.node_id},
        "credential_missing",
        id="empty_authorization",
    ),
    pytest.param(
        lambda w, t: {**_bearer(t.agent.credential, None), NODE_ID_HEADER: ""}, "credential_missing", id="empty_node_id"
    ),
    pytest.param(
        lambda w, t: {"Authorization": f"Basic {t.agent.credential}", NODE_ID_HEADER: t.agent.node_id},
        "credential_invalid",
        id="basic_scheme",
    ),
    pytest.param(
        lambda w, t: {
            "Authorization": "Basic " + base64.b64encode(f"{t.agent.node_id}:{t.agent.credential}".encode()).decode(),
            NODE_ID_HEADER: t.agent.node_id,
        },
        "credential_invalid",
        id="basic_user_password",
    ),
    pytest.param(
        lambda w, t: {"Authorization": f"Token {t.agent.credential}", NODE_ID_HEADER: t.agent.node_id},
        "credential_invalid",
        id="token_scheme",
    ),
    pytest.param(
        lambda w, t: {"Authorization": t.agent.credential, NODE_ID_HEADER: t.agent.node_id},
        "credential_invalid",
        id="no_scheme",
    ),
    pytest.param(
        lambda w, t: {"Authorization": "Bearer", NODE_ID_HEADER: t.agent.node_id},
        "credential_invalid",
        id="bearer_alone",
    ),
    pytest.param(
        lambda w, t: {"Authorization": f"Bearer Bearer {t.agent.credential}", NODE_ID_HEADER: t.agent.node_id},
        "credential_invalid",
        id="bearer_twice",
    ),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential[:-1], t.agent.node_id), "credential_invalid", id="credential_short"
    ),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential + "A", t.agent.node_id), "credential_invalid", id="credential_long"
    ),
    pytest.param(
        lambda w, t: _bearer("mfn." + "!" * 43, t.agent.node_id), "credential_invalid", id="credential_bad_chars"
    ),
    pytest.param(
        lambda w, t: _bearer("mfi." + t.agent.credential[4:], t.agent.node_id),
        "credential_invalid",
        id="credential_mfi_prefix",
    ),
    pytest.param(
        lambda w, t: _bearer(t.agent.idempotency_key, t.agent.node_id),
        "credential_invalid",
        id="idempotency_key_as_credential",
    ),
    pytest.param(
        lambda w, t: _bearer(t.token, t.agent.node_id), "credential_invalid", id="enrollment_token_as_credential"
    ),
    pytest.param(
        lambda w, t: _bearer(w.admin_token, t.agent.node_id), "credential_invalid", id="admin_token_as_credential"
    ),
    pytest.param(lambda w, t: _bearer(t.agent.credential, "node_xyz"), "credential_invalid", id="node_id_malformed"),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential, (t.agent.node_id or "").upper()),
        "credential_invalid",
        id="node_id_upper",
    ),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential, (t.agent.node_id or "") + "0"), "credential_invalid", id="node_id_long"
    ),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential, t.enrollment_id), "credential_invalid", id="enrollment_id_as_node_id"
    ),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential, f"node_{uuid.uuid4().hex}"), "credential_invalid", id="unknown_node_id"
    ),
    pytest.param(
        lambda w, t: _bearer(credentials.new_node_credential(), t.agent.node_id),
        "credential_invalid",
        id="never_issued_credential",
    ),
    pytest.param(
        lambda w, t: _bearer(w.other.credential, t.agent.node_id), "credential_invalid", id="other_nodes_credential"
    ),
    pytest.param(lambda w, t: _bearer(t.agent.credential, w.other.node_id), "credential_invalid", id="other_nodes_id"),
    pytest.param(
        lambda w, t: _bearer(t.agent.credential, w.revoked_node.node_id),
        "credential_invalid",
        id="revoked_nodes_id_with_other_credential",
    ),
    pytest.param(lambda w, t: w.revoked_node.headers(), "credential_revoked", id="revoked_credential"),
]


def _header_secrets(world: World, targets: Targets, headers: dict[str, str]) -> tuple[str, ...]:
    sent = [value.split(" ")[-1] for name, value in headers.items() if name == "Authorization" and value]
    return tuple(sent) + (
        targets.agent.credential,
        world.other.credential,
        world.revoked_node.credential,
        world.admin_token,
    )


@pytest.mark.parametrize("endpoint", ["heartbeat", "inventory"])
@pytest.mark.parametrize("make_headers, code", NODE_AUTH_CASES)
def test_agent_endpoint_bad_node_credentials_is_refused_401(
    stack: Any,
    cp: ControlPlane,
    world: World,
    targets: Targets,
    endpoint: str,
    make_headers: Callable[[World, Targets], dict[str, str]],
    code: str,
) -> None:
    headers = make_headers(world, targets)
    body = heartbeat_body() if endpoint == "heartbeat" else inventory_body()
    refused(
        stack,
        lambda: cp.request("POST", f"/api/v1/agent/{endpoint}", headers=headers, json=body),
        401,
        code,
        secrets=_header_secrets(world, targets, headers),
    )


# --- list endpoints ----------------------------------------------------------------------


LISTS = [
    pytest.param("/api/v1/admin/node-enrollments", "enrollment_id", id="enrollments"),
    pytest.param("/api/v1/admin/nodes", "node_id", id="nodes"),
]


@pytest.mark.parametrize("path, key", LISTS)
@pytest.mark.parametrize(
    "limit",
    ["0", "101", "-1", "abc", "1.5", "", "1e2", "0x10", "+5", " 5", "5 ", "²", "9" * 5000, "1" + "0" * 400, "true"],
)
def test_list_endpoint_bad_limit_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, admin: dict[str, str], path: str, key: str, limit: str
) -> None:
    refused(
        stack,
        lambda: cp.request("GET", path, headers=admin, params={"limit": limit}),
        400,
        "invalid_request",
        mentions="limit",
    )


def _next_tokens(name: str, path: str, key: str) -> list[Any]:
    other = "node_id" if key == "enrollment_id" else "enrollment_id"
    good_value = ("enr_" if key == "enrollment_id" else "node_") + "0" * 32
    tokens = {
        "not_base64": "!!!!",
        "base64_of_garbage": "abc",
        "non_ascii": "é",
        "long_garbage": "a" * 5000,
        "list": b64([]),
        "empty_object": b64({}),
        "string": b64("x"),
        "null": b64(None),
        "number": b64(1),
        "key_value_string": b64({key: "abc"}),
        "key_value_null": b64({key: None}),
        "key_value_list": b64({key: ["S"]}),
        "key_value_number": b64({key: 5}),
        "key_value_bad_id": b64({key: {"S": "bad"}}),
        "key_value_non_string_id": b64({key: {"S": 123}}),
        "key_value_number_type": b64({key: {"N": "1"}}),
        "other_tables_key": b64({other: {"S": good_value}}),
        "two_keys": b64({key: {"S": good_value}, "x": {"S": "y"}}),
        "id_with_newline": b64({key: {"S": good_value + "\n"}}),
    }
    return [pytest.param(path, token, id=f"{token_id}-{name}") for token_id, token in tokens.items()]


@pytest.mark.parametrize(
    "path, next_token",
    _next_tokens("enrollments", "/api/v1/admin/node-enrollments", "enrollment_id")
    + _next_tokens("nodes", "/api/v1/admin/nodes", "node_id"),
)
def test_list_endpoint_bad_next_token_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, admin: dict[str, str], path: str, next_token: str
) -> None:
    refused(
        stack,
        lambda: cp.request("GET", path, headers=admin, params={"next_token": next_token}),
        400,
        "invalid_request",
        mentions="next_token",
    )


@pytest.mark.parametrize("path, key", LISTS)
@pytest.mark.parametrize("params", [{"x": "1"}, {"Limit": "5"}, {"nextToken": "x"}, {"page": "2"}, {"x": ""}])
def test_list_endpoint_unknown_query_parameter_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, admin: dict[str, str], path: str, key: str, params: dict[str, str]
) -> None:
    refused(
        stack,
        lambda: cp.request("GET", path, headers=admin, params={"limit": "5", **params}),
        400,
        "invalid_request",
        mentions="unknown query parameter",
    )


# --- ids that do not exist ---------------------------------------------------------------


def _unknown_ids(prefix: str, other: str) -> list[Any]:
    return [
        pytest.param(f"{prefix}{uuid.uuid4().hex}", id="well_formed_unknown"),
        pytest.param("x", id="junk"),
        pytest.param(f"{prefix}{'G' * 32}", id="not_hex"),
        pytest.param(f"{prefix}{'A' * 32}", id="upper_hex"),
        pytest.param(f"{prefix}{'0' * 33}", id="too_long"),
        pytest.param(f"{other}{'0' * 32}", id="other_kind_of_id"),
        pytest.param("a" * 2000, id="very_long"),
        pytest.param("%20", id="encoded_space"),
    ]


@pytest.mark.parametrize("enrollment_id", _unknown_ids("enr_", "node_"))
@pytest.mark.parametrize("action", ["get", "revoke"])
def test_enrollment_unknown_id_is_refused_404_enrollment_not_found(
    stack: Any, cp: ControlPlane, admin: dict[str, str], enrollment_id: str, action: str
) -> None:
    path = f"/api/v1/admin/node-enrollments/{enrollment_id}" + ("/revoke" if action == "revoke" else "")
    refused(
        stack,
        lambda: cp.request("GET" if action == "get" else "POST", path, headers=admin),
        404,
        "enrollment_not_found",
    )


@pytest.mark.parametrize("node_id", _unknown_ids("node_", "enr_"))
@pytest.mark.parametrize("action", ["get", "revoke_credential"])
def test_node_unknown_id_is_refused_404_node_not_found(
    stack: Any, cp: ControlPlane, admin: dict[str, str], node_id: str, action: str
) -> None:
    path = f"/api/v1/admin/nodes/{node_id}" + ("/revoke-credential" if action == "revoke_credential" else "")
    refused(
        stack,
        lambda: cp.request("GET" if action == "get" else "POST", path, headers=admin),
        404,
        "node_not_found",
    )


@pytest.mark.parametrize("endpoint", ["get_enrollment", "get_node"])
@pytest.mark.parametrize("params", [{"x": "1"}, {"limit": "1"}, {"include": "token"}])
def test_get_by_id_unknown_query_parameter_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, world: World, targets: Targets, endpoint: str, params: dict[str, str]
) -> None:
    call = call_for(endpoint, targets, world.admin_token)
    refused(stack, lambda: call.send(cp, params=params), 400, "invalid_request", mentions="unknown query parameter")


# --- revoking what cannot be revoked -----------------------------------------------------


def test_revoke_enrollment_twice_is_refused_409_enrollment_revoked(
    stack: Any, cp: ControlPlane, admin: dict[str, str]
) -> None:
    minted = cp.mint(display_name="revoke twice")
    path = f"/api/v1/admin/node-enrollments/{minted['enrollment_id']}/revoke"
    first = cp.request("POST", path, headers=admin)
    assert first.status_code == 200, first.text
    refused(
        stack, lambda: cp.request("POST", path, headers=admin), 409, "enrollment_revoked", secrets=(minted["token"],)
    )


def test_revoke_enrollment_consumed_is_refused_409_enrollment_consumed(
    stack: Any, cp: ControlPlane, admin: dict[str, str], world: World
) -> None:
    path = f"/api/v1/admin/node-enrollments/{world.consumed['enrollment_id']}/revoke"
    refused(
        stack,
        lambda: cp.request("POST", path, headers=admin),
        409,
        "enrollment_consumed",
        secrets=(world.consumed["token"],),
    )


def test_revoke_credential_twice_is_refused_409_credential_already_revoked(
    stack: Any, cp: ControlPlane, admin: dict[str, str]
) -> None:
    identity = cp.enrolled_node(display_name="revoke credential twice")
    path = f"/api/v1/admin/nodes/{identity.node_id}/revoke-credential"
    first = cp.request("POST", path, headers=admin)
    assert first.status_code == 200, first.text
    refused(
        stack,
        lambda: cp.request("POST", path, headers=admin),
        409,
        "credential_already_revoked",
        secrets=(identity.credential,),
    )


# --- public endpoints --------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({}, id="component_missing"),
        pytest.param({"component": ""}, id="component_empty"),
        pytest.param({"component": "AGENT"}, id="component_upper"),
        pytest.param({"component": "runtime"}, id="component_unknown"),
        pytest.param({"component": "agent "}, id="component_trailing_space"),
        pytest.param({"component": "agent,worker"}, id="component_list"),
        pytest.param({"protocol_version": "1"}, id="only_protocol_version"),
    ],
)
def test_compatibility_bad_component_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, params: dict[str, str]
) -> None:
    refused(
        stack,
        lambda: cp.request("GET", "/api/v1/compatibility", params=params),
        400,
        "invalid_request",
        mentions="component",
    )


@pytest.mark.parametrize(
    "params",
    [
        {"component": "agent", "x": "1"},
        {"component": "agent", "version": "1"},
        {"component": "agent", "Component": "agent"},
    ],
)
def test_compatibility_unknown_query_parameter_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, params: dict[str, str]
) -> None:
    refused(
        stack,
        lambda: cp.request("GET", "/api/v1/compatibility", params=params),
        400,
        "invalid_request",
        mentions="unknown query parameter",
    )


@pytest.mark.parametrize("component", ["agent", "worker"])
@pytest.mark.parametrize("version", ["abc", "-1", "1.0", "", "0x1", "9" * 5000, "²"])
def test_compatibility_junk_protocol_version_answers_unknown_not_an_error(
    cp: ControlPlane, component: str, version: str
) -> None:
    """Junk in the query is judged UNKNOWN (the designed answer), never a 5xx."""
    response = cp.request("GET", "/api/v1/compatibility", params={"component": component, "protocol_version": version})
    assert response.status_code == 200, f"{response.status_code} {response.text[:300]}"
    assert response.json()["verdict"] == "UNKNOWN"


@pytest.mark.parametrize("query", ["x=1", "x", "status=ok", "verbose=true&x=2", "release=1.3.0"])
def test_health_unknown_query_parameter_is_refused_400_invalid_request(
    stack: Any, cp: ControlPlane, query: str
) -> None:
    refused(
        stack,
        lambda: cp.request("GET", f"/api/v1/health?{query}"),
        400,
        "invalid_request",
        mentions="unknown query parameter",
    )
