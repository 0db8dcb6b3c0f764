"""IAM for admins: the admin routes behind AWS SigV4 as well as the admin token, when asked.

The template parameter ``AdminIamAuthorization`` (``false`` by default) switches the REST API's
admin methods to IAM authorization: in API Gateway's OpenAPI, a method whose ``security`` names a
definition with ``x-amazon-apigateway-authtype: awsSigv4`` has ``AuthorizationType: AWS_IAM``
(what Chalice's ``IAMAuthorizer`` writes). API Gateway then refuses an unsigned request, and a
signed one whose caller's IAM policy does not allow ``execute-api:Invoke`` on the route, before
the function runs; the function still checks the admin token. Public routes and the nodes' routes
(their own HTTP API) never use IAM.

Two example policies, one per role, name exact route ARNs: ``read-only`` may call the admin GET
routes, ``operator`` every admin route. The stack creates them as managed policies in IAM mode
(attach them to your admins' roles); ``infra/policies/`` holds the same documents with
placeholders, for accounts that manage IAM elsewhere (``python -m modelforge_local_stack.infra_admin_iam``
writes them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .catalogue import REPO_ROOT
from .infra_routes import Route, admin_routes, rest_stage

PARAMETER = "AdminIamAuthorization"
CONDITION = "AdminRoutesUseIam"
REST_API = "RestAPI"
SECURITY_NAME = "sigv4"
POLICIES_DIR = REPO_ROOT / "infra" / "policies"
#: role -> (the managed policy's logical id, what it may do, the methods it may call)
ROLES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "read-only": ("AdminReadOnlyPolicy", "read the admin API (GET routes)", ("GET",)),
    "operator": ("AdminOperatorPolicy", "call every admin route", ("GET", "POST", "DELETE")),
}

PARAMETERS: dict[str, dict[str, Any]] = {
    PARAMETER: {
        "Type": "String",
        "Default": "false",
        "AllowedValues": ["false", "true"],
        "Description": "true: the admin routes also require AWS SigV4 (IAM) authorization; "
        "attach the AdminReadOnlyPolicy or AdminOperatorPolicy output to your admins",
    }
}
CONDITIONS = {CONDITION: {"Fn::Equals": [{"Ref": PARAMETER}, "true"]}}


def rest_api_security(routes: list[Route]) -> dict[str, Any]:
    """What to merge into the REST API's OpenAPI body: the SigV4 security definition, and on each
    admin method a ``security`` that exists only when the condition holds."""
    when_iam = {"Fn::If": [CONDITION, [{SECURITY_NAME: []}], {"Ref": "AWS::NoValue"}]}
    paths: dict[str, Any] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = {"security": when_iam}
    return {
        "securityDefinitions": {
            SECURITY_NAME: {
                "type": "apiKey",
                "name": "Authorization",
                "in": "header",
                "x-amazon-apigateway-authtype": "awsSigv4",
            }
        },
        "paths": paths,
    }


def _route_arns(role: str, routes: list[Route], api_id: str, stage: str) -> list[str]:
    methods = ROLES[role][2]
    return [f"{api_id}/{stage}/{route.method}{route.arn_path}" for route in routes if route.method in methods]


def policy_document(role: str, routes: list[Route], arn_prefix: str, api_id: str, stage: str) -> dict[str, Any]:
    """``execute-api:Invoke`` on the exact routes of ``role`` (``arn_prefix`` ends with the account)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ModelForgeAdmin" + "".join(word.title() for word in role.split("-")),
                "Effect": "Allow",
                "Action": "execute-api:Invoke",
                "Resource": [f"{arn_prefix}:{arn}" for arn in _route_arns(role, routes, api_id, stage)],
            }
        ],
    }


def managed_policies(routes: list[Route], stage: str) -> dict[str, Any]:
    """One managed policy per role, created in IAM mode only, with this stack's route ARNs."""
    found: dict[str, Any] = {}
    for role, (logical_id, meaning, _) in ROLES.items():
        document = policy_document(
            role,
            routes,
            "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}",
            f"${{{REST_API}}}",
            stage,
        )
        for statement in document["Statement"]:
            statement["Resource"] = [{"Fn::Sub": arn} for arn in statement["Resource"]]
        found[logical_id] = {
            "Type": "AWS::IAM::ManagedPolicy",
            "Condition": CONDITION,
            "Properties": {"Description": f"ModelForge admins ({role}): {meaning}", "PolicyDocument": document},
        }
    return found


def outputs() -> dict[str, Any]:
    return {
        logical_id: {
            "Condition": CONDITION,
            "Description": f"managed policy for {role} admins ({meaning}); attach it to their IAM roles",
            "Value": {"Ref": logical_id},
        }
        for role, (logical_id, meaning, _) in ROLES.items()
    }


def gateway_responses(answer: Any) -> dict[str, Any]:
    """API Gateway's IAM refusals in the API's error shape (``answer(code, message)`` makes one):
    a signature it cannot verify, expired credentials, and a caller IAM does not allow."""
    return {
        "INVALID_SIGNATURE": {
            "StatusCode": 403,
            "ResponseTemplates": answer(
                "iam_signature_invalid",
                "the request's AWS SigV4 signature does not verify: sign it for this API's region "
                "and service execute-api (modelforge --aws-sigv4)",
            ),
        },
        "EXPIRED_TOKEN": {
            "StatusCode": 403,
            "ResponseTemplates": answer(
                "iam_credentials_expired", "the AWS credentials that signed the request have expired: renew them"
            ),
        },
        "ACCESS_DENIED": {
            "StatusCode": 403,
            "ResponseTemplates": answer(
                "iam_access_denied",
                "IAM does not allow the caller execute-api:Invoke on this admin route "
                "(attach the AdminReadOnlyPolicy or AdminOperatorPolicy of the stack)",
            ),
        },
    }


def example_policies(routes: list[Route] | None = None, stage: str | None = None) -> dict[str, dict[str, Any]]:
    """``infra/policies/<role>.json``: the policies with ``<REGION>``, ``<ACCOUNT_ID>`` and
    ``<REST_API_ID>`` (the stack's ``RestAPIId`` output) to fill in."""
    routes = admin_routes() if routes is None else routes
    stage = rest_stage() if stage is None else stage
    return {
        f"admin-{role}.json": policy_document(
            role, routes, "arn:aws:execute-api:<REGION>:<ACCOUNT_ID>", "<REST_API_ID>", stage
        )
        for role in ROLES
    }


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def write_examples(folder: Path = POLICIES_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, document in example_policies().items():
        path = folder / name
        path.write_text(render(document))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_examples():
        print(f"wrote {path}", file=sys.stderr)
