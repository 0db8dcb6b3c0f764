"""The console over HTTP, without a browser, from the in-process stack (the same app and server as
`modelforge local up`): every console answer carries the security headers (refusals included:
the app's, Chalice's and the local server's own) and its media type, `/console` is sent to
`/console/`, nothing outside the file list is ever served, and the wizard's settings check is an
admin operation; `/` is sent to the console."""

from __future__ import annotations

import json

import pytest
import requests
from chalicelib.api import console
from modelforge_protocol.versions import IMAGE_TAG_VERSION

from tests.support import raw_http
from tests.support.api import ControlPlane

HEADERS = {
    "Content-Security-Policy": console.CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _secured(response: requests.Response) -> None:
    assert HEADERS.items() <= console.SECURITY_HEADERS.items()
    for name, value in console.SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (
            response.request.method,
            response.url,
            name,
            response.headers.get(name),
        )


def test_the_page_is_served_at_console_slash_with_the_security_headers(cp: ControlPlane) -> None:
    response = cp.request("GET", "/console/")
    assert response.status_code == 200 and response.headers["Content-Type"] == "text/html; charset=utf-8"
    _secured(response)
    assert '<script type="module" src="app.js"></script>' in response.text


def test_console_without_the_slash_is_sent_to_the_page(cp: ControlPlane) -> None:
    response = cp.request("GET", "/console", allow_redirects=False)
    assert response.status_code == 308 and response.headers["Location"] == "console/"
    _secured(response)
    followed = cp.request("GET", "/console")
    assert followed.status_code == 200 and followed.url.endswith("/console/")


def test_the_root_is_sent_to_the_console_not_answered_404(cp: ControlPlane) -> None:
    response = cp.request("GET", "/", allow_redirects=False)
    assert response.status_code == 302 and response.headers["Location"] == "console/", response.text
    _secured(response)
    followed = cp.request("GET", "/")
    assert followed.status_code == 200 and followed.url == cp.base_url.rstrip("/") + "/console/"
    assert followed.headers["Content-Type"] == "text/html; charset=utf-8"


def test_the_root_sends_a_stage_prefix_to_the_stages_console() -> None:
    """Relative, as the deployed REST API serves the root under its stage (``/api/``)."""
    assert requests.compat.urljoin("https://example.com/api/", console.root_answer().headers["Location"]) == (
        "https://example.com/api/console/"
    )


@pytest.mark.parametrize("name", sorted(console.ASSETS))
def test_each_file_is_served_with_its_media_type_and_the_security_headers(cp: ControlPlane, name: str) -> None:
    response = cp.request("GET", f"/console/{name}")
    assert response.status_code == 200 and response.headers["Content-Type"] == console.ASSETS[name]
    _secured(response)
    assert response.text == (console.ASSET_DIR / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "path",
    [
        "/console/index.html",  # the page's one address is /console/ (as the OpenAPI document says)
        "/console/index.htm",
        "/console/app.py",
        "/console/..%2fapp.py",
        "/console/%2e%2e%2fconsole.py",
        "/console/..%5c..%5capp.py",
        "/console/console.py",
        "/console/APP.JS",
        "/console/app.js%00.css",
    ],
)
def test_a_name_outside_the_list_is_404_with_the_security_headers(cp: ControlPlane, path: str) -> None:
    response = cp.request("GET", path)
    assert response.status_code == 404, response.text
    _secured(response)
    assert response.json()["error"]["code"] == "console_file_not_found"


@pytest.mark.parametrize("path", ["/console/a/app.js", "/console/../app.py", "/consoles/app.js"])
def test_a_deeper_or_other_path_is_not_a_console_file(cp: ControlPlane, path: str) -> None:
    response = cp.request("GET", path)
    assert response.status_code == 404 and "console.py" not in response.text and "import" not in response.text


def test_the_console_answers_no_other_method(cp: ControlPlane) -> None:
    for method in ("POST", "PUT", "DELETE"):
        response = cp.request(method, "/console/app.js")
        assert response.status_code == 405 and response.headers["Allow"] == "GET"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/console/", 405),  # Chalice's own 405, through the app's middleware
        ("POST", "/console/app.js", 405),
        ("DELETE", "/console", 405),
        ("HEAD", "/console/", 405),
        ("OPTIONS", "/console/", 405),  # the local server's own refusals
        ("OPTIONS", "/console/app.js", 405),
        ("GET", "/console/a/app.js", 404),
    ],
)
def test_every_refusal_of_a_console_path_carries_the_security_headers(
    cp: ControlPlane, method: str, path: str, status: int
) -> None:
    response = cp.request(method, path, allow_redirects=False)
    assert response.status_code == status, response.text
    _secured(response)
    if method != "HEAD":
        assert response.json()["error"]["code"] == ("method_not_allowed" if status == 405 else "not_found")


def test_a_media_type_chalice_refuses_on_a_console_route_carries_the_security_headers(cp: ControlPlane) -> None:
    response = cp.request("GET", "/console/app.js", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415, response.text
    _secured(response)


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        ("TRACE /console/ HTTP/1.1", 405),  # a method the server has no handler for
        ("POST /console/app.js HTTP/1.1\r\nTransfer-Encoding: chunked", 411),  # refused before the body
    ],
)
def test_the_local_servers_framing_refusals_of_a_console_path_carry_the_security_headers(
    cp: ControlPlane, request_head: str, status: int
) -> None:
    raw = f"{request_head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    (answer,) = raw_http.exchange(cp.base_url, raw)
    assert answer.status == status, answer
    for name, value in console.SECURITY_HEADERS.items():
        assert answer.headers.get(name.lower()) == value, (request_head, name)


def _settings(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "control_plane_url": "https://modelforge.example.com",
        "hostname": "gpu_node",
        "accelerator_mode": "cpu",
        "state_volume": "/var/lib/modelforge/agent-state",
        "image_source": "registry",
        "image_reference": "registry.example.com/modelforge-node-agent@sha256:" + "0" * 64,
    }
    body.update(changes)
    return body


def test_the_settings_check_needs_the_admin_token(cp: ControlPlane) -> None:
    path = "/api/v1/admin/node-agent-settings/check"
    assert cp.request("POST", path, json=_settings()).json()["error"]["code"] == "admin_token_missing"
    wrong = cp.request("POST", path, json=_settings(), headers={"X-ModelForge-Admin-Token": "x" * 43})
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "admin_token_invalid"


def test_the_settings_check_answers_settings_or_problems(cp: ControlPlane) -> None:
    path = "/api/v1/admin/node-agent-settings/check"
    good = cp.admin("POST", path, json=_settings())
    assert good.status_code == 200, good.text
    assert good.json()["ok"] is True and good.json()["release"] == IMAGE_TAG_VERSION
    assert {"name": "MODELFORGE_AGENT_TLS_VERIFY", "value": "true"} in good.json()["settings"]
    bad = cp.admin("POST", path, json=_settings(image_reference="registry.example.com/modelforge-node-agent:latest"))
    assert bad.status_code == 200 and bad.json()["ok"] is False and bad.json()["settings"] == []
    assert bad.json()["problems"][0]["field"] == "image_reference"
    assert "not pinned by digest" in bad.json()["problems"][0]["message"]
    schema = cp.admin("POST", path, json=_settings(accelerator_mode="gpu"))
    assert schema.status_code == 400 and schema.json()["error"]["code"] == "invalid_request"
    assert "token" not in json.dumps(good.json()).lower()


@pytest.mark.slow
def test_the_lambda_bundle_carries_every_console_file() -> None:
    """The deployed console is the same files: `modelforge infra package` puts them in the bundle
    (shared with the other packaging tests of the session)."""
    import zipfile

    from tests.support import packaging

    names = set(zipfile.ZipFile(packaging.packaged() / "deployment.zip").namelist())
    assert "chalicelib/api/console.py" in names
    assert {f"chalicelib/api/console_assets/{name}" for name in [console.INDEX, *console.ASSETS]} <= names
