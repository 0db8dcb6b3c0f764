"""The push channel in the AWS stack `modelforge infra package` writes: Chalice's WebSocket API,
the channel's URLs in every function's environment, and ManageConnections for the API function on
exactly the stage's POST and DELETE of ``@connections``. Nothing here reaches AWS."""

from __future__ import annotations

import re
from typing import Any

import pytest
from modelforge_local_stack import infra_channel

from tests.support import packaging
from tests.support.cfn import resolve


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return packaging.template()


def _stage_name(template: dict[str, Any]) -> str:
    return str(template["Resources"][infra_channel.STAGE]["Properties"]["StageName"])


def test_the_websocket_api_routes_its_three_routes_to_the_three_handler_functions(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    assert resources[infra_channel.API]["Properties"]["ProtocolType"] == "WEBSOCKET"
    routes = {
        item["Properties"]["RouteKey"]: item
        for item in resources.values()
        if item["Type"] == "AWS::ApiGatewayV2::Route" and item["Properties"]["ApiId"] == {"Ref": infra_channel.API}
    }
    assert set(routes) == {"$connect", "$default", "$disconnect"}
    handlers = {name: resources[name]["Properties"]["Handler"] for name in infra_channel.FUNCTIONS}
    assert handlers == {
        "WebsocketConnect": "app.channel_connect",
        "WebsocketMessage": "app.channel_message",
        "WebsocketDisconnect": "app.channel_disconnect",
    }


def test_every_function_gets_the_channel_urls_of_the_websocket_stage(template: dict[str, Any]) -> None:
    stage = _stage_name(template)
    host = "${WebsocketAPI}.execute-api.${AWS::Region}.${AWS::URLSuffix}"
    for name, resource in template["Resources"].items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        variables = resource["Properties"]["Environment"]["Variables"]
        assert variables["MODELFORGE_CHANNEL_URL"] == {"Fn::Sub": f"wss://{host}/{stage}"}, name
        assert variables["MODELFORGE_CHANNEL_MANAGEMENT_URL"] == {"Fn::Sub": f"https://{host}/{stage}"}, name
        assert variables["MODELFORGE_NODES_TABLE"] == {"Ref": "NodesTable"}, name
    assert template["Outputs"]["NodeChannelUrl"]["Value"] == {"Fn::Sub": f"wss://{host}/{stage}"}


def test_the_api_function_manages_connections_and_the_sweep_only_closes_them_on_the_stage(
    template: dict[str, Any],
) -> None:
    resolved = resolve(template, {"AdminRoutesUseIam": True})
    granted: dict[str, list[Any]] = {}
    for name, resource in resolved["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        for policy in resource["Properties"].get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                if any(action.startswith("execute-api:ManageConnections") for action in actions):
                    assert actions == ["execute-api:ManageConnections"]
                    granted.setdefault(name, []).extend(statement["Resource"])
    # the sweep closes the connection of a node that node retention removes, and sends nothing
    assert set(granted) == {"ApiHandlerRole", "LivenessSweepRole"}
    prefix = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${WebsocketAPI}"
    for role, methods in (("ApiHandlerRole", ("DELETE", "POST")), ("LivenessSweepRole", ("DELETE",))):
        arns = sorted(resource["Fn::Sub"] for resource in granted[role])
        assert arns == [f"{prefix}/{_stage_name(template)}/{method}/@connections/*" for method in methods]


def test_the_websocket_functions_log_only_to_their_own_groups(template: dict[str, Any]) -> None:
    """Chalice's own roles for them could write any log group (``arn:*:logs:*:*:*``): replaced."""
    for function, role in infra_channel.FUNCTIONS.items():
        (policy,) = template["Resources"][role]["Properties"]["Policies"]
        for statement in policy["PolicyDocument"]["Statement"]:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            assert all(isinstance(resource, dict) for resource in resources), (function, statement)
            assert not any(re.search(r"\*:\*", str(resource)) for resource in resources), (function, statement)


def test_the_websocket_stage_is_throttled_like_the_other_apis(template: dict[str, Any]) -> None:
    settings = template["Resources"][infra_channel.STAGE]["Properties"]["DefaultRouteSettings"]
    assert settings == {
        "ThrottlingRateLimit": {"Ref": "ApiThrottleRateLimit"},
        "ThrottlingBurstLimit": {"Ref": "ApiThrottleBurstLimit"},
    }
