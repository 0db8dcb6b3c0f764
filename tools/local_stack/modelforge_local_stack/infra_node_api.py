"""The nodes' API: an API Gateway HTTP API in front of the same API function as the REST API.

Chalice builds only a REST API. Heartbeats are almost all of a node's requests, and an HTTP API
costs less per request, so the merged template adds one (``AWS::ApiGatewayV2``) that carries
exactly the app's ``/api/v1/agent/...`` routes. Its Lambda integration uses payload format 1.0:
the REST API's proxy event (``requestContext.resourcePath`` holds the route's path with its
``{parameters}``, ``httpMethod``, ``multiValueQueryStringParameters``, ``pathParameters``, ``body``,
``isBase64Encoded``), which is what Chalice's handler reads (tests/unit/test_http_api_events.py
feeds the app such events). The ``$default`` stage puts the routes at the API's root, so its
endpoint is the ``scheme://host`` that ``MODELFORGE_AGENT_CONTROL_PLANE_URL`` must be.
"""

from __future__ import annotations

from typing import Any

from .infra_routes import NODE_PREFIX, Route

API = "NodeHttpApi"
INTEGRATION = "NodeHttpApiIntegration"
STAGE = "NodeHttpApiStage"
PERMISSION = "NodeHttpApiInvokePermission"
FUNCTION = "APIHandler"
#: the stage that serves the API at its root (no stage name in the URL)
DEFAULT_STAGE = "$default"
#: the HTTP API's upper limit, and the API function's timeout
INTEGRATION_TIMEOUT_MS = 30000


def route_resource_id(route: Route) -> str:
    return f"NodeRoute{route.logical_name}"


def resources(routes: list[Route], throttled: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    """The HTTP API, its one integration, a route per node route, the stage and the permission.

    ``throttled``: (path, method, rate parameter, burst parameter); ``("/*", "*", ...)`` is the
    default of every route, the others are route-specific limits (for node routes only).
    """
    found: dict[str, Any] = {
        API: {
            "Type": "AWS::ApiGatewayV2::Api",
            "Properties": {
                "Name": {"Fn::Sub": "${AWS::StackName}-nodes"},
                "ProtocolType": "HTTP",
                "Description": "ModelForge node agents: enroll, heartbeat, inventory, work leases",
            },
        },
        INTEGRATION: {
            "Type": "AWS::ApiGatewayV2::Integration",
            "Properties": {
                "ApiId": {"Ref": API},
                "IntegrationType": "AWS_PROXY",
                "IntegrationUri": {"Fn::GetAtt": [FUNCTION, "Arn"]},
                # the REST API's event shape, which Chalice's handler reads (2.0 has no resourcePath)
                "PayloadFormatVersion": "1.0",
                "TimeoutInMillis": INTEGRATION_TIMEOUT_MS,
            },
        },
    }
    for route in routes:
        found[route_resource_id(route)] = {
            "Type": "AWS::ApiGatewayV2::Route",
            "Properties": {
                "ApiId": {"Ref": API},
                "RouteKey": route.key,
                # nodes authenticate with their credential, which the function checks
                "AuthorizationType": "NONE",
                "Target": {"Fn::Sub": f"integrations/${{{INTEGRATION}}}"},
            },
        }
    found[STAGE] = _stage(routes, throttled)
    found[PERMISSION] = {
        "Type": "AWS::Lambda::Permission",
        "Properties": {
            "Action": "lambda:InvokeFunction",
            "FunctionName": {"Ref": FUNCTION},
            "Principal": "apigateway.amazonaws.com",
            # this API's node routes only (any stage, any method)
            "SourceArn": {
                "Fn::Sub": f"arn:${{AWS::Partition}}:execute-api:${{AWS::Region}}:${{AWS::AccountId}}:${{{API}}}/*/*{NODE_PREFIX}*"
            },
        },
    }
    return found


def _stage(routes: list[Route], throttled: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    keys = {route.key for route in routes}
    default = next((rate, burst) for path, method, rate, burst in throttled if (path, method) == ("/*", "*"))
    route_settings = {
        f"{method} {path}": {"ThrottlingRateLimit": {"Ref": rate}, "ThrottlingBurstLimit": {"Ref": burst}}
        for path, method, rate, burst in throttled
        if f"{method} {path}" in keys
    }
    return {
        "Type": "AWS::ApiGatewayV2::Stage",
        # route settings name routes by key: they must exist before the stage refers to them
        "DependsOn": sorted(route_resource_id(route) for route in routes),
        "Properties": {
            "ApiId": {"Ref": API},
            "StageName": DEFAULT_STAGE,
            "AutoDeploy": True,
            "Description": "the node routes at the API's root: the node URL is the API's endpoint",
            "DefaultRouteSettings": {
                "ThrottlingRateLimit": {"Ref": default[0]},
                "ThrottlingBurstLimit": {"Ref": default[1]},
            },
            "RouteSettings": route_settings,
        },
    }


def outputs() -> dict[str, Any]:
    return {
        "NodeControlPlaneUrl": {
            "Description": "MODELFORGE_AGENT_CONTROL_PLANE_URL for nodes (the HTTP API's endpoint, no path)",
            "Value": {"Fn::GetAtt": [API, "ApiEndpoint"]},
        },
        "NodeHttpApiId": {"Description": "the nodes' HTTP API", "Value": {"Ref": API}},
    }
