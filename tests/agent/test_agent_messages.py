"""What a person reads from the agent: ``MODELFORGE_AGENT_LOG_FORMAT=text`` lines, and a TLS
failure on an https:// URL that says to check the server serves HTTPS."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import requests
from modelforge_logging import jsonlog
from modelforge_node_agent.config import load_config
from modelforge_node_agent.transport import network_label

from tests.agent.fake_control_plane import TOKEN, fake_server
from tests.support.agent_process import agent_env, run_agent, start_agent

from .test_config import _env, _problems


def test_log_format_is_json_by_default_text_when_asked_and_anything_else_is_named(tmp_path: Path) -> None:
    assert load_config(_env(tmp_path)).log_format == "json"
    assert load_config(_env(tmp_path, MODELFORGE_AGENT_LOG_FORMAT="Text")).log_format == "text"
    assert "MODELFORGE_AGENT_LOG_FORMAT must be json or text" in _problems(
        _env(tmp_path, MODELFORGE_AGENT_LOG_FORMAT="xml")
    )


def _record(message: str, level: int = logging.INFO, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("modelforge.agent", level, __file__, 1, message, None, exc_info)  # type: ignore[arg-type]


def test_the_text_format_is_one_readable_redacted_line_and_a_traceback_when_there_is_one() -> None:
    formatter = jsonlog.TextFormatter()
    line = formatter.format(_record("enrolled as node_0123"))
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO    agent: enrolled as node_0123", line), line
    assert "<SECRET>" in formatter.format(_record(f"token {TOKEN}")) and TOKEN not in formatter.format(_record(TOKEN))
    try:
        raise KeyError("boom")
    except KeyError:
        import sys

        crashed = formatter.format(_record("unexpected error", logging.ERROR, sys.exc_info()))
    assert crashed.splitlines()[0].endswith("ERROR   agent: unexpected error") and "KeyError: 'boom'" in crashed


def test_configure_switches_the_format_of_its_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("modelforge-format-test")
    jsonlog.configure("INFO", "modelforge-format-test", fmt="text")
    logger.info("readable")
    jsonlog.configure("INFO", "modelforge-format-test")
    logger.info("machine")
    assert len(logger.handlers) == 1
    readable, machine = capsys.readouterr().err.splitlines()
    assert readable.endswith("INFO    modelforge-format-test: readable") and '"message": "machine"' in machine


def test_an_invalid_configuration_is_reported_in_the_format_asked_for(tmp_path: Path) -> None:
    env = {
        "MODELFORGE_AGENT_LOG_FORMAT": "text",
        "MODELFORGE_AGENT_CONTROL_PLANE_URL": "",
        "MODELFORGE_AGENT_STATE_VOLUME": "",
    }
    done = run_agent(env=env)
    assert done.returncode == 2
    assert re.search(r"^\d\d:\d\d:\d\d ERROR   agent: invalid agent configuration: ", done.stderr, re.M), done.stderr


def test_an_https_url_to_a_plain_http_server_says_to_check_that_it_serves_https(tmp_path: Path) -> None:
    with fake_server() as plane:
        url = plane.url.replace("http://", "https://")
        env = agent_env(url, TOKEN, tmp_path / "state", MODELFORGE_AGENT_LOG_FORMAT="text")
        with start_agent(tmp_path / "agent.log", env) as agent:
            line = agent.wait_for(
                r"WARNING agent: TLSError on POST /api/v1/agent/enroll \(backoff 1s…16s\): (.*)", timeout=30
            )
    assert line.group(1).startswith(
        "TLS handshake failed: the server answered in plain HTTP, not HTTPS. Check that the server serves HTTPS"
    )


@pytest.mark.parametrize(
    ("reason", "hint"),
    [
        ("[SSL: WRONG_VERSION_NUMBER] wrong version number", "the server answered in plain HTTP"),
        (
            "[SSL: SSLV3_ALERT_HANDSHAKE_FAILURE] sslv3 alert handshake failure",
            "check that the server serves HTTPS on this address and port",
        ),
        (
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate",
            "certificate verify failed",
        ),
        ("hostname '10.0.0.5' doesn't match 'cp.internal'", "certificate does not match the host name"),
    ],
)
def test_each_tls_failure_gets_its_own_hint(reason: str, hint: str) -> None:
    label, detail = network_label(requests.exceptions.SSLError(reason))
    assert label == "TLSError" and hint in detail
