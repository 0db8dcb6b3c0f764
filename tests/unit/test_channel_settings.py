"""Settings of the push channel: both URLs or neither, TLS schemes, plain ones only to loopback."""

from __future__ import annotations

import pytest
from chalicelib.config.settings import SettingsError

from tests.unit.service_bodies import settings_with

URL, MANAGEMENT = "MODELFORGE_CHANNEL_URL", "MODELFORGE_CHANNEL_MANAGEMENT_URL"


def test_settings_without_a_channel_advertise_no_push_channel() -> None:
    settings = settings_with()
    assert (settings.channel_url, settings.channel_management_url, settings.features) == (
        None,
        None,
        ["node_fault", "slots", "gpu_health", "agent_instance"],
    )


@pytest.mark.parametrize(
    ("url", "management"),
    [
        ("wss://abc.execute-api.us-east-1.amazonaws.com/api", "https://abc.execute-api.us-east-1.amazonaws.com/api"),
        ("ws://127.0.0.1:9000/api/v1/agent/channel", "http://127.0.0.1:9000"),
        ("ws://localhost:9000/api/v1/agent/channel", "http://[::1]:9000"),
    ],
)
def test_settings_with_both_channel_urls_advertise_push_channel(url: str, management: str) -> None:
    settings = settings_with(**{URL: url, MANAGEMENT: management})
    assert (settings.channel_url, settings.channel_management_url) == (url, management)
    assert settings.features == ["node_fault", "slots", "gpu_health", "agent_instance", "push_channel"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({URL: "wss://channel.example.com/api"}, MANAGEMENT),
        ({MANAGEMENT: "https://channel.example.com/api"}, MANAGEMENT),
        ({URL: "ws://channel.example.com/api", MANAGEMENT: "https://channel.example.com/api"}, URL),
        ({URL: "https://channel.example.com/api", MANAGEMENT: "https://channel.example.com/api"}, URL),
        ({URL: "wss://channel.example.com/api", MANAGEMENT: "http://channel.example.com/api"}, MANAGEMENT),
        ({URL: "wss://user:pw@channel.example.com/api", MANAGEMENT: "https://channel.example.com"}, URL),
        ({URL: "wss://channel.example.com/api?x=1", MANAGEMENT: "https://channel.example.com"}, URL),
        ({URL: "wss:///api", MANAGEMENT: "https://channel.example.com"}, URL),
        ({URL: "wss://channel.example.com:99999/api", MANAGEMENT: "https://channel.example.com"}, URL),
    ],
)
def test_settings_with_a_bad_channel_setting_are_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as refused:
        settings_with(**env)
    assert any(problem.startswith(named) or named in problem for problem in refused.value.problems)
    assert "example.com" not in str(refused.value)  # names, never values
