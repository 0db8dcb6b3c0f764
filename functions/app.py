"""ModelForge control plane: the Chalice app behind API Gateway.

Each route is declared once: ``@endpoint(operations.NAME)`` registers the view at its operation's method and path, and
the OpenAPI document is built from those operations (``chalicelib/api/operations.py``). Routes parse a typed request
(``chalicelib/domain/requests.py``), call a service and shape the answer (``chalicelib/api/views.py``); domain errors
become JSON answers in one place (``chalicelib/api/error_answers.py``), and nothing else reaches the caller.
Cold start: this module imports the edge, the stores and the auth check; each route imports its services, views and
typed requests in its body, so an instance loads only what the requests it serves need
(``tests/unit/test_cold_start_imports.py``; ``bench/cold_start.py``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from chalice import Chalice, Rate, Response
from chalicelib import instance
from chalicelib.api import access_log, console, operations, paging
from chalicelib.api.error_answers import answer_errors, http_status
from chalicelib.api.operation import Operation, declare, declared
from chalicelib.config.settings import SettingsError
from chalicelib.domain.errors import invalid_request
from chalicelib.domain.validation import ascii_int, parse_json_object, validate, validate_query
from chalicelib.services.auth import require_admin, require_node
from modelforge_protocol import work as work_protocol
from modelforge_protocol.schemas import MAX_BODY_BYTES
from modelforge_protocol.versions import (
    AGENT_PROTOCOL_VERSION,
    CONTROL_PLANE_RELEASE,
    WORKER_PROTOCOL_VERSION,
    Component,
    next_step,
    parse_query_protocol_version,
    verdict,
)

app = Chalice(app_name="modelforge-control-plane")
app.debug = False
#: the push channel: Chalice's WebSocket handlers (channel_connect, channel_message, channel_disconnect)
app.experimental_feature_flags.update({"WEBSOCKETS"})
log = logging.getLogger("modelforge.api")

#: Replaced at deploy time by the outbox table's stream ARN (infra/resources.json).
OUTBOX_STREAM_ARN_PLACEHOLDER = (
    "arn:aws:dynamodb:us-east-1:000000000000:table/modelforge-outbox/stream/replaced-at-deploy"
)
MAX_PAGE = paging.MAX_PAGE


def _now() -> float:
    return time.time()


def endpoint(operation: Operation, *, wrap_errors: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the view as the route of ``operation`` (its method and path), carrying the operation
    for the OpenAPI document: the one declaration of a route. ``wrap_errors=False`` (the console's
    static files) leaves failures to Chalice, as those routes always have."""

    def register(view: Callable[..., Any]) -> Callable[..., Any]:
        handler = declare(answer_errors(view) if wrap_errors else view, operation)
        return app.route(operation.path, methods=[operation.method], content_types=["application/json"])(handler)

    return register


app.register_middleware(access_log.access_log, "http")


def _request() -> Any:
    return app.current_request


def _body(max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The JSON body of a POST (empty counts as ``{}`` where the operation says the body is optional);
    POST endpoints take no query parameters."""
    _query()
    return parse_json_object(_request().raw_body, allow_empty=_served().body_optional, max_bytes=max_bytes)


def _admin() -> instance.Instance:
    inst = instance.get()
    require_admin(_request().headers, inst.settings.admin_token_sha256)
    return inst


def _served() -> Operation:
    """The operation of the route that took this request (``endpoint`` registered it)."""
    request = _request()
    operation = declared(app.routes[request.context["resourcePath"]][request.method].view_function)
    assert operation is not None, "every route is registered by endpoint()"
    return operation


def _query() -> dict[str, str]:
    """The request's query parameters, refused unless the route's operation declares each."""
    return validate_query(_request().query_params, _served().query_names())


def _page_params(key_name: str) -> tuple[int, dict | None]:
    params = _query()
    limit = ascii_int(params.get("limit", str(MAX_PAGE)), 1, MAX_PAGE)
    if limit is None:
        raise invalid_request(f"limit must be an integer from 1 to {MAX_PAGE}")
    return limit, paging.decode(params.get("next_token"), key_name)


# --- public ------------------------------------------------------------------------------


@endpoint(operations.GET_HEALTH)
def health() -> dict[str, Any]:
    _query()
    versions = {"agent_protocol_version": AGENT_PROTOCOL_VERSION, "worker_protocol_version": WORKER_PROTOCOL_VERSION}
    return {"status": "ok", "release": CONTROL_PLANE_RELEASE, **versions}


@endpoint(operations.GET_COMPATIBILITY)
def compatibility() -> dict[str, Any]:
    from chalicelib.api import views

    params = _query()
    names = [component.value for component in Component]
    if params.get("component") not in names:
        raise invalid_request(f"component must be one of {', '.join(names)}")
    component = Component(params["component"])
    judged = verdict(component, parse_query_protocol_version(params.get("protocol_version")))
    return {
        "component": component.value,
        "verdict": judged.value,
        "next_step": next_step(component, judged),
        "accepted_protocol_versions": views.accepted_versions(component),
    }


@endpoint(operations.GET_OPEN_API)
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of this API (built on the first request for it, not at cold start)."""
    _query()
    from chalicelib.api import openapi

    return openapi.document(app.routes)


# --- admin: enrollments ------------------------------------------------------------------


@endpoint(operations.CREATE_ENROLLMENT)
def create_enrollment() -> Response:
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import enrollments

    inst = _admin()
    now = _now()
    minted = enrollments.create(inst.stores, requests.create_enrollment(_body()), now)
    body = {**views.enrollment(minted.enrollment, now), "token": minted.token}
    return Response(body=body, status_code=201)


@endpoint(operations.LIST_ENROLLMENTS)
def list_enrollments() -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import listing

    inst = _admin()
    limit, start = _page_params("enrollment_id")
    page = listing.enrollments(inst.stores, limit, start)
    now = _now()
    return {
        "enrollments": [views.enrollment(item, now) for item in page.items],
        "next_token": paging.encode(page.last_key),
    }


@endpoint(operations.GET_ENROLLMENT)
def get_enrollment(enrollment_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import enrollments

    inst = _admin()
    _query()
    return views.enrollment(enrollments.get(inst.stores, enrollment_id), _now())


@endpoint(operations.REVOKE_ENROLLMENT)
def revoke_enrollment(enrollment_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import enrollments

    inst = _admin()
    validate(_body(), "EMPTY")
    now = _now()
    return views.enrollment(enrollments.revoke(inst.stores, enrollment_id, now), now)


@endpoint(operations.CHECK_NODE_AGENT_SETTINGS)
def check_node_agent_settings() -> dict[str, Any]:
    """The Enroll node wizard's check: what is wrong with its choices, or the node's .env settings."""
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import node_agent_settings

    _admin()
    return views.node_agent_settings(node_agent_settings.check(requests.node_agent_settings(_body())))


# --- admin: nodes ------------------------------------------------------------------------


@endpoint(operations.LIST_NODES)
def list_nodes() -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import listing

    inst = _admin()
    limit, start = _page_params("node_id")
    page = listing.nodes(inst.stores, limit, start)
    now = _now()
    return {
        "nodes": [views.node(details, inst.settings, now) for details in page.items],
        "next_token": paging.encode(page.last_key),
    }


@endpoint(operations.GET_NODE)
def get_node(node_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import listing

    inst = _admin()
    _query()
    return views.node(listing.node(inst.stores, node_id), inst.settings, _now())


@endpoint(operations.GET_NODE_READINESS)
def node_readiness(node_id: str) -> dict[str, Any]:
    """Readiness of the exact node an enrollment produced (its enrollment id is accepted too)."""
    from chalicelib.api import views
    from chalicelib.services import readiness

    inst = _admin()
    _query()
    now = _now()
    return views.readiness(readiness.check(inst.stores, inst.settings, node_id, now), now)


@endpoint(operations.REVOKE_NODE_CREDENTIAL)
def revoke_node_credential(node_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import listing, nodes

    inst = _admin()
    validate(_body(), "EMPTY")
    now = _now()
    node = nodes.revoke_credential(inst.stores, node_id, now)
    return views.node(listing.with_inventory(inst.stores, node), inst.settings, now)


@endpoint(operations.DELETE_NODE)
def delete_node(node_id: str) -> dict[str, Any]:
    from chalicelib.services import node_removal

    inst, _ = _admin(), _query()
    return {**vars(node_removal.delete(inst.stores, inst.settings, node_id, _now())), "deleted": True}


def _node_answer(inst: instance.Instance, node_id: str, now: float) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import listing, nodes

    return views.node(listing.with_inventory(inst.stores, nodes.get(inst.stores, node_id)), inst.settings, now)


def _drain(node_id: str, drained: bool) -> dict[str, Any]:
    from chalicelib.services import gpu_health

    inst = _admin()
    body = _body()
    validate(body, "DRAIN")
    now = _now()
    gpu_health.drain(inst.stores, node_id, body.get("gpu_uuid"), drained, now)
    return _node_answer(inst, node_id, now)


@endpoint(operations.DRAIN_NODE)
def drain_node(node_id: str) -> dict[str, Any]:
    return _drain(node_id, True)


@endpoint(operations.UNDRAIN_NODE)
def undrain_node(node_id: str) -> dict[str, Any]:
    return _drain(node_id, False)


@endpoint(operations.CLEAR_GPU_FAULT)
def clear_gpu_fault(node_id: str, gpu_uuid: str) -> dict[str, Any]:
    from chalicelib.services import gpu_health

    inst = _admin()
    validate(_body(), "EMPTY")
    now = _now()
    gpu_health.clear(inst.stores, node_id, gpu_uuid, now)
    return _node_answer(inst, node_id, now)


@endpoint(operations.ACCEPT_NODE_GPUS)
def accept_node_gpus(node_id: str) -> dict[str, Any]:
    from chalicelib.services import gpu_health

    inst = _admin()
    validate(_body(), "EMPTY")
    now = _now()
    gpu_health.accept_gpus(inst.stores, node_id, now)
    return _node_answer(inst, node_id, now)


# --- agents ------------------------------------------------------------------------------


@endpoint(operations.ENROLL)
def enroll() -> Response:
    from chalicelib.api import channel_edge, views
    from chalicelib.domain import requests
    from chalicelib.services import enrollments

    inst = instance.get()
    enrolled = enrollments.enroll(inst.stores, inst.settings, requests.enroll(_body()), _now())
    answer = {
        "node_id": enrolled.node.node_id,
        "enrollment_id": enrolled.node.enrollment_id,
        "display_name": enrolled.node.display_name,
        "production_eligible": enrolled.node.production_eligible,
        "heartbeat_interval_seconds": inst.settings.answer_interval(channel_connected=False),
        "replayed": enrolled.replayed,
        "auth": views.node_auth_hint(),
        **channel_edge.channel_answer(inst.settings, enrolled.ticket),
    }
    return Response(body=answer, status_code=200 if enrolled.replayed else 201)


@endpoint(operations.HEARTBEAT)
def heartbeat() -> dict[str, Any]:
    from chalicelib.api import agent_answer, channel_edge
    from chalicelib.domain import requests
    from chalicelib.services import nodes

    inst = instance.get()
    caller = require_node(_request().headers)
    now = _now()
    result = nodes.heartbeat(inst.stores, inst.settings, caller, requests.heartbeat(_body()), now, inst.known_callers)
    drained = result.gpu is not None and result.gpu.drained
    waiting = not drained and inst.work_hint.waiting(result.node.capabilities or (), inst.stores.work.any_queued, now)
    return {
        "node_id": caller.node_id,
        "status": result.node.liveness,
        "heartbeat_interval_seconds": inst.settings.answer_interval(result.node.channel_connection_id is not None),
        "work_waiting": waiting,
        **channel_edge.channel_answer(inst.settings, result.ticket),
        **agent_answer.gpu_answer(result.gpu),
    }


@endpoint(operations.REPLACE_INVENTORY)
def replace_inventory() -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import nodes

    inst = instance.get()
    caller = require_node(_request().headers)
    request = requests.replace_inventory(_body())
    inventory = nodes.replace_inventory(inst.stores, inst.settings, caller, request, _now())
    return {"node_id": caller.node_id, "inventory": views.inventory(inventory)}


# --- work ----------------------------------------------------------------------------------


@endpoint(operations.SUBMIT_WORK)
def submit_work() -> Response:
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import work

    inst = _admin()
    request = requests.submit_work(_body(max_bytes=work_protocol.MAX_SUBMIT_BODY_BYTES))
    submitted = work.submit(inst.stores, request, _now())
    return Response(body=views.work_of(inst.stores, submitted.item), status_code=201 if submitted.created else 200)


@endpoint(operations.LIST_WORK)
def list_work() -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import listing

    inst = _admin()
    params = _query()
    status, capability = params.get("status"), params.get("capability")
    if status is not None and status not in work_protocol.WORK_STATES:
        raise invalid_request(f"status must be one of {', '.join(work_protocol.WORK_STATES)}")
    if capability is not None and capability not in work_protocol.CAPABILITIES:
        raise invalid_request(f"capability must be one of {', '.join(work_protocol.CAPABILITIES)}")
    limit, start = _page_params("work_id")
    page = listing.work(inst.stores, limit, start, status, capability)
    return {"work": [views.work_item(shown) for shown in page.items], "next_token": paging.encode(page.last_key)}


@endpoint(operations.GET_WORK)
def get_work(work_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import work

    inst = _admin()
    _query()
    return views.work_of(inst.stores, work.get(inst.stores, work_id))


@endpoint(operations.GET_WORK_INPUT)
def get_work_input(work_id: str) -> Response:
    return _work_object(work_id, "input")


@endpoint(operations.GET_WORK_RESULT)
def get_work_result(work_id: str) -> Response:
    return _work_object(work_id, "result")


def _work_object(work_id: str, part: str) -> Response:
    from chalicelib.services import work_objects

    inst = _admin()
    _query()
    read = work_objects.read_input if part == "input" else work_objects.read_result
    return Response(body=read(inst.stores, work_id), status_code=200, headers={"Content-Type": "application/json"})


@endpoint(operations.CANCEL_WORK)
def cancel_work(work_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.services import work

    inst = _admin()
    validate(_body(), "EMPTY")
    return views.work_of(inst.stores, work.cancel(inst.stores, work_id, _now()))


# --- the web console (static files; it calls the admin API above from the same origin) ----


@endpoint(operations.GET_ROOT, wrap_errors=False)
def root() -> Response:
    return console.root_answer()


@endpoint(operations.GET_CONSOLE, wrap_errors=False)
def console_page() -> Response:
    return console.page_answer(str(_request().context.get("path", "")))


@endpoint(operations.GET_CONSOLE_FILE, wrap_errors=False)
def console_asset(name: str) -> Response:
    return console.file_answer(console.find(name))


# --- agents: work --------------------------------------------------------------------------


@endpoint(operations.CLAIM_WORK)
def claim_work() -> Response:
    from chalicelib.api import views
    from chalicelib.services import work

    inst = instance.get()
    caller = require_node(_request().headers)
    validate(_body(), "EMPTY")
    claimed = work.claim(inst.stores, inst.settings, caller, _now(), inst.known_callers, inst.queue_fronts)
    if claimed is None:
        return Response(body="", status_code=204)
    return Response(body=views.work_claim(claimed.item, claimed.input_url, claimed.result_upload_url), status_code=200)


@endpoint(operations.RENEW_LEASE)
def renew_work(work_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import work

    inst = instance.get()
    caller = require_node(_request().headers)
    return views.lease(
        work.renew(inst.stores, caller, work_id, requests.renew_work(_body()), _now(), inst.known_callers)
    )


@endpoint(operations.COMPLETE_WORK)
def complete_work(work_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import work

    inst = instance.get()
    caller = require_node(_request().headers)
    request = requests.complete_work(_body())
    return views.lease(work.complete(inst.stores, caller, work_id, request, _now(), inst.known_callers))


@endpoint(operations.FAIL_WORK)
def fail_work(work_id: str) -> dict[str, Any]:
    from chalicelib.api import views
    from chalicelib.domain import requests
    from chalicelib.services import work

    inst = instance.get()
    caller = require_node(_request().headers)
    return views.lease(work.fail(inst.stores, caller, work_id, requests.fail_work(_body()), _now(), inst.known_callers))


# --- the push channel (API Gateway WebSocket API: $connect, $default, $disconnect) ---------


@app.on_ws_connect()
def channel_connect(event: Any) -> dict[str, Any]:
    """Accept a node's channel when its headers carry its unexpired, unused ticket (else 401/403)."""
    from chalicelib.api import channel_edge
    from chalicelib.services import channel

    def connect() -> str:
        inst = instance.get()
        return channel.connect(inst.stores, inst.settings, channel_edge.headers(event), event.connection_id, _now())

    return channel_edge.run("channel_connected", connect, http_status)


@app.on_ws_message()
def channel_message(event: Any) -> dict[str, Any]:
    """An agent's message: a ``ping`` keeps the connection open; anything else is refused and logged."""
    from chalicelib.api import channel_edge
    from chalicelib.services import channel

    return channel_edge.run("channel_message", lambda: channel.read_message(event.body), http_status)


@app.on_ws_disconnect()
def channel_disconnect(event: Any) -> dict[str, Any]:
    """Forget the connection on its node, if it is still the node's."""
    from chalicelib.api import channel_edge
    from chalicelib.services import channel

    return channel_edge.run(
        "channel_disconnected", lambda: channel.disconnect(instance.get().stores, event.connection_id), http_status
    )


# --- scheduled and stream functions ------------------------------------------------------


class ConfigurationInvalid(RuntimeError):
    """A scheduled or stream function refused to run: the message names the bad variables."""


def _instance_or_refuse() -> instance.Instance:
    """For non-HTTP functions: fail the invocation with one clear line, not a traceback."""
    try:
        return instance.get()
    except SettingsError as error:
        log.error("configuration invalid", extra={"event": "configuration_invalid", "problems": error.problems})
        raise ConfigurationInvalid(str(error)) from None


@app.schedule(Rate(1, unit=Rate.MINUTES), name="liveness_sweep")
def liveness_sweep(event: Any) -> dict[str, int]:
    from chalicelib.services import sweep

    inst = _instance_or_refuse()
    report = sweep.report_dict(sweep.run(inst.stores, inst.settings, _now()))
    log.info("sweep finished", extra={"event": "sweep_finished", **report})
    return report


@app.on_dynamodb_record(stream_arn=OUTBOX_STREAM_ARN_PLACEHOLDER, starting_position="TRIM_HORIZON", name="state_log")
def state_log(event: Any) -> dict[str, int]:
    """Ship each new outbox event to S3. Redelivery is harmless; failures make Lambda retry."""
    from chalicelib.stores import state_log_store

    inst = _instance_or_refuse()
    shipped = already = 0
    for record in event:
        if record.event_name != "INSERT" or not record.new_image:
            continue  # outbox items are written once; MODIFY/REMOVE (TTL) are not events
        image = record.new_image
        event_id, payload = image["event_id"]["S"], image["payload"]["S"]
        if state_log_store.ship(inst.s3, inst.settings.state_log_bucket, event_id, payload):
            shipped += 1
        else:
            already += 1
    log.info("state log shipped", extra={"event": "state_log_shipped", "shipped": shipped, "already_present": already})
    return {"shipped": shipped, "already_present": already}
