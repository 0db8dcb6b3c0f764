"""The image decoder's child process (decoder.py): a hostile image ends as a clear, non-retryable
refusal within the decoder's time cap, a decompression bomb ends under its memory limit, and the
child never outlives the process that started it."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from modelforge_runtime_worker import decoder, images
from modelforge_runtime_worker.errors import InvalidInput
from modelforge_runtime_worker.server import http_error
from PIL import Image

from tests.worker.worker_support import alive, b64, children_running, text_png

EOI = b"\xff\xd9"
SOS = b"\xff\xda"


def hostile_progressive_jpeg(side: int = 4000, repeats: int = 3000) -> bytes:
    """A valid progressive JPEG whose last scan is repeated ``repeats`` times: about 190 KB that
    pass the pixel cap (16 megapixels) and take Pillow about half a minute to decode in one
    uninterruptible call, every repeat of the 31-byte scan walking every block of the image again
    (the security probe's file, rebuilt)."""
    image = Image.new("RGB", (side, side), (200, 200, 200))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", progressive=True, quality=90)
    data = buffer.getvalue()
    last_scan = data.rindex(SOS)
    assert data.endswith(EOI)
    scan = data[last_scan:-2]
    return data[:last_scan] + scan * repeats + EOI


def _refused(call: object) -> InvalidInput:
    with pytest.raises(InvalidInput) as refused:
        call()  # type: ignore[operator]
    answer = http_error(refused.value)
    assert (answer.status, answer.code, answer.retryable) == (422, "invalid_input", False)
    return refused.value


def test_the_child_gives_the_same_pixels_as_decoding_in_process() -> None:
    for data in (text_png(["PIXELS 123"]), _jpeg(Image.effect_noise((64, 48), 40).convert("RGB"))):
        assert decoder.decode_image(b64(data)).tobytes() == images.decode_file(data).tobytes()


def test_a_hostile_progressive_jpeg_is_refused_at_the_time_cap() -> None:
    hostile = b64(hostile_progressive_jpeg())
    began = time.monotonic()
    message = _refused(lambda: decoder.decode_image(hostile, timeout_seconds=1.0)).message
    took = time.monotonic() - began
    assert "took longer than 1 s to decode" in message
    assert took < 4.0, took  # the cap, the child's start and its kill; never the minutes a decode takes


def test_a_decompression_bomb_ends_under_the_memory_limit() -> None:
    """A 25-megapixel image (inside the pixel cap) needs far more than 160 MiB to decode to RGB."""
    bomb = _png(Image.new("RGB", (5000, 5000), (255, 255, 255)))
    assert len(bomb) < 200_000  # a small file
    message = _refused(lambda: decoder.decode_image(b64(bomb), memory_bytes=160 * 1024 * 1024)).message
    assert "160 MiB" in message or "memory" in message, message


def test_refusals_before_decoding_start_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a child was started for input refused up front")

    monkeypatch.setattr(decoder.subprocess, "run", no_child)
    assert "not valid base64" in _refused(lambda: decoder.decode_image("not base64!")).message
    assert "not a PNG or JPEG" in _refused(lambda: decoder.decode_image(b64(b"GIF89a" + b"\0" * 20))).message


def test_a_truncated_jpeg_is_refused_with_the_childs_reason() -> None:
    data = _jpeg(Image.effect_noise((200, 200), 40).convert("RGB"))
    assert "could not be decoded as JPEG" in _refused(lambda: decoder.decode_image(b64(data[:300]))).message


def test_the_child_dies_with_its_parent(tmp_path: Path) -> None:
    """A job process that is killed mid-decode takes its decoder with it (PR_SET_PDEATHSIG)."""
    hostile = tmp_path / "hostile.b64"
    hostile.write_text(b64(hostile_progressive_jpeg()))
    script = (
        "import sys; from pathlib import Path; from modelforge_runtime_worker import decoder; "
        "decoder.decode_image(Path(sys.argv[1]).read_text(), timeout_seconds=120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(hostile)])  # noqa: S603
    try:
        child = _wait_for_child(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=5)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), f"the decoder {child} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def _wait_for_child(parent: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = children_running(parent, "modelforge_runtime_worker.decoder")
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the decoder child never started")


def _jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def test_hostile_jpeg_builder_makes_a_valid_small_file() -> None:
    data = hostile_progressive_jpeg(side=64, repeats=3)
    assert Image.open(io.BytesIO(data)).size == (64, 64)
    assert base64.b64encode(data)
