"""Control characters from elsewhere never reach a terminal: the one function that escapes them
(``modelforge_logging.terminal.printable``), the text log format and the CLI's output streams."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
from modelforge_cli import tables
from modelforge_logging import jsonlog
from modelforge_logging.terminal import printable

PAINT = "\x1b]0;pwned\x07\x1b[31m"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (PAINT, "\\x1b]0;pwned\\x07\\x1b[31m"),
        ("\x00\x08\t\r\x7f", "\\x00\\x08\\x09\\x0d\\x7f"),
        ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: CSI and NEL on their own
        ("GPU ß é 漢 ✓", "GPU ß é 漢 ✓"),  # printable text is left alone
    ],
)
def test_every_c0_del_and_c1_character_is_shown_escaped(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_newlines_are_kept_only_when_asked() -> None:
    assert printable("a\nb") == "a\\x0ab"
    assert printable("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


def test_a_text_log_line_stays_one_line_without_controls() -> None:
    forged = "H200" + PAINT + "\nforged"
    record = logging.LogRecord("modelforge.agent", logging.WARNING, "", 0, "gpu %s", (forged,), None)
    line = jsonlog.TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line
    assert line.endswith("agent: gpu H200\\x1b]0;pwned\\x07\\x1b[31m\\x0aforged")


def test_a_json_log_line_escapes_them_as_json_does() -> None:
    record = logging.LogRecord("modelforge.agent", logging.INFO, "", 0, "gpu %s", (PAINT,), None)
    line = jsonlog.JsonFormatter().format(record)
    assert "\x1b" not in line and json.loads(line)["message"] == "gpu " + PAINT


def test_cli_output_streams_escape_everything_written_to_them(monkeypatch: pytest.MonkeyPatch) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with tables.printable_output():
        print(tables.table(["NAME"], [["box " + PAINT]]))
        print("modelforge: " + PAINT, file=sys.stderr)
    assert sys.stdout is out and sys.stderr is err  # put back
    assert out.getvalue() == "NAME\nbox \\x1b]0;pwned\\x07\\x1b[31m\n"
    assert err.getvalue() == "modelforge: \\x1b]0;pwned\\x07\\x1b[31m\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_work_result_on_a_terminal_is_escaped_and_piped_it_is_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from modelforge_cli import work_cli

    body = ('{"text":"' + PAINT + '"}\n').encode()
    item = {"status": "succeeded", "result": {"url": "https://objects.example/r", "size": len(body), "sha256": "x"}}

    class Api:
        def get(self, path: str) -> dict[str, object]:
            return item

    monkeypatch.setattr(work_cli, "download", lambda url, size, sha256: body)
    args = argparse.Namespace(work_id="work_" + "0" * 32, output=None)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    with tables.printable_output():
        assert work_cli.run_result(Api(), args) == 0  # type: ignore[arg-type]
    assert terminal.getvalue() == '{"text":"\\x1b]0;pwned\\x07\\x1b[31m"}\n'

    piped = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", piped)
    with tables.printable_output():
        assert work_cli.run_result(Api(), args) == 0  # type: ignore[arg-type]
    assert piped.buffer.getvalue() == body  # type: ignore[attr-defined]
