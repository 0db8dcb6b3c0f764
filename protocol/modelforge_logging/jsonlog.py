"""The log format every ModelForge process writes: one JSON object per line, with a stable
``event`` name and ids as fields, and redaction of anything shaped like a secret as the safety net
(not the plan: code never logs secrets in the first place).

``text`` is the other format, for a person watching a terminal (the node agent's
``MODELFORGE_AGENT_LOG_FORMAT=text``): time, level, logger and message on one line, redacted the
same way, and with every control character escaped (``terminal.printable``)."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

from modelforge_logging import terminal

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


class TextFormatter(logging.Formatter):
    """``12:00:01 INFO    agent: enrolled as node_…``: local time, level, the logger's name under
    ``modelforge.``, the message (which says everything a person needs); a traceback follows it."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(record.created))
        name = record.name.removeprefix("modelforge.")
        # one line whatever the message holds, and nothing in it a terminal would act on
        line = f"{when} {record.levelname:<7} {name}: {terminal.printable(record.getMessage())}"
        if record.exc_info:
            line += "\n" + terminal.printable(self.formatException(record.exc_info), keep_newlines=True)
        return redact(line)


#: The formats ``configure`` knows: ``json`` (the default, for machines) and ``text`` (for people).
FORMATS = ("json", "text")


def configure(level: str = "INFO", logger_name: str = "modelforge", fmt: str = "json") -> None:
    """Send the named logger tree to stderr as JSON lines (``fmt="text"``: readable lines);
    calling again changes the level and the format."""
    logger = logging.getLogger(logger_name)
    logger.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    logger.propagate = False
    formatter: logging.Formatter = TextFormatter() if fmt == "text" else JsonFormatter()
    ours = [handler for handler in logger.handlers if getattr(handler, "_modelforge", False)]
    if ours:
        for handler in ours:
            handler.setFormatter(formatter)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler._modelforge = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def monotonic_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)
