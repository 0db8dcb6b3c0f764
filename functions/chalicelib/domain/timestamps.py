"""How the API writes a moment: ISO 8601 in UTC with milliseconds (``2026-12-01T03:22:50.791Z``)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(float(timestamp), tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
