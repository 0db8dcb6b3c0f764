"""The console's files, read as files: what is served is exactly the folder's content, the page
loads only those files, and the scripts have no way to put a secret where the page forbids it
(no HTML parsing, no storage, no cookie, no log, no URL built from a token). The browser test
(tests/integration/test_console_browser.py) checks the same things in a running page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from chalicelib.api import console

FILES = sorted(path.name for path in console.ASSET_DIR.iterdir())
SCRIPTS = sorted(name for name in console.ASSETS if name.endswith(".js"))


def _text(name: str) -> str:
    return (console.ASSET_DIR / name).read_text(encoding="utf-8")


def test_the_served_files_are_exactly_the_folders_files() -> None:
    assert sorted([console.INDEX, *console.ASSETS]) == FILES


def test_find_serves_listed_names_only() -> None:
    for name in console.ASSETS:
        found = console.find(name)
        assert found is not None and found.body == _text(name)
    assert console.page().body == _text(console.INDEX)
    # the page has one address, /console/: index.html is no file name of /console/{name}
    for name in [
        console.INDEX,
        "",
        ".",
        "..",
        "../app.py",
        "..%2fapp.py",
        "/etc/passwd",
        "APP.JS",
        "app.js/",
        "console.py",
    ]:
        assert console.find(name) is None, name


def test_console_paths_are_console_and_everything_below_it() -> None:
    for path in ("/console", "/console/", "/console/app.js", "/console/{name}", "/console/a/b"):
        assert console.is_console_path(path), path
    for path in ("/", "/consoles/app.js", "/consolex", "/api/v1/console", "console/", "//console"):
        assert not console.is_console_path(path), path


def test_media_types_match_the_file_kinds() -> None:
    assert console.page().content_type == "text/html; charset=utf-8"
    for name, content_type in console.ASSETS.items():
        kind = Path(name).suffix
        assert content_type == {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}[kind]


def test_the_policy_allows_no_inline_code_no_other_origin_and_no_framing() -> None:
    policy = dict(part.split(" ", 1) for part in console.CONTENT_SECURITY_POLICY.split("; "))
    assert policy["default-src"] == "'none'" and policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert (
        policy["connect-src"] == "'self'" and policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'"
    )
    assert "unsafe" not in console.CONTENT_SECURITY_POLICY and "http" not in console.CONTENT_SECURITY_POLICY
    assert console.SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"
    assert console.SECURITY_HEADERS["Referrer-Policy"] == "no-referrer"


def test_the_page_loads_only_listed_files_and_has_no_inline_script_or_style() -> None:
    page = _text(console.INDEX)
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sorted(ref for ref in referenced if not ref.startswith("data:")) == ["app.js", "styles.css"]
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) == []
    assert "<style" not in page and "style=" not in page and re.search(r"\son[a-z]+=", page) is None


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_import_only_listed_modules_by_relative_url(name: str) -> None:
    imports = re.findall(r'^import .* from "([^"]+)";$', _text(name), flags=re.MULTILINE)
    assert all(target.startswith("./") and target[2:] in console.ASSETS for target in imports), imports


#: What no console script may use: HTML parsing (a DOM XSS sink), storage, cookies, logging,
#: dynamic code, and navigation or history changes (a URL could carry a secret).
FORBIDDEN = (
    "innerHTML",
    "outerHTML",
    "insertAdjacentHTML",
    "document.write",
    "eval(",
    "new Function",
    "localStorage",
    "sessionStorage",
    "indexedDB",
    "document.cookie",
    "console.",
    "caches.",
    "history.",
    "location.href",
    "location.assign",
    "location.replace",
    "location.hash",
    "window.open",
    "postMessage",
    'setAttribute("value"',
)


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_use_no_sink_storage_log_or_navigation(name: str) -> None:
    text = _text(name)
    assert [word for word in FORBIDDEN if word in text] == []


def test_the_token_is_read_from_memory_when_copied_not_from_the_page() -> None:
    wizard = _text("enroll.js")
    assert "copyText(secret" in wizard and "textContent = secret" not in wizard
