from __future__ import annotations

import io

import pytest
from modelforge_protocol import capped_read


def _read(body: bytes) -> io.BytesIO:
    return io.BytesIO(body)


def test_read_capped_body_within_the_cap_is_returned() -> None:
    assert capped_read.read_capped(_read(b"abcd").read, {"Content-Length": "4"}, 4) == b"abcd"


def test_read_capped_declared_length_over_the_cap_is_refused_before_reading() -> None:
    stream = _read(b"abcde")
    with pytest.raises(capped_read.TooLarge, match="larger than 4 bytes"):
        capped_read.read_capped(stream.read, {"Content-Length": "5"}, 4)
    assert stream.tell() == 0


def test_read_capped_undeclared_body_over_the_cap_is_refused() -> None:
    with pytest.raises(capped_read.TooLarge):
        capped_read.read_capped(_read(b"abcde").read, {}, 4)


def test_read_capped_lying_length_is_refused() -> None:
    with pytest.raises(capped_read.TooLarge):
        capped_read.read_capped(_read(b"abcde").read, {"Content-Length": "1"}, 4)


@pytest.mark.parametrize("encoding", ["gzip", " Deflate "])
def test_read_capped_compressed_body_is_refused(encoding: str) -> None:
    with pytest.raises(capped_read.Compressed, match="compressed"):
        capped_read.read_capped(_read(b"x").read, {"Content-Encoding": encoding}, 4)


def test_read_capped_identity_encoding_is_read() -> None:
    assert capped_read.read_capped(_read(b"x").read, {"Content-Encoding": "identity"}, 4) == b"x"


@pytest.mark.parametrize(("value", "expected"), [("12", 12), (" 7 ", 7), ("-1", None), ("1e3", None), ("", None)])
def test_declared_length_only_plain_decimals_count(value: str, expected: int | None) -> None:
    assert capped_read.declared_length({"Content-Length": value}) == expected


def test_read_capped_http_client_headers_are_read_case_insensitively() -> None:
    from email.message import Message

    headers = Message()
    headers["content-length"] = "9"
    with pytest.raises(capped_read.TooLarge):
        capped_read.read_capped(_read(b"x" * 9).read, headers, 4)
