"""Strict JSON: one parser for every document that crosses a trust boundary.

What it refuses, and why:
- more than ``max_bytes`` (checked before anything is parsed);
- containers nested deeper than ``max_depth`` (counted on the raw text before parsing, so a
  hostile document cannot exhaust the parser's recursion);
- ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON, and every range check passes NaN);
- numbers too large for a float (``1e999`` would become infinity);
- anything that is not JSON text (bad syntax, bad UTF-8).

Each refusal is a ``StrictJsonError`` whose ``reason`` names the rule, never a value from the
document; callers turn it into their own error (an HTTP answer, a malformed answer).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Strings (which may hold brackets) are blanked before the nesting depth is counted.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_STRING_BYTES = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_BRACKETS_BYTES = re.compile(rb"[\[\]{}]")


class StrictJsonError(ValueError):
    """The document is refused; ``reason`` names the rule, never a value from the document."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TooLarge(StrictJsonError):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"larger than {max_bytes} bytes")
        self.max_bytes = max_bytes


class TooDeep(StrictJsonError):
    def __init__(self, max_depth: int) -> None:
        super().__init__(f"nested deeper than {max_depth} levels")
        self.max_depth = max_depth


class RefusedConstant(StrictJsonError):
    """``NaN``, ``Infinity`` or ``-Infinity``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"JSON constant {name} is not allowed")
        self.name = name


class RefusedNumber(StrictJsonError):
    """A number a float cannot hold (it would parse as infinity)."""

    def __init__(self) -> None:
        super().__init__("number out of range")


class NotJson(StrictJsonError):
    def __init__(self) -> None:
        super().__init__("not JSON")


def depth(raw: bytes | str) -> int:
    """How deeply containers nest in the JSON text ``raw``: 0 for a scalar, 1 for ``[]`` or ``{}``
    holding only scalars, and so on. Brackets inside strings do not count."""
    if isinstance(raw, bytes):
        brackets = _BRACKETS_BYTES.findall(_JSON_STRING_BYTES.sub(b'""', raw))
        openers: tuple[Any, ...] = (b"[", b"{")
    else:
        brackets = _BRACKETS.findall(_JSON_STRING.sub('""', raw))
        openers = ("[", "{")
    deepest = level = 0
    for bracket in brackets:
        level += 1 if bracket in openers else -1
        deepest = max(deepest, level)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise RefusedConstant(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RefusedNumber
    return value


def loads(raw: bytes | str, *, max_depth: int, max_bytes: int | None = None) -> Any:
    """The JSON value in ``raw``, or a ``StrictJsonError`` (see the module's rules).

    ``max_bytes`` counts bytes as given (for ``str``, its UTF-8 length); None: no size limit here
    (the caller capped the read already)."""
    if max_bytes is not None:
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise TooLarge(max_bytes)
    if depth(raw) > max_depth:
        raise TooDeep(max_depth)
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except StrictJsonError:
        raise
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise NotJson from None
