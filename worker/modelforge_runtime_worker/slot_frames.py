"""How the worker and its slot processes talk: length-prefixed strict JSON frames over the child's
stdin and stdout (``slots.py`` on the worker's side, ``slot_process.py`` on the slot's).

A frame is a 4-byte big-endian length and that many bytes of one JSON object. Both sides bound
the length (``MAX_FRAME_BYTES``: a run's input is at most the worker's 8 MiB body), so a broken
peer cannot make the other allocate without limit.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

from modelforge_protocol import strict_json

#: A run's input is at most the worker's request body (8 MiB); results are far smaller.
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: JSON nesting the frames may hold (the worker's own request limit is 64).
MAX_DEPTH = 80
_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """The peer closed the stream, or sent something that is not a frame."""


def write_frame(stream: IO[bytes], message: dict[str, Any]) -> None:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {len(body)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    stream.write(_LENGTH.pack(len(body)) + body)
    stream.flush()


def read_frame(stream: IO[bytes]) -> dict[str, Any]:
    """The next frame's object; FrameError at the end of the stream or on anything malformed."""
    head = _read_exactly(stream, _LENGTH.size)
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    try:
        message = strict_json.loads(_read_exactly(stream, length), max_depth=MAX_DEPTH)
    except ValueError as error:
        raise FrameError(f"a frame is not strict JSON ({type(error).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise FrameError("a frame is not a JSON object with a type")
    return message


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise FrameError("the stream ended")
        data += chunk
    return data
