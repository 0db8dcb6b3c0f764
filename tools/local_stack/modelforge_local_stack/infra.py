"""Build the deployable CloudFormation template: Chalice's functions merged with infra/.

``modelforge infra package OUT_DIR`` vendors the shared protocol package into the Lambda
bundle, writes the merge template (tables, bucket, stream wiring, parameters, least-privilege
roles, log groups, the nodes' HTTP API, IAM mode for the admin routes) and runs ``chalice package``,
then adds compiled bytecode to the bundle (``bundle_bytecode``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chalicelib.api import console  # importable once .catalogue put functions/ on the path
from chalicelib.stores import aws_permissions

from . import bundle_bytecode, infra_admin_iam, infra_channel, infra_node_api
from .catalogue import FUNCTIONS_DIR, REPO_ROOT, resources
from .provision import RESOURCE_ENV, load_resources

#: The bottom-layer packages the functions import, linked into functions/vendor/ (Chalice bundles it).
SHARED_PACKAGES = (REPO_ROOT / "protocol" / "modelforge_protocol", REPO_ROOT / "protocol" / "modelforge_logging")
#: Chalice resource names of the three functions and their roles.
FUNCTIONS = {"APIHandler": "ApiHandlerRole", "LivenessSweep": "LivenessSweepRole", "StateLog": "StateLogRole"}
#: With the push channel: Chalice's WebSocket handler functions too (``infra_channel``).
FUNCTIONS_WITH_CHANNEL = {**FUNCTIONS, **infra_channel.FUNCTIONS}

PARAMETERS: dict[str, dict[str, Any]] = {
    "AdminTokenSha256": {
        "Type": "String",
        "NoEcho": True,
        "AllowedPattern": "^[0-9a-f]{64}$",
        "Description": "SHA-256 (hex) of the admin token; the token itself is never deployed",
    },
    "HeartbeatIntervalSeconds": {"Type": "Number", "Default": 45, "MinValue": 1, "MaxValue": 3600},
    "FallbackHeartbeatIntervalSeconds": {
        "Type": "Number",
        "Default": 15,
        "MinValue": 1,
        "MaxValue": 3600,
        "Description": "the interval answered to nodes without a live push-channel connection (their work hint)",
    },
    # Offline must exceed stale. CloudFormation cannot compare two parameters, so each takes its
    # values from a list, and every allowed offline value exceeds every allowed stale value: no
    # deployable combination violates the rule (a test checks the lists).
    "StaleAfterSeconds": {
        "Type": "Number",
        "Default": 90,
        "AllowedValues": [60, 75, 90, 120, 180, 240],
        "Description": (
            "seconds without a heartbeat before a node is stale"
            " (every allowed value is below every OfflineAfterSeconds value)"
        ),
    },
    "OfflineAfterSeconds": {
        "Type": "Number",
        "Default": 300,
        "AllowedValues": [300, 600, 900, 1800, 3600, 7200, 21600, 86400],
        "Description": "seconds without a heartbeat before a node is offline (must exceed StaleAfterSeconds)",
    },
    "MassStaleFraction": {
        "Type": "String",
        "Default": "0.5",
        "AllowedPattern": "^(0\\.[0-9]*[1-9][0-9]*|1(\\.0+)?)$",
        "Description": "hold liveness transitions when more than this fraction of online nodes would go stale at once",
    },
}
# API Gateway throttling: what the internet can make the stack spend, the same on both APIs (the
# REST stage's method settings, the HTTP API stage's route settings). The default limit of each
# route must cover the fleet's heartbeats (nodes / interval per second); the agent routes that write
# more get their own lower limits. Over a limit API Gateway answers 429, which the agent backs off
# from (the HTTP API's 429 has no Retry-After and its own body: the agent backs off all the same).
_THROTTLE_PARAMETERS = {
    "ApiThrottleRateLimit": (100, "requests per second per route, on both APIs (at least nodes / heartbeat interval)"),
    "ApiThrottleBurstLimit": (200, "burst of requests per route, on both APIs"),
    "EnrollThrottleRateLimit": (2, "enrollment attempts per second"),
    "EnrollThrottleBurstLimit": (10, "burst of enrollment attempts"),
    "InventoryThrottleRateLimit": (20, "inventory replacements per second (each node is also limited on its own)"),
    "InventoryThrottleBurstLimit": (50, "burst of inventory replacements"),
}
for _name, (_default, _meaning) in _THROTTLE_PARAMETERS.items():
    PARAMETERS[_name] = {"Type": "Number", "Default": _default, "MinValue": 1, "Description": _meaning}
#: (route, method, rate parameter, burst parameter); "/*" + "*" is the stage-wide default.
THROTTLED_ROUTES = (
    ("/*", "*", "ApiThrottleRateLimit", "ApiThrottleBurstLimit"),
    ("/api/v1/agent/enroll", "POST", "EnrollThrottleRateLimit", "EnrollThrottleBurstLimit"),
    ("/api/v1/agent/inventory", "POST", "InventoryThrottleRateLimit", "InventoryThrottleBurstLimit"),
)


def _method_settings() -> list[dict[str, Any]]:
    """Stage method settings: API Gateway writes a resource path's slashes as ``~1``."""
    return [
        {
            "ResourcePath": path if path == "/*" else "/" + path.replace("/", "~1"),
            "HttpMethod": method,
            "ThrottlingRateLimit": {"Ref": rate},
            "ThrottlingBurstLimit": {"Ref": burst},
        }
        for path, method, rate, burst in THROTTLED_ROUTES
    ]


def gateway_security_headers() -> dict[str, str]:
    """The console's security headers as gateway-response header values. A gateway response cannot
    tell a console path from an API path, so every one carries them (harmless on a JSON refusal).
    API Gateway reads a static value in single quotes; the single quotes inside the policy
    (``'none'``, ``'self'``) are taken as they are."""
    return {name: f"'{value}'" for name, value in console.SECURITY_HEADERS.items()}


def _gateway_responses() -> dict[str, Any]:
    """API Gateway's own refusals in the API's error shape, so agents and clients parse them like
    any other refusal. No template echoes the request (API Gateway's default message for an unknown
    route quotes the Authorization header, which would be a node credential). Each carries the
    console's security headers: an unknown console path, or a method a console route lacks, gets
    its answer from here, and every console answer must carry them."""
    from .http_server import GATEWAY_ROUTE_NOT_FOUND, NOT_FOUND, error_body

    def answer(code: str, message: str) -> dict[str, str]:
        return {"application/json": error_body(code, message).decode()}

    unsigned = (
        GATEWAY_ROUTE_NOT_FOUND + "; in this stack the admin routes also need an AWS SigV4 signature (--aws-sigv4)"
    )
    not_found = {
        "application/json": {
            "Fn::If": [
                infra_admin_iam.CONDITION,
                answer(NOT_FOUND, unsigned)["application/json"],
                answer(NOT_FOUND, GATEWAY_ROUTE_NOT_FOUND)["application/json"],
            ]
        }
    }
    responses: dict[str, Any] = {
        # API Gateway (REST) answers an unknown path and a method a path lacks alike, with this
        # response: both become 404 not_found (docs/DEPLOY.md, "Unknown paths and methods");
        # in IAM mode an unsigned admin request gets it too, and the message says so
        "MISSING_AUTHENTICATION_TOKEN": {"StatusCode": 404, "ResponseTemplates": not_found},
        "THROTTLED": {
            "StatusCode": 429,
            "ResponseParameters": {"Headers": {"Retry-After": "'1'"}},
            "ResponseTemplates": answer("throttled", "too many requests; retry after the Retry-After seconds"),
        },
        **infra_admin_iam.gateway_responses(answer),
        "DEFAULT_4XX": {"ResponseTemplates": answer("request_refused", "the API gateway refused the request")},
        "DEFAULT_5XX": {"ResponseTemplates": answer("gateway_error", "the API gateway could not reach the API; retry")},
    }
    for response in responses.values():
        headers = response.setdefault("ResponseParameters", {}).setdefault("Headers", {})
        headers.update(gateway_security_headers())
    return responses


PARAMETER_ENV = {
    "AdminTokenSha256": "MODELFORGE_ADMIN_TOKEN_SHA256",
    "HeartbeatIntervalSeconds": "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS",
    "FallbackHeartbeatIntervalSeconds": "MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS",
    "StaleAfterSeconds": "MODELFORGE_NODE_STALE_AFTER_SECONDS",
    "OfflineAfterSeconds": "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS",
    "MassStaleFraction": "MODELFORGE_SWEEP_MASS_STALE_FRACTION",
    "FunctionLogLevel": "MODELFORGE_LOG_LEVEL",
}
PARAMETERS["FunctionLogLevel"] = {
    "Type": "String",
    "Default": "INFO",
    "AllowedValues": ["DEBUG", "INFO", "WARNING", "ERROR"],
    "Description": "the functions' log level; WARNING drops the one http_request line per request "
    "(about 200 bytes per heartbeat of CloudWatch Logs ingestion)",
}
PARAMETERS["LogRetentionDays"] = {
    "Type": "Number",
    "Default": 30,
    "AllowedValues": [
        1,
        3,
        5,
        7,
        14,
        30,
        60,
        90,
        120,
        150,
        180,
        365,
        400,
        545,
        731,
        1096,
        1827,
        2192,
        2557,
        2922,
        3288,
        3653,
    ],
    "Description": "days the functions' CloudWatch logs are kept",
}
PARAMETERS.update(infra_admin_iam.PARAMETERS)

_TABLES = tuple(table.logical_id for table in resources.TABLES)
_BUCKET = resources.STATE_LOG_BUCKET.logical_id
#: The state-log objects the state-log function may create, and nothing else in the bucket.
_STATE_LOG_OBJECTS = f"${{{_BUCKET}.Arn}}/{resources.STATE_LOG_PREFIX}*"
#: Work inputs and results: the API function writes inputs, signs URLs for inputs and results, and
#: copies each checked result to the sealed prefix.
_WORK_OBJECTS = tuple(
    f"${{{_BUCKET}.Arn}}/{prefix}*"
    for prefix in (resources.WORK_INPUT_PREFIX, resources.WORK_RESULT_PREFIX, resources.WORK_SEALED_PREFIX)
)

#: The DynamoDB actions each function's code calls, as chalicelib/stores/aws_permissions.py maps its
#: calls (tests/integration/test_aws_stack.py derives them from the code and checks both ways).
#: TransactWriteItems needs the action of each of its parts (PutItem, UpdateItem, DeleteItem,
#: ConditionCheckItem), not an action of its own.
TABLE_ACTIONS = {
    "APIHandler": [
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:Query",
        "dynamodb:Scan",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:ConditionCheckItem",
    ],
    "LivenessSweep": [
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",  # the last heartbeat of the nodes its index names
        "dynamodb:Query",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",  # node retention: a node offline too long is removed
        "dynamodb:ConditionCheckItem",
    ],
    # the push channel's handlers: $connect reads the node and records the connection (one
    # conditional update), $disconnect finds the node by its connection and clears it, a message
    # (a ping) touches no table
    "WebsocketConnect": ["dynamodb:GetItem", "dynamodb:UpdateItem"],
    "WebsocketDisconnect": ["dynamodb:Query", "dynamodb:UpdateItem"],
    "WebsocketMessage": [],
}
#: What Lambda reads from the outbox stream with the state-log function's role (its event source),
#: and does with each function's role to write its logs to its own log group.
STREAM_ACTIONS = [action for action in aws_permissions.PLATFORM["StateLog"] if action.startswith("dynamodb:")]
LOG_ACTIONS = [action for action in aws_permissions.PLATFORM["APIHandler"] if action.startswith("logs:")]
LOG_GROUPS = {function: f"{function}LogGroup" for function in FUNCTIONS_WITH_CHANNEL}


def _table_arns() -> list[dict[str, Any]]:
    """Every table and each of its indexes, by name."""
    arns: list[dict[str, Any]] = []
    for table, definition in load_resources().items():
        if table not in _TABLES:
            continue
        arns.append({"Fn::GetAtt": [table, "Arn"]})
        for index in definition["Properties"].get("GlobalSecondaryIndexes", []):
            arns.append({"Fn::Sub": f"${{{table}.Arn}}/index/{index['IndexName']}"})
    return arns


def _policy(name: str, function: str, statements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    logs = {"Effect": "Allow", "Action": LOG_ACTIONS, "Resource": {"Fn::GetAtt": [LOG_GROUPS[function], "Arn"]}}
    return [{"PolicyName": name, "PolicyDocument": {"Version": "2012-10-17", "Statement": [logs, *statements]}}]


def _roles(functions: dict[str, str], channel_stage: str | None) -> dict[str, Any]:
    """Each function's role: its log group, the tables its code calls, and what else it needs
    (``channel_stage``: the push channel's stage, whose connections the API function manages)."""

    def tables(function: str) -> list[dict[str, Any]]:
        actions = TABLE_ACTIONS[function]
        return [{"Effect": "Allow", "Action": actions, "Resource": _table_arns()}] if actions else []

    work_objects = {
        # inputs are written at submission; presigned GETs of inputs and results and PUTs of
        # results are signed with this role, so it needs what those URLs allow; complete copies
        # the result (CopyObject: GetObject on the upload, PutObject on the sealed copy)
        "Effect": "Allow",
        "Action": ["s3:PutObject", "s3:GetObject"],
        "Resource": [{"Fn::Sub": objects} for objects in _WORK_OBJECTS],
    }
    stream = {"Effect": "Allow", "Action": STREAM_ACTIONS, "Resource": {"Fn::GetAtt": ["OutboxTable", "StreamArn"]}}
    put_events = {"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": {"Fn::Sub": _STATE_LOG_OBJECTS}}
    # wake and cancel are posted to (and a revoked or removed node's connection deleted from) the channel
    channel = [infra_channel.manage_connections(channel_stage)] if channel_stage is not None else []
    close_only = [infra_channel.manage_connections(channel_stage, ("DELETE",))] if channel_stage is not None else []
    statements = {
        "APIHandler": [*tables("APIHandler"), work_objects, *channel],
        # node retention closes a removed node's channel connection (and posts nothing on it)
        "LivenessSweep": [*tables("LivenessSweep"), *close_only],
        "StateLog": [stream, put_events],
    }
    names = {"APIHandler": "modelforge-api", "LivenessSweep": "modelforge-sweep", "StateLog": "modelforge-state-log"}
    roles: dict[str, Any] = {}
    for function, role in functions.items():
        granted = statements[function] if function in statements else tables(function)
        policy = _policy(names.get(function, f"modelforge-{function}"), function, granted)
        roles[role] = {"Properties": {"Policies": policy}}
    return roles


def _log_groups(functions: dict[str, str]) -> dict[str, Any]:
    """One log group per function, made by the stack (so no role may create log groups) and
    kept ``LogRetentionDays``."""
    return {
        LOG_GROUPS[function]: {
            "Type": "AWS::Logs::LogGroup",
            "Properties": {"RetentionInDays": {"Ref": "LogRetentionDays"}},
        }
        for function in functions
    }


def _rest_api() -> dict[str, Any]:
    from .infra_routes import admin_routes

    return {
        "Properties": {
            "MethodSettings": _method_settings(),
            "GatewayResponses": _gateway_responses(),
            "DefinitionBody": infra_admin_iam.rest_api_security(admin_routes()),
            # SAM names a deployment by a hash of the OpenAPI body as written, so a changed
            # parameter (AdminIamAuthorization) alone would never reach the stage: deploy on
            # every stack update instead
            "AlwaysDeploy": True,
        }
    }


def _outputs(stage: str, channel: bool) -> dict[str, Any]:
    return {
        **(infra_channel.outputs(stage) if channel else {}),
        "AdminApiUrl": {
            "Description": "MODELFORGE_API_URL for the modelforge admin commands (the REST API's stage)",
            "Value": {"Fn::Sub": f"https://${{RestAPI}}.execute-api.${{AWS::Region}}.${{AWS::URLSuffix}}/{stage}"},
        },
        "StateLogBucketName": {
            "Description": "the state log (events/<event_id>.json) and work objects; modelforge log replay --bucket",
            "Value": {"Ref": _BUCKET},
        },
        **infra_node_api.outputs(),
        **infra_admin_iam.outputs(),
    }


def merge_template(stage: str = "dev") -> dict[str, Any]:
    """What ``chalice package --merge-template`` adds to the generated template for ``stage``."""
    from .infra_routes import admin_routes, node_routes, rest_stage

    resources: dict[str, Any] = dict(load_resources())
    for state in (*_TABLES, _BUCKET):
        # the state outlives the stack: deleting or replacing the stack never deletes it
        resources[state] = {**resources[state], "DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"}
    environment = {env: {"Ref": logical_id} for logical_id, env in RESOURCE_ENV.items()}
    environment.update({env: {"Ref": parameter} for parameter, env in PARAMETER_ENV.items()})
    # the push channel, when the app has WebSocket handlers (Chalice's stage is named as the REST API's)
    channel = has_channel()
    functions = FUNCTIONS_WITH_CHANNEL if channel else FUNCTIONS
    if channel:
        environment.update(infra_channel.environment(rest_stage(stage)))
        resources[infra_channel.STAGE] = infra_channel.stage_properties("ApiThrottleRateLimit", "ApiThrottleBurstLimit")
    for function in functions:
        resources[function] = {
            "Properties": {
                "Environment": {"Variables": environment},
                "LoggingConfig": {"LogGroup": {"Ref": LOG_GROUPS[function]}},
            }
        }
    resources.update(_roles(functions, rest_stage(stage) if channel else None))
    resources.update(_log_groups(functions))
    resources["RestAPI"] = _rest_api()
    resources["StateLog"]["Properties"]["Events"] = {
        "StateLogDynamodbEventSource": {"Properties": {"Stream": {"Fn::GetAtt": ["OutboxTable", "StreamArn"]}}}
    }
    resources.update(infra_node_api.resources(node_routes(), list(THROTTLED_ROUTES)))
    resources.update(infra_admin_iam.managed_policies(admin_routes(), rest_stage(stage)))
    return {
        "Parameters": PARAMETERS,
        "Conditions": infra_admin_iam.CONDITIONS,
        "Resources": resources,
        "Outputs": _outputs(rest_stage(stage), channel),
    }


def has_channel() -> bool:
    """Whether the app has WebSocket handlers (then Chalice's package step emits the WebSocket API)."""
    from .http_server import load_app

    return bool(load_app().app.websocket_handlers)


def vendor_shared_packages() -> list[Path]:
    """Make sure functions/vendor/ holds the committed links to the shared packages.

    Chalice bundles ``vendor/`` as is and follows links, so ``chalice package`` or ``deploy`` run
    in functions/ directly carries them too, not only ``modelforge infra package``. A copy left
    there by an older version of this command is replaced by the link.
    """
    return [_link_into_vendor(package) for package in SHARED_PACKAGES]


def _link_into_vendor(package: Path) -> Path:
    target = FUNCTIONS_DIR / "vendor" / package.name
    if target.is_symlink() and target.resolve() == package.resolve():
        return target
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(os.path.relpath(package, target.parent), target_is_directory=True)
    return target


@dataclass(frozen=True)
class Packaged:
    template: Path
    bundle: Path
    bytecode: bundle_bytecode.Outcome


def function_runtimes(template: dict[str, Any]) -> set[str]:
    """The Lambda runtimes of the template's functions (``python3.11``)."""
    return {
        resource["Properties"]["Runtime"]
        for resource in template["Resources"].values()
        if resource.get("Type") == "AWS::Serverless::Function"
    }


def package(out_dir: Path, stage: str = "dev") -> Packaged:
    """Write deployment.zip (with bytecode, where this Python is the functions' runtime) and sam.json
    to out_dir."""
    vendor_shared_packages()
    with tempfile.TemporaryDirectory() as scratch:
        merge_file = Path(scratch) / "merge.json"
        merge_file.write_text(json.dumps(merge_template(stage), indent=2))
        env = {**os.environ, "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
        beside_python = Path(sys.executable).parent / "chalice"
        chalice = [str(beside_python) if beside_python.exists() else (shutil.which("chalice") or "chalice")]
        subprocess.run(
            [*chalice, "package", "--pkg-format", "cloudformation", "--stage", stage,
             "--merge-template", str(merge_file), str(out_dir.resolve())],
            cwd=FUNCTIONS_DIR, env=env, check=True,
        )  # fmt: skip
    template, bundle = out_dir / "sam.json", out_dir / "deployment.zip"
    runtimes = function_runtimes(json.loads(template.read_text()))
    return Packaged(template, bundle, bundle_bytecode.add(bundle, runtimes))
