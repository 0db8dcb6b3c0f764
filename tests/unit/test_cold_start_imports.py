"""A cold start imports only what the API needs to start: the heavy libraries that only some
requests use are imported by those requests (bench/cold_start.py prints the CPU figures)."""

from __future__ import annotations

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


def test_the_first_validated_body_imports_jsonschema() -> None:
    loaded = _modules_after("import app\nfrom chalicelib.domain import validation\nvalidation._validator('HEARTBEAT')")
    assert loaded["jsonschema"] is True


def test_cold_start_bench_prints_the_three_figures() -> None:
    ran = bench_scripts.run("cold_start", "--runs", "1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    for name in ("import boto3", "import app", "first heartbeat's imports"):
        assert name in out
