"""Readable output of the admin commands, as `kubectl get` and `kubectl describe` print it:
aligned columns under upper-case headers, ages such as `12s`, `5m`, `3h`, `2d`.

Every line the CLI prints goes through ``printable_output``: a node controls much of what is
printed (GPU names, health detail, fail reasons), so each control character is shown escaped
(``\x1b``) and never reaches the terminal as a sequence it would act on."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from modelforge_logging.terminal import printable

GAP = "   "


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(header) for header in headers], *([dash(cell) for cell in row] for row in rows)]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    return "\n".join(
        GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """`name   value` lines, as `kubectl describe` prints them."""
    width = max(len(name) for name, _ in pairs) + 1
    return "\n".join(f"{(name + ':').ljust(width)}  {dash(value)}" for name, value in pairs)


def counted(count: Any, noun: str) -> str:
    """``1 attempt``, ``3 attempts``: the noun singular for exactly one (``noun`` is singular)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def dash(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def moment(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 120 * 60:
        return f"{round(seconds / 60)}m"
    if seconds < 48 * 3600:
        return f"{round(seconds / 3600)}h"
    return f"{round(seconds / 86400)}d"


def age(text: str | None, at: datetime | None = None) -> str:
    """How long ago ``text`` (ISO 8601) was: `12s`; `-` when never."""
    then = moment(text)
    if then is None:
        return "-"
    return duration(((at or now()) - then).total_seconds())


def relative(text: str | None, at: datetime | None = None) -> str:
    """`in 14m` or `3m ago`."""
    then = moment(text)
    if then is None:
        return "-"
    delta = (then - (at or now())).total_seconds()
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def when(text: str | None, at: datetime | None = None) -> str:
    """The moment and how long ago or ahead it is: `2026-12-01T03:22:50.791Z (3m ago)`."""
    return "-" if not text else f"{text} ({relative(text, at)})"


def size(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def print_json(answer: Any) -> None:
    sys.stdout.write(json.dumps(answer, indent=2) + "\n")


class _Printable:
    """A text stream that writes what it is given with its control characters escaped (lines stay
    lines); the rest (flush, isatty, buffer for raw bytes) is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(printable(text, keep_newlines=True))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """While inside: everything written to stdout and stderr as text is escaped (``printable``)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(saved[0]), _Printable(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
