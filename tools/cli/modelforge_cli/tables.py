"""Readable output of the admin commands, as `kubectl get` and `kubectl describe` print it:
aligned columns under upper-case headers, ages such as `12s`, `5m`, `3h`, `2d`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

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
