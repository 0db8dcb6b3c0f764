"""Untrusted input images: base64 in, a decoded RGB Pillow image out, or a clear refusal.

Only PNG and JPEG are accepted, recognised by their signature (``image_bytes``, in the worker) and
decoded by Pillow (``decode_file``, only ever in the decoder's child process: ``decoder.py``;
never by a path or URL: nothing here touches the file system or the network). The pixel count is
checked from the header, before any pixel is decoded, so a small compressed file cannot expand
into gigabytes; the child's memory limit and time cap bound the rest.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from PIL import Image, ImageOps

from .errors import invalid_input

#: Largest accepted image, in pixels (25 megapixels, e.g. 5000 x 5000) and on either side.
MAX_PIXELS = 25_000_000
MAX_SIDE = 16_384
_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}


def image_bytes(value: Any, field: str = "input.image_base64") -> bytes:
    """The file in ``value`` (standard base64 of a PNG or JPEG file, no line breaks), checked by
    its signature; nothing is decoded here."""
    if not isinstance(value, str) or not value:
        raise invalid_input(f"{field} is required: a PNG or JPEG file in standard base64")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_input(f"{field} is not valid base64 (standard alphabet, padded, no line breaks)") from None
    if _kind(data) is None:
        raise invalid_input(f"{field} is not a PNG or JPEG image")
    return data


def decode_file(data: bytes, field: str = "input.image_base64") -> Image.Image:
    """The PNG or JPEG file ``data`` as RGB. Runs only in the decoder's child process
    (``decoder.py``): Pillow's decode cannot be interrupted."""
    kind = _kind(data)
    if kind is None:
        raise invalid_input(f"{field} is not a PNG or JPEG image")
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=[kind])
        width, height = image.size
        if width < 1 or height < 1 or width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
            raise invalid_input(
                f"{field} is {width}x{height} pixels; at most {MAX_SIDE} on a side and {MAX_PIXELS:,} in all"
            )
        image.load()
        image = ImageOps.exif_transpose(image) or image
        return _to_rgb(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise invalid_input(f"{field} could not be decoded as {kind} ({type(error).__name__})") from None


def _kind(data: bytes) -> str | None:
    return next((name for signature, name in _SIGNATURES.items() if data.startswith(signature)), None)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Transparent pixels become white (text is usually dark), everything else plain RGB."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
