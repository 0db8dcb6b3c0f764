"""What the push channel carries, read the way the agent reads any answer: strict JSON, small.

server -> agent: ``{"v": 1, "type": "wake"}`` and ``{"v": 1, "type": "cancel", "work_id": ...}``;
agent -> server: ``{"v": 1, "type": "ping"}``. A message is a hint, never an order: ``wake`` makes
the agent claim, ``cancel`` makes it renew that work at once (only the renewal's 409 stops a job).

``read`` sorts a frame into ``Wake``, ``Cancel``, ``Ignored`` (a version or a type this agent does
not know: for forward compatibility, one debug line) or raises ``Malformed`` (larger than
``MAX_CHANNEL_MESSAGE_BYTES``, binary, not strict JSON, not a message): counted, never fatal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from modelforge_protocol import strict_json
from modelforge_protocol.schemas import (
    CHANNEL_CANCEL,
    CHANNEL_MESSAGE_VERSION,
    CHANNEL_PING,
    CHANNEL_WAKE,
    MAX_CHANNEL_MESSAGE_BYTES,
)
from modelforge_protocol.work import WORK_ID_PATTERN

#: Messages are flat objects; nothing deeper is read.
MAX_MESSAGE_DEPTH = 2
_WORK_ID = re.compile(WORK_ID_PATTERN)
#: The keep-alive the agent sends (compact: it is sent every few minutes for hours).
PING = json.dumps({"v": CHANNEL_MESSAGE_VERSION, "type": CHANNEL_PING}, separators=(",", ":"))


class Malformed(Exception):
    """Not a channel message; ``reason`` never quotes the frame."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Wake:
    """Claim now, if the worker can take work."""


@dataclass(frozen=True)
class Cancel:
    """Renew this work now (its lease keeper hears the cancel as the renewal's 409)."""

    work_id: str


@dataclass(frozen=True)
class Ignored:
    """A message this agent does not know (another version, another type): ``why``, for one debug line."""

    why: str


Message = Wake | Cancel | Ignored


def read(frame: str | bytes) -> Message:
    """The message in a text frame, or ``Malformed``."""
    if not isinstance(frame, str):
        raise Malformed("binary frame")
    try:
        value = strict_json.loads(frame, max_depth=MAX_MESSAGE_DEPTH, max_bytes=MAX_CHANNEL_MESSAGE_BYTES)
    except strict_json.StrictJsonError as refused:
        raise Malformed(f"message {refused.reason}") from None
    if not isinstance(value, dict):
        raise Malformed("message is not an object")
    version, kind = value.get("v"), value.get("type")
    if type(version) is not int or not isinstance(kind, str):
        raise Malformed("message lacks an integer v or a string type")
    if version != CHANNEL_MESSAGE_VERSION:
        return Ignored(f"message version {version}")
    if kind == CHANNEL_WAKE:
        return Wake()
    if kind == CHANNEL_CANCEL:
        work_id = value.get("work_id")
        if not isinstance(work_id, str) or not _WORK_ID.match(work_id):
            raise Malformed("cancel without a work id")
        return Cancel(work_id)
    return Ignored(f"message type {kind[:32]!r}")
