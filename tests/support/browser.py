"""Headless Chromium for the console's tests: Debian's browser (/usr/bin/chromium) driven by
Playwright, never a downloaded one, plus what a page said and fetched, and where a secret could
still be in it.

The flags keep Chromium off the network except for the pages a test opens (this machine refuses
other connections, and a refused background connection would show up as a failed request)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}


@contextmanager
def chromium() -> Iterator[Any]:
    """One headless Chromium (a Playwright ``Browser``) for as long as the ``with`` lasts."""
    if not CHROMIUM.exists():
        raise AssertionError(
            f"{CHROMIUM} is missing: install Debian's chromium (scripts/test installs it as root; "
            "otherwise: sudo apt-get install -y --no-install-recommends chromium)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class BrowserLog:
    """What one page logged, threw and fetched, and the refusals the test expects."""

    messages: list[tuple[str, str, str]] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[tuple[str, str | None]] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    expected: list[tuple[int, str]] = field(default_factory=list)

    @classmethod
    def of(cls, page: Any) -> BrowserLog:
        log = cls()
        page.on(
            "console",
            lambda message: log.messages.append((message.type, message.text, message.location.get("url", ""))),
        )
        page.on("pageerror", lambda error: log.page_errors.append(str(error)))
        page.on("requestfailed", lambda request: log.failed.append((request.url, request.failure)))
        page.on(
            "response",
            lambda response: log.refused.append((response.status, response.url)) if response.status >= 400 else None,
        )
        page.on("request", lambda request: log.urls.append(request.url))
        page.on("framenavigated", lambda frame: log.urls.append(frame.url))
        return log

    def expect_refusal(self, status: int, path: str) -> None:
        """The test makes the API refuse a request to ``path`` on purpose (a wrong admin token)."""
        self.expected.append((status, path))

    def _expected(self, status: int | None, url: str) -> bool:
        return any((status is None or status == known) and urlsplit(url).path == path for known, path in self.expected)

    def assert_clean(self, secrets: list[str]) -> None:
        """No script error, no failed request, no refusal the test did not ask for, no console
        error or warning (Chromium logs each refused fetch as "Failed to load resource": only
        the expected ones pass), and no secret in any URL or console message."""
        assert self.page_errors == [], self.page_errors
        assert self.failed == [], self.failed
        assert [entry for entry in self.refused if not self._expected(*entry)] == [], self.refused
        noisy = [
            (kind, text, url)
            for kind, text, url in self.messages
            if kind in ("error", "warning")
            and not (text.startswith("Failed to load resource") and self._expected(None, url))
        ]
        assert noisy == [], noisy
        for secret in secrets:
            assert not [url for url in self.urls if secret in url], "a secret was in a URL"
            assert not [text for _, text, _ in self.messages if secret in text], "a secret was in a console message"


_ATTRIBUTES_AND_VALUES = """(secret) => {
  const hits = [];
  for (const element of document.querySelectorAll("*")) {
    for (const attribute of element.attributes) {
      if (attribute.name.includes(secret) || attribute.value.includes(secret)) {
        hits.push(`${element.tagName} @${attribute.name}`);
      }
    }
    if (typeof element.value === "string" && element.value.includes(secret)) hits.push(`${element.tagName}.value`);
  }
  if (document.title.includes(secret)) hits.push("title");
  return hits;
}"""

_STORAGE = """async () => ({
  local: JSON.stringify(Object.entries(localStorage)),
  session: JSON.stringify(Object.entries(sessionStorage)),
  indexedDB: (await indexedDB.databases()).map((database) => database.name),
  cookie: document.cookie,
  href: location.href,
  historyLength: history.length,
})"""


def storage(page: Any) -> dict[str, Any]:
    """The page's storages, cookies, URL and history length."""
    return dict(page.evaluate(_STORAGE))


def assert_secret_gone(page: Any, secret: str) -> None:
    """``secret`` is nowhere in the page: not in its HTML, any attribute or field value, the
    title, the accessibility tree (Chromium's own, and Playwright's ARIA snapshot), a storage,
    a cookie or the URL."""
    assert secret not in page.content(), "the secret is in the page's HTML"
    assert page.evaluate(_ATTRIBUTES_AND_VALUES, secret) == [], "the secret is in an attribute or a field"
    tree = page.context.new_cdp_session(page).send("Accessibility.getFullAXTree")
    assert len(tree["nodes"]) > 10 and secret not in json.dumps(tree), "the secret is in the accessibility tree"
    assert secret not in page.locator("body").aria_snapshot()
    held = storage(page)
    assert held["local"] == "[]" and held["session"] == "[]" and held["indexedDB"] == [] and held["cookie"] == "", held
    assert page.context.cookies() == []
    assert secret not in held["href"]
