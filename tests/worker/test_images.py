"""Input images are untrusted: only base64 PNG or JPEG, bounded in pixels before decoding,
decoded in the decoder's child process (``decoder.decode_image``: the real path), and every
refusal is 422 invalid_input with a reason."""

from __future__ import annotations

import base64
import io

import pytest
from modelforge_runtime_worker import decoder, images
from modelforge_runtime_worker.errors import InvalidInput
from modelforge_runtime_worker.server import http_error
from PIL import Image

from tests.worker.worker_support import b64, text_png


def encoded(image: Image.Image, kind: str) -> str:
    buffer = io.BytesIO()
    image.save(buffer, kind)
    return b64(buffer.getvalue())


def refusal(value: object) -> InvalidInput:
    with pytest.raises(InvalidInput) as refused:
        decoder.decode_image(value)
    answer = http_error(refused.value)
    assert (answer.status, answer.code, answer.retryable) == (422, "invalid_input", False)
    return refused.value


def test_png_and_jpeg_decode_to_rgb() -> None:
    png = decoder.decode_image(b64(text_png(["AB"])))
    assert png.mode == "RGB" and png.size[0] > 0
    jpeg = decoder.decode_image(encoded(Image.new("L", (30, 20), 128), "JPEG"))
    assert (jpeg.mode, jpeg.size) == ("RGB", (30, 20))


def test_transparency_becomes_white() -> None:
    image = decoder.decode_image(encoded(Image.new("RGBA", (4, 4), (0, 0, 0, 0)), "PNG"))
    assert image.getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize("value", [None, "", 42, ["a"]])
def test_a_missing_image_is_refused(value: object) -> None:
    assert "image_base64 is required" in refusal(value).message


@pytest.mark.parametrize("value", ["not base64!", "QUJD\nREVG", "QUJDRA"])
def test_bad_base64_is_refused(value: str) -> None:
    assert "not valid base64" in refusal(value).message


@pytest.mark.parametrize(
    "data",
    [b"plain text, not an image", b"GIF89a" + b"\0" * 20, b"%PDF-1.7\n"],
)
def test_other_files_are_refused(data: bytes) -> None:
    assert "not a PNG or JPEG image" in refusal(b64(data)).message


def test_a_truncated_png_is_refused() -> None:
    data = text_png(["TRUNCATED"])
    assert "could not be decoded as PNG" in refusal(b64(data[: len(data) // 2])).message


def test_a_gif_is_not_decoded_even_when_renamed() -> None:
    gif = io.BytesIO()
    Image.new("L", (8, 8)).save(gif, "GIF")
    assert "not a PNG or JPEG" in refusal(base64.b64encode(gif.getvalue()).decode()).message


def test_the_pixel_count_is_checked_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """In ``decode_file`` itself (what the child runs), so the cap can be lowered for the test."""
    monkeypatch.setattr(images, "MAX_PIXELS", 100 * 100)
    ok = base64.b64decode(encoded(Image.new("1", (100, 100), 1), "PNG"))
    assert images.decode_file(ok).size == (100, 100)
    with pytest.raises(InvalidInput) as refused:
        images.decode_file(base64.b64decode(encoded(Image.new("1", (101, 100), 1), "PNG")))
    assert "101x100" in refused.value.message and "10,000" in refused.value.message


def test_the_real_pixel_cap_refuses_in_the_child() -> None:
    """25 megapixels at most: a 5001 x 5000 PNG (a few KB compressed) is refused from its header."""
    message = refusal(encoded(Image.new("1", (5001, 5000), 1), "PNG")).message
    assert "5001x5000" in message
