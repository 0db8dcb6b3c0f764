"""The console's Work page in headless Chromium against the local stack, found by role and name:
the link "Work", the list filtered by "Status" and "Capability", an image submitted for `ocr`
with "Image" and "Submit", an item's attempts and errors, "Cancel work" behind its confirmation,
and a succeeded OCR item drawn as its image with each line's box over it and its text beside it
(read through the admin API: the CSP is unchanged). Also: every time on the page in one format,
and the Hardware table within a 900 px window. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from chalicelib.api import console as console_module
from playwright.sync_api import expect

from tests.conftest import ADMIN_TOKEN, repo_root
from tests.support.api import AgentIdentity, ControlPlane, gpu_inventory
from tests.support.browser import VIEWPORT, BrowserLog, chromium
from tests.support.work_items import claim_until, finish

pytestmark = pytest.mark.slow
expect.set_options(timeout=15_000)

ARTIFACTS = repo_root() / "test-artifacts"
TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
WIDTH, HEIGHT = 240, 120
#: two text lines, as the worker's `ocr` answers them (4-point boxes in the image's pixels)
LINES = [
    {"text": "first line", "score": 0.98, "box": [[20, 20], [200, 20], [200, 50], [20, 50]]},
    {"text": "second line", "score": 0.61, "box": [[20, 70], [160, 70], [160, 100], [20, 100]]},
]


def _png(width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """A light grey RGB PNG (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\xee\xee\xee" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


def _page(browser: Any, viewport: dict[str, int]) -> tuple[Any, Any, BrowserLog]:
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    return context, page, BrowserLog.of(page)


def _sign_in(page: Any, url: str) -> None:
    response = page.goto(f"{url}/console/")
    assert response.headers["content-security-policy"] == console_module.CONTENT_SECURITY_POLICY
    page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Hardware", level=1)).to_be_visible()


def _screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"))


_PIXELS = """(canvas, points) => {
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  return points.map(([x, y]) => Array.from(data.slice((y * canvas.width + x) * 4, (y * canvas.width + x) * 4 + 4)));
}"""


def _pixels(page: Any, *points: tuple[int, int]) -> list[list[int]]:
    """The RGBA of each point of the drawn canvas (read back once: Chromium warns on repeated reads)."""
    return list(page.locator("canvas.ocr-image").evaluate(_PIXELS, [list(point) for point in points]))


def test_the_work_page_submits_an_image_and_draws_its_ocr_lines(stack, cp: ControlPlane, browser: Any) -> None:  # type: ignore[no-untyped-def]
    context, page, log = _page(browser, VIEWPORT)
    try:
        _sign_in(page, stack.api_url)
        page.get_by_role("link", name="Work").click()
        expect(page.get_by_role("heading", name="Work", level=1)).to_be_visible()
        page.get_by_label("Image").set_input_files({"name": "page.png", "mimeType": "image/png", "buffer": _png()})
        page.get_by_role("button", name="Submit").click()
        said = page.get_by_role("status").filter(has_text="Submitted")
        expect(said).to_have_text(re.compile(r"Submitted work_[0-9a-f]{32} \(queued\)\."))
        work_id = re.search(r"work_[0-9a-f]{32}", said.inner_text()).group(0)  # type: ignore[union-attr]

        # a node reads it and answers two lines
        node = cp.worker_node(("cpu", "ocr"))
        assert cp.heartbeat(node).status_code == 200
        claimed = claim_until(cp, node, work_id)
        result = json.dumps({"lines": LINES, "device": "cpu", "model_sha256": "0" * 64, "duration_ms": 1.0}).encode()
        assert finish(cp, node, claimed, result).status_code == 200

        page.get_by_label("Status").select_option("succeeded")
        page.get_by_label("Capability").select_option("ocr")
        row = page.get_by_role("row").filter(has=page.get_by_role("button", name=work_id))
        expect(row).to_have_count(1)
        cells = [str(text) for text in row.get_by_role("cell").all_inner_texts()]
        assert cells[:3] == ["ocr", "succeeded", "1 of 3 attempts"] and TIME.fullmatch(cells[4]), cells
        assert TIME.search(page.get_by_text("updated at").inner_text())
        for shown in page.get_by_role("row").all()[1:]:
            assert shown.get_by_role("cell").nth(1).inner_text() == "succeeded"
        _screenshot(page, "work")

        row.get_by_role("button", name=work_id).click()
        detail = page.get_by_role("dialog", name=f"Work {work_id}")
        expect(detail.get_by_role("list", name="Text lines").get_by_role("listitem")).to_have_text(
            ["first line (score 0.98)", "second line (score 0.61)"]
        )
        image = detail.get_by_role("img", name="The image, with 2 text line box(es) drawn over it")
        expect(image).to_be_visible()
        assert image.evaluate("(canvas) => [canvas.width, canvas.height]") == [WIDTH, HEIGHT]
        # on the first box's top edge: the box's red; between the boxes: the image itself
        red, between = _pixels(page, (100, 20), (100, 60))
        assert red[0] > 180 and red[1] < 90 and red[2] < 90, red
        assert between == [0xEE, 0xEE, 0xEE, 255]
        expect(detail.get_by_text("No attempt has failed.")).to_be_visible()
        expect(detail.get_by_role("button", name="Cancel work")).to_have_count(0)  # succeeded: nothing to cancel
        for moment in detail.locator("time").all_inner_texts():
            assert TIME.fullmatch(moment), moment
        _screenshot(page, "work-ocr")
        detail.get_by_role("button", name="Close").click()
        expect(page.get_by_role("dialog")).to_have_count(0)
        log.assert_clean([ADMIN_TOKEN])
    finally:
        context.close()


def test_an_items_attempts_errors_and_cancel_work(stack, cp: ControlPlane, browser: Any) -> None:  # type: ignore[no-untyped-def]
    submitted = cp.submit_work("diagnostic.echo", {"for": "cancel"})
    assert submitted.status_code == 201, submitted.text
    work_id = submitted.json()["work_id"]
    node = cp.worker_node(("cpu", "diagnostic.echo"))
    assert cp.heartbeat(node).status_code == 200
    claimed = claim_until(cp, node, work_id)
    failed = cp.lease_call(
        node, work_id, "fail", {"epoch": claimed["epoch"], "reason": "worker said no", "retryable": True}
    )
    assert failed.status_code == 200 and failed.json()["status"] == "queued", failed.text

    context, page, log = _page(browser, VIEWPORT)
    try:
        _sign_in(page, stack.api_url)
        page.get_by_role("link", name="Work").click()
        page.get_by_label("Status").select_option("queued")
        page.get_by_role("button", name=work_id).click()
        detail = page.get_by_role("dialog", name=f"Work {work_id}")
        errors = detail.get_by_role("table", name="Errors, one per failed attempt").get_by_role("row")
        expect(errors).to_have_count(2)
        cells = [str(text) for text in errors.nth(1).get_by_role("cell").all_inner_texts()]
        assert cells[:4] == ["1", node.node_id, "worker said no", "yes"] and TIME.fullmatch(cells[4]), cells
        expect(detail.get_by_text("1 of 3 attempts", exact=True)).to_be_visible()

        detail.get_by_role("button", name="Cancel work").click()
        confirm = page.get_by_role("alertdialog", name="Cancel work?")
        confirm.get_by_role("button", name="Cancel", exact=True).click()  # changed their mind: nothing happens
        assert cp.work(work_id)["status"] == "queued"
        detail.get_by_role("button", name="Cancel work").click()
        page.get_by_role("alertdialog", name="Cancel work?").get_by_role("button", name="Cancel work").click()
        expect(detail.locator(".status")).to_have_text("cancelled")
        expect(detail.get_by_role("button", name="Cancel work")).to_have_count(0)
        assert cp.work(work_id)["status"] == "cancelled"
        _screenshot(page, "work-cancelled")
        log.assert_clean([ADMIN_TOKEN])
    finally:
        context.close()


def test_the_hardware_table_fits_a_900_px_window(stack, cp: ControlPlane, browser: Any) -> None:  # type: ignore[no-untyped-def]
    inventory = {**gpu_inventory(4), "capabilities": ["cuda", "diagnostic.echo", "diagnostic.sleep", "ocr"]}
    for name in ("A GPU node with a long display name", "a-gpu-node-whose-display-name-is-one-long-word-0123456789"):
        # one host enrolled twice: each row names its twin
        identity = AgentIdentity()
        token = cp.mint(display_name=name)["token"]
        assert cp.enroll(token, identity, accelerator_mode="nvidia", inventory=inventory).status_code == 201
        assert cp.heartbeat(identity, gpus=4).status_code == 200
    context, page, log = _page(browser, {"width": 900, "height": 800})
    try:
        _sign_in(page, stack.api_url)
        expect(page.get_by_role("row").filter(has_text="A GPU node with a long display name")).to_have_count(1)
        expect(page.get_by_role("row").filter(has_text="one-long-word")).to_have_count(1)
        widths = page.locator("table.nodes").evaluate(
            "(table) => [table.scrollWidth, table.parentElement.clientWidth, document.documentElement.scrollWidth]"
        )
        assert widths[0] <= widths[1] and widths[2] <= 900, widths
        _screenshot(page, "hardware-900")
        log.assert_clean([ADMIN_TOKEN])
    finally:
        context.close()
