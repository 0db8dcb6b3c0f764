"""Read an HTTP answer's body only up to a cap, refusing what cannot be bounded.

Works with any response that exposes its headers as a mapping (``requests``' ``headers``,
``http.client.HTTPResponse.headers``) and a ``read(n)`` of raw, undecoded bytes. A declared
``Content-Length`` over the cap is refused before reading; otherwise at most ``max_bytes + 1``
bytes are read, so a body without a length (or lying about it) is refused as soon as it is
known to be too large. A compressed body is refused: its decoded size is not bounded by the cap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Headers(Protocol):
    def get(self, name: str, /) -> str | None: ...


class CappedReadError(Exception):
    """The body was not read; ``reason`` names the rule, never a value from the body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Compressed(CappedReadError):
    def __init__(self, encoding: str) -> None:
        super().__init__("the answer is compressed")
        self.encoding = encoding


class TooLarge(CappedReadError):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"larger than {max_bytes} bytes")
        self.max_bytes = max_bytes


def declared_length(headers: Headers) -> int | None:
    """The ``Content-Length`` as a number, or None when absent or not a plain decimal."""
    length = (headers.get("Content-Length") or "").strip()
    return int(length) if length.isascii() and length.isdigit() else None


def check_headers(headers: Headers, max_bytes: int) -> None:
    """Refuse before reading: a compressed body, or a declared length over ``max_bytes``."""
    encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise Compressed(encoding)
    length = declared_length(headers)
    if length is not None and length > max_bytes:
        raise TooLarge(max_bytes)


def read_capped(read: Callable[[int], bytes], headers: Headers, max_bytes: int) -> bytes:
    """The whole body (at most ``max_bytes``), or ``Compressed`` / ``TooLarge``.

    ``read(n)`` returns up to ``n`` raw bytes, fewer only at the end of the body (as
    ``urllib3``'s ``response.raw.read(n, decode_content=False)`` and ``HTTPResponse.read(n)`` do).
    """
    check_headers(headers, max_bytes)
    body = read(max_bytes + 1)
    if len(body) > max_bytes:
        raise TooLarge(max_bytes)
    return bytes(body)
