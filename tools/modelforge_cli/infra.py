"""Build the deployable CloudFormation template: Chalice's functions merged with infra/.

``modelforge infra package OUT_DIR`` vendors the shared protocol package into the Lambda
bundle, writes the merge template (tables, bucket, stream wiring, parameters, least-privilege
roles) and runs ``chalice package``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .catalogue import FUNCTIONS_DIR, REPO_ROOT, resources
from .provision import RESOURCE_ENV, load_resources

#: The bottom-layer packages the functions import, linked into functions/vendor/ (Chalice bundles it).
SHARED_PACKAGES = (REPO_ROOT / "protocol" / "modelforge_protocol", REPO_ROOT / "protocol" / "modelforge_logging")
#: Chalice resource names of the three functions and their roles.
FUNCTIONS = {"APIHandler": "ApiHandlerRole", "LivenessSweep": "LivenessSweepRole", "StateLog": "StateLogRole"}

PARAMETERS: dict[str, dict[str, Any]] = {
    "AdminTokenSha256": {
        "Type": "String",
        "NoEcho": True,
        "AllowedPattern": "^[0-9a-f]{64}$",
        "Description": "SHA-256 (hex) of the admin token; the token itself is never deployed",
    },
    "HeartbeatIntervalSeconds": {"Type": "Number", "Default": 15, "MinValue": 1, "MaxValue": 3600},
    # Offline must exceed stale. CloudFormation cannot compare two parameters, so each takes its
    # values from a list, and every allowed offline value exceeds every allowed stale value: no
    # deployable combination violates the rule (a test checks the lists).
    "StaleAfterSeconds": {
        "Type": "Number",
        "Default": 60,
        "AllowedValues": [20, 30, 45, 60, 90, 120, 180, 240],
        "Description": "seconds without a heartbeat before a node is stale (every allowed value is below every OfflineAfterSeconds value)",
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
# API Gateway throttling: what the internet can make the stack spend. The stage limit must cover
# the fleet's heartbeats (nodes / interval per second); the agent routes that write more get their
# own lower limits. Over a limit API Gateway answers 429, which the agent backs off from.
_THROTTLE_PARAMETERS = {
    "ApiThrottleRateLimit": (100, "requests per second across the whole API (at least nodes / heartbeat interval)"),
    "ApiThrottleBurstLimit": (200, "burst of requests across the whole API"),
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


def _gateway_responses() -> dict[str, Any]:
    """API Gateway's own refusals in the API's error shape, so agents and clients parse them like
    any other refusal. No template echoes the request (API Gateway's default message for an unknown
    route quotes the Authorization header, which would be a node credential)."""
    from .http_server import GATEWAY_ROUTE_NOT_FOUND, NOT_FOUND, error_body

    def answer(code: str, message: str) -> dict[str, str]:
        return {"application/json": error_body(code, message).decode()}

    return {
        # API Gateway (REST) answers an unknown path and a method a path lacks alike, with this
        # response: both become 404 not_found (docs/ARCHITECTURE.md, "Unknown paths and methods")
        "MISSING_AUTHENTICATION_TOKEN": {"StatusCode": 404, "ResponseTemplates": answer(NOT_FOUND, GATEWAY_ROUTE_NOT_FOUND)},
        "THROTTLED": {
            "StatusCode": 429,
            "ResponseParameters": {"Headers": {"Retry-After": "'1'"}},
            "ResponseTemplates": answer("throttled", "too many requests; retry after the Retry-After seconds"),
        },
        "DEFAULT_4XX": {"ResponseTemplates": answer("request_refused", "the API gateway refused the request")},
        "DEFAULT_5XX": {"ResponseTemplates": answer("gateway_error", "the API gateway could not reach the API; retry")},
    }


PARAMETER_ENV = {
    "AdminTokenSha256": "MODELFORGE_ADMIN_TOKEN_SHA256",
    "HeartbeatIntervalSeconds": "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS",
    "StaleAfterSeconds": "MODELFORGE_NODE_STALE_AFTER_SECONDS",
    "OfflineAfterSeconds": "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS",
    "MassStaleFraction": "MODELFORGE_SWEEP_MASS_STALE_FRACTION",
}
_TABLES = tuple(table.logical_id for table in resources.TABLES)
#: The state-log objects the state-log function may create, and nothing else in the bucket.
_STATE_LOG_OBJECTS = f"${{{resources.STATE_LOG_BUCKET.logical_id}.Arn}}/{resources.STATE_LOG_PREFIX}*"
#: Work inputs and results: the API function writes inputs and signs URLs for inputs and results.
_WORK_OBJECTS = tuple(
    f"${{{resources.STATE_LOG_BUCKET.logical_id}.Arn}}/{prefix}*"
    for prefix in (resources.WORK_INPUT_PREFIX, resources.WORK_RESULT_PREFIX)
)
_ITEM_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Query",
    "dynamodb:ConditionCheckItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Scan",
]


def _table_arns() -> list[dict[str, Any]]:
    arns: list[dict[str, Any]] = [{"Fn::GetAtt": [table, "Arn"]} for table in _TABLES]
    return arns + [{"Fn::Sub": "${NodesTable.Arn}/index/*"}, {"Fn::Sub": "${WorkTable.Arn}/index/*"}]


def _policy(name: str, statements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    logs = {
        "Effect": "Allow",
        "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
        "Resource": "arn:*:logs:*:*:*",
    }
    return [{"PolicyName": name, "PolicyDocument": {"Version": "2012-10-17", "Statement": [logs, *statements]}}]


def merge_template() -> dict[str, Any]:
    """What ``chalice package --merge-template`` adds to the generated template."""
    resources: dict[str, Any] = dict(load_resources())
    environment = {env: {"Ref": logical_id} for logical_id, env in RESOURCE_ENV.items()}
    environment.update({env: {"Ref": parameter} for parameter, env in PARAMETER_ENV.items()})
    for function in FUNCTIONS:
        resources[function] = {"Properties": {"Environment": {"Variables": environment}}}
    tables = {"Effect": "Allow", "Action": _ITEM_ACTIONS, "Resource": _table_arns()}
    work_objects = {
        # inputs are written at submission; presigned GETs of inputs and results and PUTs of
        # results are signed with this role, so it needs what those URLs allow
        "Effect": "Allow",
        "Action": ["s3:PutObject", "s3:GetObject"],
        "Resource": [{"Fn::Sub": objects} for objects in _WORK_OBJECTS],
    }
    resources["ApiHandlerRole"] = {"Properties": {"Policies": _policy("modelforge-api", [tables, work_objects])}}
    resources["LivenessSweepRole"] = {"Properties": {"Policies": _policy("modelforge-sweep", [tables])}}
    stream = {
        "Effect": "Allow",
        "Action": ["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"],
        "Resource": {"Fn::GetAtt": ["OutboxTable", "StreamArn"]},
    }
    put_events = {
        "Effect": "Allow",
        "Action": ["s3:PutObject"],
        "Resource": {"Fn::Sub": _STATE_LOG_OBJECTS},
    }
    resources["StateLogRole"] = {"Properties": {"Policies": _policy("modelforge-state-log", [stream, put_events])}}
    resources["RestAPI"] = {"Properties": {"MethodSettings": _method_settings(), "GatewayResponses": _gateway_responses()}}
    resources["StateLog"]["Properties"]["Events"] = {
        "StateLogDynamodbEventSource": {"Properties": {"Stream": {"Fn::GetAtt": ["OutboxTable", "StreamArn"]}}}
    }
    return {"Parameters": PARAMETERS, "Resources": resources}


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


def package(out_dir: Path, stage: str = "dev") -> Path:
    """Write deployment.zip and sam.json to out_dir; return the template path."""
    vendor_shared_packages()
    with tempfile.TemporaryDirectory() as scratch:
        merge_file = Path(scratch) / "merge.json"
        merge_file.write_text(json.dumps(merge_template(), indent=2))
        env = {**os.environ, "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
        beside_python = Path(sys.executable).parent / "chalice"
        chalice = [str(beside_python) if beside_python.exists() else (shutil.which("chalice") or "chalice")]
        subprocess.run(
            [*chalice, "package", "--pkg-format", "cloudformation", "--stage", stage,
             "--merge-template", str(merge_file), str(out_dir.resolve())],
            cwd=FUNCTIONS_DIR, env=env, check=True,
        )  # fmt: skip
    return out_dir / "sam.json"
