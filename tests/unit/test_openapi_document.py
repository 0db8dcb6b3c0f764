"""The OpenAPI document: checked in as generated, valid OpenAPI 3.1, built from the operations the
app's routes carry (a route without one is refused), the protocol's own request schemas, and every
error code the control plane raises.

That each operation answers only what the document says (statuses, codes and bodies) is checked
over HTTP by the fuzz test (tests/integration/test_api_fuzz.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from chalicelib.api import openapi
from chalicelib.services import channel
from jsonschema import Draft202012Validator

from tests.support.processes import run_to_exit

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "functions"
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _routes() -> Any:
    from modelforge_local_stack.http_server import load_app

    return load_app().app.routes


def _built() -> dict[str, Any]:
    return openapi.build(_routes())


def test_the_checked_in_document_is_the_generated_one() -> None:
    from modelforge_local_stack import openapi_doc

    checked_in = openapi_doc.DOCUMENT_PATH.read_text(encoding="utf-8")
    assert checked_in == openapi_doc.render(), (
        f"docs/openapi.json differs from the document the control plane serves: run `{openapi_doc.REGENERATE}` "
        "and commit the result"
    )


def test_the_regenerate_command_checks_and_writes(tmp_path: Path) -> None:
    from modelforge_local_stack import openapi_doc

    target = tmp_path / "openapi.json"
    assert openapi_doc.main(["--check", "--output", str(target)]) == 1
    assert openapi_doc.main(["--output", str(target)]) == 0
    assert openapi_doc.main(["--check", "--output", str(target)]) == 0
    assert json.loads(target.read_text()) == _built()


def test_the_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import validate
    from openapi_spec_validator.validation import OpenAPIV31SpecValidator

    document = _built()
    assert document["openapi"].startswith("3.1")
    validate(document, cls=OpenAPIV31SpecValidator)


def test_build_route_registered_without_an_operation_refused() -> None:
    from chalice import Chalice

    bare = Chalice(app_name="bare")

    @bare.route("/undeclared", methods=["GET"])
    def undeclared() -> dict[str, Any]:
        return {}

    with pytest.raises(ValueError, match="GET /undeclared was not registered with its operation"):
        openapi.build(bare.routes)


def test_build_operation_under_another_route_refused() -> None:
    from chalice import Chalice
    from chalicelib.api import operations
    from chalicelib.api.operation import declare

    moved = Chalice(app_name="moved")
    moved.route("/api/v1/elsewhere", methods=["GET"])(declare(lambda: {}, operations.GET_HEALTH))
    with pytest.raises(ValueError, match="GET /api/v1/elsewhere"):
        openapi.build(moved.routes)


def test_build_paths_follow_the_apps_registration_order() -> None:
    routes = _routes()
    documented = [(path, method.upper()) for path, item in _built()["paths"].items() for method in item]
    assert documented == [(path, method) for path, methods in routes.items() for method in methods]


def test_request_bodies_are_the_protocol_schemas() -> None:
    document = _built()
    components = document["components"]["schemas"]
    for name, source in openapi.REQUEST_SCHEMA_SOURCES.items():
        assert components[name] == openapi.portable(source), name
    used = {op.request for op in openapi.operations(_routes()) if op.request is not None}
    assert used <= set(openapi.REQUEST_SCHEMA_SOURCES), used - set(openapi.REQUEST_SCHEMA_SOURCES)


def _schemas(node: Any) -> list[dict[str, Any]]:
    """Every object in the document that carries a ``pattern``."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            found.append(node)
        for value in node.values():
            found.extend(_schemas(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_schemas(value))
    return found


def test_schemas_are_json_schema_2020_12_with_portable_patterns() -> None:
    document = _built()
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    for holder in _schemas(document):
        assert "\\Z" not in holder["pattern"], holder  # Python-only; ECMA-262 reads it as a literal Z
        re.compile(holder["pattern"])


def test_portable_patterns_accept_and_refuse_what_the_protocol_patterns_do() -> None:
    from modelforge_protocol import schemas

    original = re.compile(schemas.NODE_ID_PATTERN)
    written = re.compile(openapi.portable({"pattern": schemas.NODE_ID_PATTERN})["pattern"])
    for candidate in ("node_" + "a" * 32, "node_" + "a" * 32 + "Z", "node_" + "a" * 31, "node_" + "a" * 33):
        assert bool(original.match(candidate)) == bool(written.fullmatch(candidate)), candidate


#: How the control plane raises an error with a literal code: ``Kind("code", ...)``, ``conflict("code", ...)``
#: and ``not_found("what")`` (code ``what_not_found``).
_RAISED = re.compile(
    r'\b(?:Invalid|TooLarge|Unauthenticated|Forbidden|NotFound|Conflict|Gone|RateLimited|conflict)\(\s*"([a-z_]+)"'
)
_NOT_FOUND = re.compile(r'\bnot_found\(\s*"([a-z_]+)"\s*\)')


def test_every_error_code_the_control_plane_raises_is_documented() -> None:
    sources = [FUNCTIONS / "app.py", *sorted((FUNCTIONS / "chalicelib").rglob("*.py"))]
    raised: dict[str, str] = {}
    for source in sources:
        text = source.read_text(encoding="utf-8")
        raised.update({code: source.name for code in _RAISED.findall(text)})
        raised.update({f"{what}_not_found": source.name for what in _NOT_FOUND.findall(text)})
    raised.update({"invalid_request": "errors.py"})  # invalid_request(...) builds it
    documented = {code for op in openapi.operations(_routes()) for codes in op.errors().values() for code in codes}
    documented |= set(channel.CHANNEL_ERROR_CODES)  # the WebSocket handlers' (docs/API.md: test below)
    undocumented = {code: where for code, where in raised.items() if code not in documented}
    assert len(raised) > 25, raised  # the scan still finds the codes
    assert not undocumented, (
        f"error codes raised but in no operation of functions/chalicelib/api/operations.py: {undocumented}"
    )


def test_importing_the_api_function_leaves_the_document_for_its_first_request() -> None:
    probe = "import sys, app\nprint('chalicelib.api.openapi' in sys.modules)"
    done = run_to_exit([sys.executable, "-c", probe], cwd=FUNCTIONS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_operation_query_names_query_parameters_only() -> None:
    from chalicelib.api import operations

    assert operations.LIST_WORK.query_names() == {"limit", "next_token", "status", "capability"}
    assert operations.GET_WORK.query_names() == set()  # its work_id is a path parameter


def test_endpoint_route_carries_its_operation_and_nothing_else_lists_it() -> None:
    from chalicelib.api import operations
    from chalicelib.api.operation import declared

    entry = _routes()["/api/v1/admin/work/{work_id}"]["GET"]
    assert declared(entry.view_function) is operations.GET_WORK


def test_every_channel_error_code_is_in_api_md() -> None:
    text = (FUNCTIONS.parent / "docs" / "API.md").read_text(encoding="utf-8")
    assert not [code for code in channel.CHANNEL_ERROR_CODES if not re.search(rf"\b{code}\b", text)]
