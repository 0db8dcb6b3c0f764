"""The AWS stack `modelforge infra package` writes: the nodes' HTTP API, IAM mode for admins,
roles that grant what the code calls and nothing else, and a template that SAM transforms and
cfn-lint accepts. Nothing here reaches AWS: the template is read, resolved per condition, and
transformed offline with aws-sam-translator (what CloudFormation runs at deploy time)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chalicelib.api import console
from chalicelib.stores import aws_permissions
from modelforge_local_stack import infra_admin_iam
from modelforge_local_stack.http_server import load_app

from tests.support import aws_calls, packaging
from tests.support.cfn import resolve

CONDITION = "AdminRoutesUseIam"
FUNCTION_ROLES = {
    "APIHandler": "ApiHandlerRole",
    "LivenessSweep": "LivenessSweepRole",
    "StateLog": "StateLogRole",
    "WebsocketConnect": "WebsocketConnectRole",
    "WebsocketMessage": "WebsocketMessageRole",
    "WebsocketDisconnect": "WebsocketDisconnectRole",
}
NODE_API = {"Ref": "NodeHttpApi"}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return packaging.template()


def _of_type(template: dict[str, Any], kind: str) -> dict[str, Any]:
    return {name: item for name, item in template["Resources"].items() if item["Type"] == kind}


def _of_node_api(template: dict[str, Any], kind: str) -> dict[str, Any]:
    """The nodes' HTTP API's resources of ``kind`` (the push channel's WebSocket API has its own)."""
    return {name: item for name, item in _of_type(template, kind).items() if item["Properties"]["ApiId"] == NODE_API}


def _app_routes(prefix: str) -> set[str]:
    """``METHOD /path`` of the app's routes under ``prefix``, read from the app itself."""
    routes = load_app().app.routes
    return {f"{method} {path}" for path, methods in routes.items() for method in methods if path.startswith(prefix)}


# --- the nodes' HTTP API ---------------------------------------------------------------------------


def test_the_http_api_carries_exactly_the_app_s_agent_routes_on_one_payload_1_0_integration(
    template: dict[str, Any],
) -> None:
    routes = _of_node_api(template, "AWS::ApiGatewayV2::Route")
    assert {route["Properties"]["RouteKey"] for route in routes.values()} == _app_routes("/api/v1/agent/")
    ((integration_id, integration),) = _of_node_api(template, "AWS::ApiGatewayV2::Integration").items()
    assert integration["Properties"]["PayloadFormatVersion"] == "1.0"
    assert integration["Properties"]["IntegrationType"] == "AWS_PROXY"
    assert integration["Properties"]["IntegrationUri"] == {"Fn::GetAtt": ["APIHandler", "Arn"]}
    for route in routes.values():
        assert route["Properties"]["Target"] == {"Fn::Sub": f"integrations/${{{integration_id}}}"}
        assert route["Properties"]["AuthorizationType"] == "NONE"  # the node credential, checked by the app


def test_every_path_the_agent_calls_is_a_route_of_the_http_api(template: dict[str, Any]) -> None:
    from modelforge_node_agent import control_plane as agent

    keys = {route["Properties"]["RouteKey"] for route in _of_node_api(template, "AWS::ApiGatewayV2::Route").values()}
    patterns = [re.compile("^" + re.sub(r"\\\{[^/]+\\\}", "[^/]+", re.escape(key)) + "$") for key in keys]
    work_id = "work_" + "0" * 32
    called = [agent.ENROLL, agent.HEARTBEAT, agent.INVENTORY, agent.WORK_CLAIM]
    called += [agent.work_path(work_id, action) for action in (agent.RENEW, agent.COMPLETE, agent.FAIL)]
    for path in called:
        assert any(pattern.match(f"POST {path}") for pattern in patterns), path


def test_the_http_api_stage_serves_the_root_and_is_throttled_like_the_rest_stage(template: dict[str, Any]) -> None:
    (stage,) = _of_node_api(template, "AWS::ApiGatewayV2::Stage").values()
    properties = stage["Properties"]
    assert properties["StageName"] == "$default" and properties["AutoDeploy"] is True
    assert properties["DefaultRouteSettings"]["ThrottlingRateLimit"] == {"Ref": "ApiThrottleRateLimit"}
    assert properties["RouteSettings"]["POST /api/v1/agent/enroll"]["ThrottlingBurstLimit"] == {
        "Ref": "EnrollThrottleBurstLimit"
    }
    assert properties["RouteSettings"]["POST /api/v1/agent/inventory"]["ThrottlingRateLimit"] == {
        "Ref": "InventoryThrottleRateLimit"
    }
    assert set(stage["DependsOn"]) == set(_of_node_api(template, "AWS::ApiGatewayV2::Route"))


def test_only_the_node_routes_of_this_http_api_may_invoke_the_function(template: dict[str, Any]) -> None:
    permission = template["Resources"]["NodeHttpApiInvokePermission"]["Properties"]
    assert permission["FunctionName"] == {"Ref": "APIHandler"} and permission["Principal"] == "apigateway.amazonaws.com"
    assert permission["SourceArn"]["Fn::Sub"].endswith(":${NodeHttpApi}/*/*/api/v1/agent/*")


def test_outputs_give_the_node_url_and_the_admin_url(template: dict[str, Any]) -> None:
    outputs = template["Outputs"]
    assert outputs["NodeControlPlaneUrl"]["Value"] == {"Fn::GetAtt": ["NodeHttpApi", "ApiEndpoint"]}
    assert outputs["AdminApiUrl"]["Value"]["Fn::Sub"].endswith(".${AWS::URLSuffix}/api")


def test_the_rest_api_keeps_every_route_of_the_app(template: dict[str, Any]) -> None:
    """The REST API still serves the node routes (Chalice builds one API from the app): the fallback
    behind a custom domain if the HTTP API must be withdrawn (docs/DEPLOY.md)."""
    paths = template["Resources"]["RestAPI"]["Properties"]["DefinitionBody"]["paths"]
    served = {f"{method.upper()} {path}" for path, methods in paths.items() for method in methods}
    assert _app_routes("/") <= served


# --- IAM for admins ---------------------------------------------------------------------------------


@pytest.mark.parametrize("iam", [False, True], ids=["token-only", "iam-mode"])
def test_iam_mode_puts_exactly_the_admin_methods_behind_sigv4(template: dict[str, Any], iam: bool) -> None:
    """A method whose security names the awsSigv4 definition is AuthorizationType AWS_IAM in API
    Gateway's OpenAPI import (Chalice's IAMAuthorizer writes the same)."""
    body = resolve(template, {CONDITION: iam})["Resources"]["RestAPI"]["Properties"]["DefinitionBody"]
    ((name, definition),) = body["securityDefinitions"].items()
    assert definition["x-amazon-apigateway-authtype"] == "awsSigv4" and definition["name"] == "Authorization"
    admin = _app_routes("/api/v1/admin/")
    for path, methods in body["paths"].items():
        for method, operation in methods.items():
            behind_iam = operation.get("security") == [{name: []}]
            assert behind_iam is (iam and f"{method.upper()} {path}" in admin), (method, path)


@pytest.mark.parametrize("iam", [False, True], ids=["token-only", "iam-mode"])
def test_the_role_policies_exist_in_iam_mode_only_and_name_exact_admin_routes(
    template: dict[str, Any], iam: bool
) -> None:
    resolved = resolve(template, {CONDITION: iam})
    policies = _of_type(resolved, "AWS::IAM::ManagedPolicy")
    assert set(policies) == ({"AdminReadOnlyPolicy", "AdminOperatorPolicy"} if iam else set())
    assert ("AdminOperatorPolicy" in resolved["Outputs"]) is iam
    if not iam:
        return
    prefix = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${RestAPI}/api/"
    admin = _app_routes("/api/v1/admin/")

    def routes_of(policy: str) -> set[str]:
        (statement,) = policies[policy]["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Action"] == "execute-api:Invoke" and statement["Effect"] == "Allow"
        arns = [resource["Fn::Sub"] for resource in statement["Resource"]]
        assert all(arn.startswith(prefix) for arn in arns)
        return {arn[len(prefix) :].replace("/", " /", 1) for arn in arns}

    as_arns = {re.sub(r"\{[^}]+\}", "*", route) for route in admin}
    assert routes_of("AdminOperatorPolicy") == as_arns
    assert routes_of("AdminReadOnlyPolicy") == {route for route in as_arns if route.startswith("GET ")}


def test_the_example_policies_are_the_stack_s_with_placeholders_and_no_wildcard_resource() -> None:
    examples = infra_admin_iam.example_policies()
    assert set(examples) == {path.name for path in infra_admin_iam.POLICIES_DIR.glob("*.json")}
    for name, document in examples.items():
        on_disk = json.loads((infra_admin_iam.POLICIES_DIR / name).read_text())
        assert on_disk == document, f"infra/policies/{name} is stale: python -m modelforge_local_stack.infra_admin_iam"
        for statement in on_disk["Statement"]:
            assert statement["Resource"] and "*" not in statement["Resource"]
            for arn in statement["Resource"]:
                assert arn.startswith("arn:aws:execute-api:<REGION>:<ACCOUNT_ID>:<REST_API_ID>/api/"), arn


# --- roles: what the code calls, nothing else ------------------------------------------------------


def _statements(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, resource in template["Resources"].items():
        if resource["Type"] == "AWS::IAM::Role":
            for policy in resource["Properties"].get("Policies", []):
                found += [(name, statement) for statement in policy["PolicyDocument"]["Statement"]]
            assert not resource["Properties"].get("ManagedPolicyArns"), name
        elif resource["Type"] == "AWS::IAM::ManagedPolicy":
            found += [(name, statement) for statement in resource["Properties"]["PolicyDocument"]["Statement"]]
    return found


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_no_iam_statement_grants_a_wildcard_resource(template: dict[str, Any]) -> None:
    """Every resource is one of this stack's, by reference: a table, an index, the stream, a
    prefix of the bucket, a log group, or a route of the REST API."""
    resolved = resolve(template, {CONDITION: True})
    names = set(resolved["Resources"])
    for role, statement in _statements(resolved):
        assert statement["Effect"] == "Allow" and "NotResource" not in statement and "NotAction" not in statement
        for action in _as_list(statement["Action"]):
            assert "*" not in action, (role, action)
        for resource in _as_list(statement["Resource"]):
            assert isinstance(resource, dict), (role, resource)  # a literal would name nothing of this stack
            ((function, argument),) = resource.items()
            if function == "Fn::GetAtt":
                assert argument[0] in names, (role, resource)
            else:
                assert function == "Fn::Sub", (role, resource)
                named = set(re.findall(r"\$\{([A-Za-z0-9]+)(?:\.[A-Za-z]+)?\}", argument))
                assert named & names, (role, resource)
                assert not re.search(r"(^|:)\*(:|$)", argument), (role, resource)


@pytest.mark.parametrize("function", sorted(FUNCTION_ROLES))
def test_each_role_grants_exactly_the_actions_of_the_calls_its_function_can_reach(
    template: dict[str, Any], function: str
) -> None:
    granted: set[str] = set()
    for role, statement in _statements(template):
        if role == FUNCTION_ROLES[function]:
            granted.update(_as_list(statement["Action"]))
    called = aws_calls.calls_of(function)
    assert not called.unknown
    needed = called.actions | set(aws_permissions.PLATFORM[function])
    assert granted - needed == set(), f"{function}: granted but never called"
    assert needed - granted == set(), f"{function}: called but not granted"


def test_every_aws_call_in_the_functions_is_in_the_permission_table() -> None:
    found = aws_calls.every_call()
    assert found.unknown == [], "add these calls to functions/chalicelib/stores/aws_permissions.py"
    assert found.actions == aws_calls.calls_of("APIHandler").actions | aws_calls.calls_of("StateLog").actions


def test_the_call_finder_sees_each_kind_of_call_and_reports_an_unknown_one() -> None:
    """Negative control: a new call on a model, an index, an instance, a transaction or the S3
    client is either mapped or reported, never missed."""
    source = """
def store(transaction):
    NodeModel.scan()
    NodeModel.by_liveness.query("online#0")
    node = NodeModel("n")
    node.delete()
    transaction.condition_check(NodeModel, "n")
    self._s3.generate_presigned_url("put_object", Params={})
    NodeModel.liveness == "online"
    NodeModel.node_id.exists()
    NodeModel.batch_write()
    s3.delete_object(Bucket="b", Key="k")
"""
    module = aws_calls._Module("synthetic", ast.parse(source))
    definition = module.tree.body[0]
    found = aws_calls.Found()
    aws_calls._calls(module, "store", definition, found)
    assert found.actions == {
        "dynamodb:Scan", "dynamodb:Query", "dynamodb:DeleteItem", "dynamodb:ConditionCheckItem", "s3:PutObject"
    }  # fmt: skip
    assert found.unknown == ["synthetic:store: NodeModel.batch_write", "synthetic:store: s3.delete_object"]


# --- the whole template -------------------------------------------------------------------------


def test_state_outlives_the_stack(template: dict[str, Any]) -> None:
    for kind in ("AWS::DynamoDB::Table", "AWS::S3::Bucket"):
        for name, resource in _of_type(template, kind).items():
            assert resource.get("DeletionPolicy") == "Retain" and resource.get("UpdateReplacePolicy") == "Retain", name


def test_each_function_logs_to_its_own_log_group_with_a_retention(template: dict[str, Any]) -> None:
    for function, role in FUNCTION_ROLES.items():
        group = template["Resources"][function]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert template["Resources"][group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        logs = [s for r, s in _statements(template) if r == role and s["Resource"] == {"Fn::GetAtt": [group, "Arn"]}]
        assert len(logs) == 1, function


def test_sam_transforms_the_template_and_cfn_lint_accepts_what_cloudformation_would_deploy(tmp_path: Path) -> None:
    """aws-sam-translator (the AWS::Serverless transform, run offline) accepts the template; the
    plain CloudFormation it produces passes cfn-lint with zero errors."""
    transformed = json.loads(packaging.transformed())
    kinds = {resource["Type"] for resource in transformed["Resources"].values()}
    assert {"AWS::ApiGateway::RestApi", "AWS::ApiGatewayV2::Api", "AWS::Lambda::Function"} <= kinds
    assert not any(kind.startswith("AWS::Serverless::") for kind in kinds)
    assert transformed["Resources"]["APIHandler"]["Properties"]["LoggingConfig"] == {
        "LogGroup": {"Ref": "APIHandlerLogGroup"}
    }
    body = transformed["Resources"]["RestAPI"]["Properties"]["Body"]
    assert body["paths"]["/api/v1/admin/nodes"]["get"]["security"]["Fn::If"][0] == CONDITION
    # the console's security headers on each of API Gateway's own refusals, in the form it reads
    responses = body["x-amazon-apigateway-gateway-responses"]
    assert {"MISSING_AUTHENTICATION_TOKEN", "DEFAULT_4XX", "DEFAULT_5XX"} <= set(responses)
    for kind, response in responses.items():
        for name, value in console.SECURITY_HEADERS.items():
            assert response["responseParameters"][f"gatewayresponse.header.{name}"] == f"'{value}'", (kind, name)
    path = tmp_path / "cloudformation.json"
    path.write_text(json.dumps(transformed))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
