"""The admin commands' pieces that need no server: durations, expiry parsing, ages, tables and
where the API, CA and token come from."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest
from modelforge_cli import tables
from modelforge_cli.admin_api import AdminApi, CommandFailed
from modelforge_cli.enrollments_cli import expiry_seconds

NOW = datetime(2026, 12, 1, 3, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("5m", 300), ("15m", 900), ("1h", 3600), ("24h", 86400), ("60", 60), ("90s", 90), (" 2H ", 7200)],
)
def test_expiry_takes_the_wizards_choices_and_seconds(raw: str, seconds: int) -> None:
    assert expiry_seconds(raw) == seconds


@pytest.mark.parametrize("raw", ["59", "25h", "1d", "-5m", "soon", ""])
def test_expiry_outside_60s_to_24h_or_not_a_duration_is_refused(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        expiry_seconds(raw)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (119, "119s"), (120, "2m"), (3599, "60m"), (7200, "2h"), (47 * 3600, "47h"), (3 * 86400, "3d")],
)
def test_durations_read_like_kubectl(seconds: float, text: str) -> None:
    assert tables.duration(seconds) == text


def test_ages_and_relative_moments() -> None:
    earlier = (NOW - timedelta(seconds=42)).isoformat().replace("+00:00", "Z")
    later = (NOW + timedelta(minutes=15)).isoformat().replace("+00:00", "Z")
    assert tables.age(earlier, NOW) == "42s" and tables.age(None, NOW) == "-"
    assert tables.relative(later, NOW) == "in 15m" and tables.relative(earlier, NOW) == "42s ago"


def test_tables_align_columns_and_show_missing_values_as_a_dash() -> None:
    text = tables.table(["ID", "NAME", "NODE"], [["a", "long name", None], ["bbbb", "x", "node_1"]])
    assert text.splitlines() == ["ID     NAME        NODE", "a      long name   -", "bbbb   x           node_1"]
    assert tables.size(1536) == "1.5 KiB" and tables.size(10) == "10 B"


def _args(**values: str | None) -> argparse.Namespace:
    return argparse.Namespace(api_url=values.get("api_url"), ca_cert=values.get("ca_cert"))


def test_the_api_defaults_to_loopback_8000_and_the_option_beats_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MODELFORGE_API_URL", raising=False)
    monkeypatch.delenv("MODELFORGE_CA_CERT_PATH", raising=False)
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", "t" * 43)
    assert AdminApi.from_args(_args()).api_url == "http://127.0.0.1:8000"
    monkeypatch.setenv("MODELFORGE_API_URL", "https://cp.example:8443/")
    assert AdminApi.from_args(_args()).api_url == "https://cp.example:8443"
    assert AdminApi.from_args(_args(api_url="http://127.0.0.1:9")).api_url == "http://127.0.0.1:9"


@pytest.mark.parametrize("token", ["", "has space", "new\nline", "ünïcode"])
def test_a_missing_or_unsendable_token_is_a_configuration_error_that_never_shows_it(
    monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    monkeypatch.setenv("MODELFORGE_ADMIN_TOKEN", token)
    with pytest.raises(CommandFailed) as refused:
        AdminApi.from_args(_args())
    assert refused.value.exit_code == 2 and "MODELFORGE_ADMIN_TOKEN" in refused.value.message
    assert not token or token not in refused.value.message


def test_nodes_list_status_marks_a_drained_node_and_a_gpu_that_takes_no_work() -> None:
    from modelforge_cli import nodes_cli

    healthy = {"status": "online", "credential": {"state": "active"}, "gpu_health": [{"schedulable": True}]}
    assert nodes_cli._status(healthy) == "online"
    drained = {**healthy, "drained": True}
    assert nodes_cli._status(drained) == "online,drained"
    faulted = {**healthy, "gpu_health": [{"schedulable": True}, {"schedulable": False}]}
    assert nodes_cli._status(faulted) == "online,gpu-fault"
