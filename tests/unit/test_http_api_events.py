"""The nodes' routes work behind an API Gateway HTTP API with payload format 1.0: the real app
(functions/app.py, over the in-memory stores) answers events shaped as AWS documents and sends them.

The shape is AWS's "Working with AWS Lambda proxy integrations for HTTP APIs" (format 1.0), with
the fields as HTTP APIs fill them for a route with parameters: ``resource`` and
``requestContext.resourcePath`` hold the route's path with its ``{parameters}`` (no stage),
``requestContext.resourceId`` its route key (``POST /api/...``), ``path`` the request's path,
``pathParameters`` the values, ``stageVariables`` null, ``body`` null when the request has none.
Header names come as the client sent them (AWS adds ``Host``, ``X-Forwarded-*`` capitalised; the
current guide's example lowercases all): both spellings are tested. Chalice reads
``requestContext.resourcePath``, ``requestContext.httpMethod``, ``headers``,
``multiValueQueryStringParameters``, ``pathParameters``, ``stageVariables``, ``body`` and
``isBase64Encoded`` (``chalice.app.Request``), all of which format 1.0 carries; format 2.0 has no
``resourcePath``, which is why the integration is 1.0 (the last test shows 2.0 failing).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from chalicelib import instance
from modelforge_local_stack.http_server import load_app
from modelforge_local_stack.infra_routes import Route, node_routes
from modelforge_protocol.credentials import ADMIN_TOKEN_HEADER, NODE_ID_HEADER

from tests.support.memory_stores import MemoryStores, memory_stores
from tests.unit.service_bodies import AgentIdentity, cpu_inventory, enroll_body, heartbeat_body, settings_with

ADMIN_TOKEN = secrets.token_urlsafe(32)
API_ID = "a1b2c3d4e5"
DOMAIN = f"{API_ID}.execute-api.us-east-1.amazonaws.com"
#: what an HTTP API Lambda integration must answer in format 1.0
RESPONSE_FIELDS = {"isBase64Encoded", "statusCode", "headers", "multiValueHeaders", "body"}
app_module = load_app()


@pytest.fixture()
def stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryStores]:
    """The app's instance over in-memory stores, with a known admin token."""
    stores = memory_stores()
    settings = settings_with(MODELFORGE_ADMIN_TOKEN_SHA256=hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest())
    monkeypatch.setattr(instance, "_instance", instance.Instance(settings=settings, stores=stores))
    yield stores


def http_api_event(
    method: str,
    route: str,
    *,
    path_parameters: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    base64_body: bool = False,
    query: dict[str, list[str]] | None = None,
    lowercase_headers: bool = False,
) -> dict[str, Any]:
    """An HTTP API payload 1.0 event for ``method route`` on the ``$default`` stage."""
    path = route
    for name, value in (path_parameters or {}).items():
        path = path.replace("{" + name + "}", value)
    sent = {
        # what API Gateway adds, capitalised as in events it delivers
        "Content-Length": str(len(body or b"")),
        "Host": DOMAIN,
        "X-Amzn-Trace-Id": "Root=1-66abaa79-20e2acd0599ba1fe21814507",
        "X-Forwarded-For": "198.51.100.7",
        "X-Forwarded-Port": "443",
        "X-Forwarded-Proto": "https",
        # what the agent sends (requests spells them this way)
        "User-Agent": "python-requests/2.32.3",
        "Accept-Encoding": "gzip, deflate",
        "Accept": "*/*",
        **({"Content-Type": "application/json"} if body is not None else {}),
        **(headers or {}),
    }
    if lowercase_headers:
        sent = {name.lower(): value for name, value in sent.items()}
    encoded: str | None = None
    if body is not None:
        encoded = base64.b64encode(body).decode() if base64_body else body.decode()
    return {
        "version": "1.0",
        "resource": route,
        "path": path,
        "httpMethod": method,
        "headers": sent,
        "multiValueHeaders": {name: [value] for name, value in sent.items()},
        "queryStringParameters": {name: values[-1] for name, values in query.items()} if query else None,
        "multiValueQueryStringParameters": query or None,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": API_ID,
            "authorizer": {"claims": None, "scopes": None},
            "domainName": DOMAIN,
            "domainPrefix": API_ID,
            "extendedRequestId": "b1eTFgYfIAMEcKg=",
            "httpMethod": method,
            "identity": {
                "accessKey": None,
                "accountId": None,
                "caller": None,
                "cognitoAmr": None,
                "cognitoAuthenticationProvider": None,
                "cognitoAuthenticationType": None,
                "cognitoIdentityId": None,
                "cognitoIdentityPoolId": None,
                "principalOrgId": None,
                "sourceIp": "198.51.100.7",
                "user": None,
                "userAgent": sent.get("User-Agent") or sent.get("user-agent"),
                "userArn": None,
            },
            "path": path,
            "protocol": "HTTP/1.1",
            "requestId": "b1eTFgYfIAMEcKg=",
            "requestTime": "01/Aug/2024:15:32:09 +0000",
            "requestTimeEpoch": 1722526329808,
            "resourceId": f"{method} {route}",
            "resourcePath": route,
            "stage": "$default",
        },
        "pathParameters": path_parameters or None,
        "stageVariables": None,
        "body": encoded,
        "isBase64Encoded": base64_body,
    }


def invoke(event: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    """Lambda's call of the API function (handler ``app.app``): status, headers, decoded body."""
    answer = app_module.app(event, None)
    assert set(answer) <= RESPONSE_FIELDS and {"statusCode", "body"} <= set(answer), answer
    assert isinstance(answer["body"], str) and not answer.get("isBase64Encoded", False)
    return answer["statusCode"], answer["headers"], json.loads(answer["body"]) if answer["body"] else None


def admin(method: str, route: str, body: dict[str, Any] | None = None, **path_parameters: str) -> Any:
    """An admin call (the REST API's event: the same proxy shape, stage ``api``, no ``version``)."""
    event = http_api_event(
        method,
        route,
        path_parameters=path_parameters or None,
        headers={ADMIN_TOKEN_HEADER: ADMIN_TOKEN},
        body=json.dumps(body).encode() if body is not None else None,
    )
    del event["version"]
    event["requestContext"]["stage"] = "api"
    status, _, answer = invoke(event)
    assert status in (200, 201), answer
    return answer


def node_call(
    identity: AgentIdentity, route: str, body: dict[str, Any] | None, **options: Any
) -> tuple[int, dict[str, str], Any]:
    headers = {"Authorization": f"Bearer {identity.credential}", NODE_ID_HEADER: identity.node_id or ""}
    raw = json.dumps(body).encode() if body is not None else None
    return invoke(http_api_event("POST", route, headers=headers, body=raw, **options))


def enrolled(capabilities: list[str] | None = None) -> AgentIdentity:
    token = admin("POST", "/api/v1/admin/node-enrollments", {"display_name": "GPU Node", "expires_in_seconds": 900})[
        "token"
    ]
    identity = AgentIdentity()
    inventory = {**cpu_inventory(), "capabilities": capabilities or ["cpu"]}
    body = json.dumps(enroll_body(token, identity, inventory=inventory)).encode()
    status, _, answer = invoke(http_api_event("POST", "/api/v1/agent/enroll", body=body))
    assert status == 201, answer
    identity.node_id = answer["node_id"]
    return identity


def test_enroll_through_an_http_api_event_creates_the_node(stores: MemoryStores) -> None:
    identity = enrolled()
    status, headers, answer = node_call(identity, "/api/v1/agent/heartbeat", heartbeat_body())
    assert status == 200 and answer["node_id"] == identity.node_id and answer["status"] == "online"
    assert stores.nodes.get(identity.node_id) is not None


def test_heartbeat_with_lowercased_headers_and_a_base64_body_is_recorded(stores: MemoryStores) -> None:
    identity = enrolled()
    status, _, answer = node_call(
        identity, "/api/v1/agent/heartbeat", heartbeat_body(), base64_body=True, lowercase_headers=True
    )
    assert status == 200, answer
    node = stores.nodes.get(identity.node_id or "")
    assert node is not None and node.liveness == "online" and node.last_heartbeat_at is not None


def test_a_claim_with_no_body_and_no_work_answers_204_with_an_empty_body(stores: MemoryStores) -> None:
    identity = enrolled()
    node_call(identity, "/api/v1/agent/heartbeat", heartbeat_body())
    event = http_api_event(
        "POST",
        "/api/v1/agent/work/claim",
        headers={"Authorization": f"Bearer {identity.credential}", NODE_ID_HEADER: identity.node_id or ""},
    )
    assert event["body"] is None and event["headers"]["Content-Length"] == "0"
    answer = app_module.app(event, None)
    assert answer["statusCode"] == 204 and answer["body"] == ""


def test_a_lease_route_reads_its_work_id_from_the_path_parameters(stores: MemoryStores) -> None:
    identity = enrolled(["cpu", "diagnostic.echo"])
    node_call(identity, "/api/v1/agent/heartbeat", heartbeat_body())
    submitted = admin("POST", "/api/v1/admin/work", {"capability": "diagnostic.echo", "input": {"say": "hi"}})
    status, _, claimed = node_call(identity, "/api/v1/agent/work/claim", {})
    assert status == 200 and claimed["work_id"] == submitted["work_id"]

    route = "/api/v1/agent/work/{work_id}/renew"
    status, _, lease = node_call(
        identity, route, {"epoch": claimed["epoch"]}, path_parameters={"work_id": claimed["work_id"]}
    )
    assert status == 200 and lease["work_id"] == claimed["work_id"] and lease["status"] == "leased"

    failed_route = "/api/v1/agent/work/{work_id}/fail"
    body = {"epoch": claimed["epoch"], "reason": "the worker stopped", "retryable": False}
    status, _, lease = node_call(
        identity, failed_route, body, path_parameters={"work_id": claimed["work_id"]}, base64_body=True
    )
    assert status == 200 and lease["status"] == "dead"
    other = "work_" + "0" * 32
    status, _, refused = node_call(identity, route, {"epoch": 1}, path_parameters={"work_id": other})
    assert status == 404 and set(refused["error"]) >= {"code", "message"}


def test_query_parameters_arrive_from_the_multi_value_field(stores: MemoryStores) -> None:
    identity = enrolled()
    status, _, refused = node_call(identity, "/api/v1/agent/heartbeat", heartbeat_body(), query={"debug": ["1"]})
    assert status == 400 and "debug" in refused["error"]["message"]


@pytest.mark.parametrize("route", node_routes(), ids=lambda route: route.key)
def test_every_node_route_reaches_its_view_through_its_route_key(stores: MemoryStores, route: Route) -> None:
    """An unauthenticated call is the view's own JSON refusal (401, or 400 for enroll's missing
    body), never Chalice's "Unknown request" 500 or a method refusal: resourcePath matched."""
    parameters = {name.strip("{}"): "work_" + "0" * 32 for name in route.path.split("/") if name.startswith("{")}
    status, _, refused = invoke(http_api_event(route.method, route.path, path_parameters=parameters or None))
    assert status in (400, 401), refused
    assert set(refused["error"]) >= {"code", "message"}


def test_payload_format_2_0_would_not_reach_the_app(stores: MemoryStores) -> None:
    """The reason for 1.0: Chalice routes by requestContext.resourcePath, which 2.0 lacks."""
    event = {
        "version": "2.0",
        "routeKey": "POST /api/v1/agent/heartbeat",
        "rawPath": "/api/v1/agent/heartbeat",
        "rawQueryString": "",
        "headers": {"content-type": "application/json"},
        "requestContext": {"http": {"method": "POST", "path": "/api/v1/agent/heartbeat"}, "stage": "$default"},
        "body": "{}",
        "isBase64Encoded": False,
    }
    answer = app_module.app(event, None)
    assert answer["statusCode"] == 500
