"""The deployment artefacts: one source of truth for resources, the shared package inside the
Lambda bundle, and a template that cfn-lint accepts."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from chalicelib.config import resources
from chalicelib.stores.models import MODELS_BY_LOGICAL_NAME
from modelforge_local_stack.provision import RESOURCE_ENV, load_resources

from tests.support import packaging
from tests.support.cfn import resolve

TABLE_OF_MODEL = {table.name: table.logical_id for table in resources.TABLES}


def test_the_catalogue_the_models_and_the_template_name_the_same_resources() -> None:
    deployed = load_resources()
    assert set(MODELS_BY_LOGICAL_NAME) == {table.name for table in resources.TABLES}
    for resource in resources.ALL:
        kind = "AWS::DynamoDB::Table" if resource.kind == "table" else "AWS::S3::Bucket"
        assert deployed[resource.logical_id]["Type"] == kind, resource
    assert {
        logical_id for logical_id, item in deployed.items() if item["Type"].startswith(("AWS::DynamoDB", "AWS::S3"))
    } == {resource.logical_id for resource in resources.ALL}


def test_model_keys_match_the_deployed_table_definitions() -> None:
    resources = load_resources()
    for logical, model in MODELS_BY_LOGICAL_NAME.items():
        key_schema = resources[TABLE_OF_MODEL[logical]]["Properties"]["KeySchema"]
        expected = [{"AttributeName": model._hash_key_attribute().attr_name, "KeyType": "HASH"}]
        if model._range_key_attribute() is not None:
            expected.append({"AttributeName": model._range_key_attribute().attr_name, "KeyType": "RANGE"})
        assert key_schema == expected


def test_the_sweep_index_matches_the_deployed_definition() -> None:
    from chalicelib.stores.models import NodeModel

    index = load_resources()["NodesTable"]["Properties"]["GlobalSecondaryIndexes"][0]
    assert index["IndexName"] == NodeModel.by_liveness.Meta.index_name
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert [k["AttributeName"] for k in index["KeySchema"]] == ["liveness_shard", "heartbeat_bucket"]


def test_deployable_liveness_thresholds_always_have_offline_above_stale() -> None:
    from chalicelib.config.settings import load_settings
    from modelforge_local_stack.infra import PARAMETERS

    stale = PARAMETERS["StaleAfterSeconds"]["AllowedValues"]
    offline = PARAMETERS["OfflineAfterSeconds"]["AllowedValues"]
    assert min(offline) > max(stale)
    assert (
        PARAMETERS["StaleAfterSeconds"]["Default"] in stale and PARAMETERS["OfflineAfterSeconds"]["Default"] in offline
    )
    interval_default = PARAMETERS["HeartbeatIntervalSeconds"]["Default"]
    for low in stale:  # every deployable pair is accepted by the functions' own validation
        for high in offline:
            load_settings(
                {
                    **resources.local_names("deployed"),
                    "MODELFORGE_ADMIN_TOKEN_SHA256": "a" * 64,
                    "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": str(interval_default),
                    "MODELFORGE_NODE_STALE_AFTER_SECONDS": str(low),
                    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": str(high),
                }
            )


def test_the_deployed_stack_never_allows_simulated_nodes() -> None:
    """MODELFORGE_ALLOW_SIMULATED_NODES is in no deployed function's environment (nor the Chalice
    stages'), so the deployed control plane keeps its default: simulated nodes are refused."""
    from modelforge_local_stack.infra import merge_template

    template = merge_template()
    functions = {
        name: resource["Properties"]["Environment"]["Variables"]
        for name, resource in template["Resources"].items()
        if "Environment" in resource.get("Properties", {})
    }
    assert "APIHandler" in functions
    for name, variables in functions.items():
        assert "MODELFORGE_ALLOW_SIMULATED_NODES" not in variables, name
    config = json.loads((Path(__file__).resolve().parents[2] / "functions" / ".chalice" / "config.json").read_text())
    for stage in config["stages"].values():
        assert "MODELFORGE_ALLOW_SIMULATED_NODES" not in stage.get("environment_variables", {})


@pytest.fixture(scope="module")
def packaged() -> Path:
    return packaging.packaged()  # once per session: tests/integration/test_aws_stack.py reads it too


def test_lambda_bundle_carries_the_shared_protocol_package_and_no_agent_code(packaged: Path) -> None:
    names = zipfile.ZipFile(packaged / "deployment.zip").namelist()
    assert "modelforge_protocol/versions.py" in names and "modelforge_logging/jsonlog.py" in names
    assert "app.py" in names and "chalicelib/services/enrollments.py" in names
    assert not any(
        name.startswith(
            ("modelforge_node_agent/", "modelforge_runtime_worker/", "modelforge_cli/", "modelforge_local_stack/")
        )
        for name in names
    )


def test_template_wires_every_function_to_the_tables_and_the_stream(packaged: Path) -> None:
    template = json.loads((packaged / "sam.json").read_text())
    resources = template["Resources"]
    for table in TABLE_OF_MODEL.values():
        assert resources[table]["Type"] == "AWS::DynamoDB::Table"
    for function in ("APIHandler", "LivenessSweep", "StateLog"):
        variables = resources[function]["Properties"]["Environment"]["Variables"]
        for logical_id, variable in RESOURCE_ENV.items():  # every table and the bucket, by reference
            assert variables[variable] == {"Ref": logical_id}, (function, variable)
        assert variables["MODELFORGE_ADMIN_TOKEN_SHA256"] == {"Ref": "AdminTokenSha256"}
    stream = resources["StateLog"]["Properties"]["Events"]["StateLogDynamodbEventSource"]["Properties"]["Stream"]
    assert stream == {"Fn::GetAtt": ["OutboxTable", "StreamArn"]}
    assert template["Parameters"]["AdminTokenSha256"]["NoEcho"] is True


def test_template_passes_cfn_lint(packaged: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), str(packaged / "sam.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_template_throttles_the_stage_and_the_agent_routes_that_write(packaged: Path) -> None:
    from modelforge_local_stack.http_server import load_app
    from modelforge_local_stack.infra import THROTTLED_ROUTES

    template = json.loads((packaged / "sam.json").read_text())
    settings = template["Resources"]["RestAPI"]["Properties"]["MethodSettings"]
    by_path = {(entry["ResourcePath"], entry["HttpMethod"]): entry for entry in settings}
    assert by_path[("/*", "*")]["ThrottlingRateLimit"] == {"Ref": "ApiThrottleRateLimit"}
    assert by_path[("/~1api~1v1~1agent~1enroll", "POST")]["ThrottlingBurstLimit"] == {"Ref": "EnrollThrottleBurstLimit"}
    routes = load_app().app.routes
    for path, method, rate, burst in THROTTLED_ROUTES:
        assert path == "/*" or method in routes[path], f"{method} {path} is not a route of the app"
        for parameter in (rate, burst):
            assert template["Parameters"][parameter]["MinValue"] == 1


@pytest.mark.parametrize("iam", [False, True], ids=["token-only", "iam-mode"])
def test_gateway_refusals_use_the_error_shape_and_never_echo_the_request(packaged: Path, iam: bool) -> None:
    template = resolve(json.loads((packaged / "sam.json").read_text()), {"AdminRoutesUseIam": iam})
    responses = template["Resources"]["RestAPI"]["Properties"]["GatewayResponses"]
    assert {"MISSING_AUTHENTICATION_TOKEN", "THROTTLED", "DEFAULT_4XX", "DEFAULT_5XX", "ACCESS_DENIED"} <= set(
        responses
    )
    for kind, response in responses.items():
        body = json.loads(response["ResponseTemplates"]["application/json"])
        assert set(body["error"]) == {"code", "message"}, kind
        assert "$" not in json.dumps(body)  # no $context or $input: nothing of the request comes back
    assert responses["MISSING_AUTHENTICATION_TOKEN"]["StatusCode"] == 404
    unsigned = json.loads(responses["MISSING_AUTHENTICATION_TOKEN"]["ResponseTemplates"]["application/json"])
    assert ("SigV4" in unsigned["error"]["message"]) is iam  # IAM mode: an unsigned admin call lands here too


@pytest.mark.parametrize("iam", [False, True], ids=["token-only", "iam-mode"])
def test_every_gateway_refusal_carries_the_consoles_security_headers(packaged: Path, iam: bool) -> None:
    """A gateway response answers console paths too (an unknown file below /console/, a method a
    console route lacks), and every console answer carries the headers: each response sets them,
    as static values in single quotes (API Gateway's form)."""
    from chalicelib.api import console

    template = resolve(json.loads((packaged / "sam.json").read_text()), {"AdminRoutesUseIam": iam})
    responses = template["Resources"]["RestAPI"]["Properties"]["GatewayResponses"]
    assert {"MISSING_AUTHENTICATION_TOKEN", "DEFAULT_4XX", "DEFAULT_5XX"} <= set(responses)
    for kind, response in responses.items():
        headers = response["ResponseParameters"]["Headers"]
        for name, value in console.SECURITY_HEADERS.items():
            assert headers[name] == f"'{value}'", (kind, name)
    assert responses["THROTTLED"]["ResponseParameters"]["Headers"]["Retry-After"] == "'1'"


def test_gateway_refusals_answer_what_the_local_server_and_the_openapi_document_say(packaged: Path) -> None:
    """An unknown path is 404 not_found deployed as locally (API Gateway answers a method a path
    lacks the same way: docs/DEPLOY.md), and throttling is the 429 every operation lists."""
    from chalicelib.api import openapi
    from modelforge_local_stack.http_server import load_app

    template = resolve(json.loads((packaged / "sam.json").read_text()), {"AdminRoutesUseIam": False})
    responses = template["Resources"]["RestAPI"]["Properties"]["GatewayResponses"]

    def code(kind: str) -> str:
        return json.loads(responses[kind]["ResponseTemplates"]["application/json"])["error"]["code"]

    assert code("MISSING_AUTHENTICATION_TOKEN") == "not_found"
    assert responses["THROTTLED"]["StatusCode"] == 429
    for operation in openapi.operations(load_app().app.routes):
        assert code("THROTTLED") in operation.errors()[429], operation.path


@pytest.mark.parametrize("package", ["modelforge_protocol", "modelforge_logging"])
def test_functions_folder_carries_the_shared_packages_for_any_chalice_command(package: str) -> None:
    """`chalice package`/`deploy` run in functions/ directly bundle vendor/: each shared package is
    a committed link there, so no documented path deploys a bundle that cannot import it."""
    from modelforge_local_stack.catalogue import FUNCTIONS_DIR, REPO_ROOT

    vendored = FUNCTIONS_DIR / "vendor" / package
    assert vendored.is_symlink()
    assert vendored.resolve() == (REPO_ROOT / "protocol" / package).resolve()
    assert (vendored / "__init__.py").is_file()


def test_the_bundle_carries_unchecked_hash_bytecode_beside_each_source_and_no_stray_pyc(packaged: Path) -> None:
    import importlib.util

    with zipfile.ZipFile(packaged / "deployment.zip") as bundle:
        names = set(bundle.namelist())
        sources = {name for name in names if name.endswith(".py")}
        pycs = {name for name in names if name.endswith(".pyc")}
        tag = sys.implementation.cache_tag
        expected = {
            f"{name.rpartition('/')[0]}/__pycache__/{name.rpartition('/')[2][:-3]}.{tag}.pyc".lstrip("/")
            for name in sources
        }
        assert pycs <= expected  # nothing stray (a developer tree's timestamp pycs used to ride along)
        assert {"__pycache__/app.cpython-311.pyc".replace("cpython-311", tag)} <= pycs
        assert len(pycs) >= 0.95 * len(sources)  # only a source this Python cannot compile lacks one
        for name in ("__pycache__/app", "chalicelib/__pycache__/instance", "botocore/__pycache__/client"):
            header = bundle.read(f"{name}.{tag}.pyc")[:8]
            assert header[:4] == importlib.util.MAGIC_NUMBER
            assert int.from_bytes(header[4:8], "little") == 0b01  # hash-based, source not checked (PEP 552)


def test_the_unpacked_bundle_imports_the_app_from_bytecode_alone_read_only(packaged: Path, tmp_path: Path) -> None:
    """As Lambda runs it: the bundle alone on the path (no site-packages), its folder read-only."""
    task = tmp_path / "task"
    with zipfile.ZipFile(packaged / "deployment.zip") as bundle:
        bundle.extractall(task)
    for path in [task, *task.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    env = {"PATH": "/usr/bin:/bin", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-v", "-c", "import app; print(app.app.app_name)"],
            cwd=task, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        for path in [task, *task.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "modelforge-control-plane"
    loaded = [line for line in done.stderr.splitlines() if line.startswith("# code object from") and str(task) in line]
    assert any("__pycache__/app." in line for line in loaded)
    compiled_from_source = [line for line in loaded if line.rstrip("'").endswith(".py")]
    assert compiled_from_source == []
