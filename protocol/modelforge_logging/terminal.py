"""Text that came from elsewhere (a node's GPU name, health detail, fail reason), made safe to
print on a person's terminal: every control character is shown as an escape (``\\x1b``), so no
escape sequence a node sends can retitle, recolour or rewrite an admin's terminal, and no line a
node sends can forge a log line.

Control characters are C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F): an ESC or CSI
escaped is the start of every terminal sequence escaped, so the sequence is shown as plain text.
One function for the admin CLI's output and the text log format (``jsonlog.TextFormatter``);
JSON output and JSON log lines escape them already (``json.dumps``)."""

from __future__ import annotations

import re

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LINE_CONTROLS = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character as ``\\xNN`` (``keep_newlines``: but ``\\n``, for
    output made of several lines; a log line keeps none, so one line stays one line)."""
    return (_LINE_CONTROLS if keep_newlines else _CONTROLS).sub(_escaped, text)
