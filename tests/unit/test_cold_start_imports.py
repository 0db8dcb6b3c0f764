"""A cold start imports only what the API needs to start: the heavy libraries that only some
requests use are imported by those requests (bench/cold_start.py prints the CPU figures)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from tests.support import bench_scripts
from tests.support.processes import run_to_exit

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
DEFERRED = ("jsonschema", "boto3")


def _modules_after(code: str) -> dict[str, bool]:
    probe = code + f"\nimport json, sys\nprint(json.dumps({{name: name in sys.modules for name in {DEFERRED!r}}}))"
    done = run_to_exit([sys.executable, "-c", probe], cwd=FUNCTIONS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_api_function_leaves_jsonschema_and_boto3_for_the_requests_that_need_them() -> None:
    assert _modules_after("import app") == {name: False for name in DEFERRED}


def _route_imports(function: str) -> set[str]:
    """The modules a route of app.py imports inside its body (``from chalicelib.x import y`` -> x.y)."""
    tree = ast.parse((FUNCTIONS / "app.py").read_text())
    route = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
    return {
        f"{node.module}.{alias.name}"
        for node in ast.walk(route)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_importing_the_api_function_leaves_each_route_s_services_for_its_first_request() -> None:
    probe = "import app, json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('chalicelib.'))))"
    done = run_to_exit([sys.executable, "-c", probe], cwd=FUNCTIONS)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    services = ("enrollments", "listing", "node_agent_settings", "nodes", "readiness", "sweep", "work")
    deferred = {f"chalicelib.services.{name}" for name in services}
    deferred |= {"chalicelib.api.views", "chalicelib.domain.requests"}
    assert not deferred & loaded


def test_the_bench_s_first_heartbeat_loads_what_the_heartbeat_route_imports() -> None:
    from chalicelib import instance

    assert set(instance.HEARTBEAT_ROUTE_IMPORTS) == _route_imports("heartbeat")


def test_the_first_validated_body_imports_jsonschema() -> None:
    loaded = _modules_after("import app\nfrom chalicelib.domain import validation\nvalidation._validator('HEARTBEAT')")
    assert loaded["jsonschema"] is True


def test_cold_start_bench_prints_the_three_figures() -> None:
    ran = bench_scripts.run("cold_start", "--runs", "1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    for name in ("import boto3", "import app", "first heartbeat's imports"):
        assert name in out
