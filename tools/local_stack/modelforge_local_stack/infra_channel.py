"""The push channel on AWS: the WebSocket API that Chalice's package step emits, wired for the control plane.

When functions/app.py has WebSocket handlers (and the ``WEBSOCKETS`` feature flag), ``chalice
package`` adds an ``AWS::ApiGatewayV2::Api`` of protocol ``WEBSOCKET`` (``WebsocketAPI``), its
``$connect``, ``$default`` and ``$disconnect`` routes, a stage named as the REST API's
(``WebsocketAPIStage``), and one function per handler (``WebsocketConnect``, ``WebsocketMessage``,
``WebsocketDisconnect``), each with a role of its own whose policy would let it write any log group.
The merge template (``infra.py``) gives those functions the same environment, log groups and
least-privilege roles as the others, and adds here:

- the channel's two URLs for every function: ``MODELFORGE_CHANNEL_URL`` (the stage's ``wss://``
  URL, which agents open) and ``MODELFORGE_CHANNEL_MANAGEMENT_URL`` (the stage's ``https://``
  endpoint, where the API function posts ``wake`` and ``cancel`` and deletes revoked nodes'
  connections through the management API);
- ``execute-api:ManageConnections`` on exactly ``POST`` and ``DELETE`` of that stage's
  ``@connections`` (what the channel store calls);
- the stage's throttling, with the limits of the other APIs' stages;
- the output ``NodeChannelUrl``.
"""

from __future__ import annotations

from typing import Any

API = "WebsocketAPI"
STAGE = "WebsocketAPIStage"
#: Chalice's logical ids of the three handler functions and their roles.
FUNCTIONS = {
    "WebsocketConnect": "WebsocketConnectRole",
    "WebsocketMessage": "WebsocketMessageRole",
    "WebsocketDisconnect": "WebsocketDisconnectRole",
}
#: The management API calls the control plane makes (chalicelib/stores/channel_store.py).
MANAGED_METHODS = ("POST", "DELETE")
URL_VAR, MANAGEMENT_URL_VAR = "MODELFORGE_CHANNEL_URL", "MODELFORGE_CHANNEL_MANAGEMENT_URL"


def _endpoint(scheme: str, stage: str) -> dict[str, str]:
    return {"Fn::Sub": f"{scheme}://${{{API}}}.execute-api.${{AWS::Region}}.${{AWS::URLSuffix}}/{stage}"}


def environment(stage: str) -> dict[str, Any]:
    """The channel's URLs, for every function's environment (``stage``: the WebSocket API's stage)."""
    return {URL_VAR: _endpoint("wss", stage), MANAGEMENT_URL_VAR: _endpoint("https", stage)}


def manage_connections(stage: str, methods: tuple[str, ...] = MANAGED_METHODS) -> dict[str, Any]:
    """The statement that lets a function send on (POST) and close (DELETE) the stage's
    connections: the API function both, the sweep only close (node retention's removal)."""
    arn = f"arn:${{AWS::Partition}}:execute-api:${{AWS::Region}}:${{AWS::AccountId}}:${{{API}}}/{stage}"
    return {
        "Effect": "Allow",
        "Action": ["execute-api:ManageConnections"],
        "Resource": [{"Fn::Sub": f"{arn}/{method}/@connections/*"} for method in methods],
    }


def stage_properties(rate_parameter: str, burst_parameter: str) -> dict[str, Any]:
    """What the merge adds to Chalice's stage: the same default throttling as the other APIs'."""
    return {
        "Properties": {
            "DefaultRouteSettings": {
                "ThrottlingRateLimit": {"Ref": rate_parameter},
                "ThrottlingBurstLimit": {"Ref": burst_parameter},
            }
        }
    }


def outputs(stage: str) -> dict[str, Any]:
    return {
        "NodeChannelUrl": {
            "Description": "the push channel agents open (the WebSocket API's stage; the control plane hands it out)",
            "Value": _endpoint("wss", stage),
        }
    }
