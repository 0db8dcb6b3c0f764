"""The log format every ModelForge process writes: one JSON object per line, with a stable
``event`` name and ids as fields, and redaction of anything shaped like a secret as the safety net
(not the plan: code never logs secrets in the first place)."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

#: Anything shaped like one of our secrets is masked, wherever it appears in a log line.
_SECRET_PATTERNS = re.compile(r"mf[eni]\.[A-Za-z0-9_.-]{20,}|Bearer\s+\S+", re.IGNORECASE)
REDACTED = "<SECRET>"
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def redact(text: str) -> str:
    return _SECRET_PATTERNS.sub(REDACTED, text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return redact(json.dumps(entry, default=str, sort_keys=True, ensure_ascii=False))


def configure(level: str = "INFO", logger_name: str = "modelforge") -> None:
    """Send the named logger tree to stderr as JSON lines; calling again only changes the level."""
    logger = logging.getLogger(logger_name)
    logger.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    logger.propagate = False
    if any(getattr(handler, "_modelforge", False) for handler in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._modelforge = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def monotonic_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)
