"""The served contract: `GET /api/v1/openapi.json` without authentication is docs/openapi.json, and
what is not in it (an unknown path, a method a path lacks) answers in the API's error shape:
404 `not_found`, 405 `method_not_allowed` with `Allow`. Over HTTP to the in-process stack."""

from __future__ import annotations

import json
import re

import pytest
import requests

from tests.support.api import ControlPlane

UNDOCUMENTED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD")
#: a value for any path parameter (no such resource: the method check comes first anyway)
SOME_ID = "node_" + "0" * 32


def _error(response: requests.Response, status: int, code: str) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/json")
    if response.request.method == "HEAD":
        assert response.content == b""
        return
    error = response.json()["error"]
    assert error["code"] == code and isinstance(error["message"], str) and error["message"], error


def test_the_document_is_served_without_authentication_and_is_the_checked_in_one(cp: ControlPlane) -> None:
    from modelforge_local_stack import openapi_doc

    response = cp.request("GET", "/api/v1/openapi.json")  # no admin token, no credential
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    checked_in = json.loads(openapi_doc.DOCUMENT_PATH.read_text(encoding="utf-8"))
    assert response.json() == checked_in, f"docs/openapi.json is out of date: run `{openapi_doc.REGENERATE}`"


def test_the_document_refuses_query_parameters_like_every_operation(cp: ControlPlane) -> None:
    _error(cp.request("GET", "/api/v1/openapi.json", params={"format": "yaml"}), 400, "invalid_request")


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "OPTIONS"])
@pytest.mark.parametrize("path", ["/index.html", "/api/v2/nodes", "/api/v1/admin/nodes/x/y/z", "/api/v1/nothing-here"])
def test_an_unknown_path_is_404_not_found_whatever_the_method(cp: ControlPlane, method: str, path: str) -> None:
    _error(cp.request(method, path, headers={"Authorization": "Bearer mfn.secret"}), 404, "not_found")


def test_a_method_a_path_lacks_is_405_method_not_allowed_naming_the_methods_it_has(cp: ControlPlane) -> None:
    document = cp.request("GET", "/api/v1/openapi.json").json()
    checked = 0
    for path, item in document["paths"].items():
        documented = {method.upper() for method in item}
        concrete = re.sub(r"\{[a-z_]+\}", SOME_ID, path)
        for method in UNDOCUMENTED_METHODS:
            if method in documented:
                continue
            response = cp.admin(method, concrete)
            _error(response, 405, "method_not_allowed")
            allowed = {name.strip() for name in response.headers["Allow"].split(",")}
            assert allowed == documented, (method, path, response.headers["Allow"])
            checked += 1
    assert checked > 60, checked


@pytest.mark.parametrize("method", ["TRACE", "QUERY", "BREW"])
def test_a_method_this_server_has_no_handler_for_is_refused_like_any_other(cp: ControlPlane, method: str) -> None:
    """Not 501: http.server's answer for a method it cannot dispatch would be a server error."""
    response = cp.request(method, "/api/v1/health")
    _error(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "GET"
    _error(cp.request(method, "/api/v2/health"), 404, "not_found")
