"""The OpenAPI document: checked in as generated, valid OpenAPI 3.1, the same routes as the app both
ways, the protocol's own request schemas, and every error code the control plane raises.

That each operation answers only what the document says (statuses, codes and bodies) is checked
over HTTP by the fuzz test (tests/integration/test_api_fuzz.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from chalicelib.api import openapi
from jsonschema import Draft202012Validator

from tests.support.processes import run_to_exit

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "functions"
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _app_routes() -> dict[str, set[str]]:
    from modelforge_local_stack.http_server import load_app

    return {path: set(methods) for path, methods in load_app().app.routes.items()}


def _document_routes(document: dict[str, Any]) -> dict[str, set[str]]:
    return {path: {method.upper() for method in item if method in METHODS} for path, item in document["paths"].items()}


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
    assert json.loads(target.read_text()) == openapi.build()


def test_the_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import validate
    from openapi_spec_validator.validation import OpenAPIV31SpecValidator

    document = openapi.build()
    assert document["openapi"].startswith("3.1")
    validate(document, cls=OpenAPIV31SpecValidator)


def test_every_route_of_the_app_is_documented_with_the_same_methods_and_nothing_else() -> None:
    app_routes, documented = _app_routes(), _document_routes(openapi.build())
    missing = {path: methods - documented.get(path, set()) for path, methods in app_routes.items()}
    extra = {path: methods - app_routes.get(path, set()) for path, methods in documented.items()}
    assert not {path: m for path, m in missing.items() if m}, f"routes the document lacks: {missing}"
    assert not {path: m for path, m in extra.items() if m}, f"documented operations the app lacks: {extra}"


def test_request_bodies_are_the_protocol_schemas() -> None:
    document = openapi.build()
    components = document["components"]["schemas"]
    for name, source in openapi.REQUEST_SCHEMA_SOURCES.items():
        assert components[name] == openapi.portable(source), name
    used = {op.request for op in openapi.OPERATIONS if op.request is not None}
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
    document = openapi.build()
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


def test_the_page_limit_is_the_apps() -> None:
    from modelforge_local_stack.http_server import load_app

    assert openapi.MAX_PAGE == load_app().MAX_PAGE


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
    documented = {code for operation in openapi.OPERATIONS for codes in operation.errors().values() for code in codes}
    undocumented = {code: where for code, where in raised.items() if code not in documented}
    assert len(raised) > 25, raised  # the scan still finds the codes
    assert not undocumented, (
        f"error codes raised but in no operation of functions/chalicelib/api/openapi.py: {undocumented}"
    )


def test_importing_the_api_function_leaves_the_document_for_its_first_request() -> None:
    probe = "import sys, app\nprint('chalicelib.api.openapi' in sys.modules)"
    done = run_to_exit([sys.executable, "-c", probe], cwd=FUNCTIONS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
