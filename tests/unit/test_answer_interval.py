"""The heartbeat interval a node is answered: the channel's wake frees a connected node from its
heartbeats, so only it gets the cheaper interval; every other node keeps the shorter fallback one."""

from __future__ import annotations

import pytest
from chalicelib.config import resources
from chalicelib.config.settings import SettingsError, load_settings

BASE = {
    **resources.local_names("test"),
    "MODELFORGE_ADMIN_TOKEN_SHA256": "a" * 64,
    "MODELFORGE_NODE_STALE_AFTER_SECONDS": "90",
    "MODELFORGE_NODE_OFFLINE_AFTER_SECONDS": "300",
}
CHANNEL = {
    "MODELFORGE_CHANNEL_URL": "ws://127.0.0.1:9000/api/v1/agent/channel",
    "MODELFORGE_CHANNEL_MANAGEMENT_URL": "http://127.0.0.1:9000",
}


def test_answer_interval_connected_node_gets_the_heartbeat_interval() -> None:
    settings = load_settings({**BASE, **CHANNEL})
    assert settings.answer_interval(channel_connected=True) == 45


def test_answer_interval_node_without_a_connection_keeps_the_fallback_interval() -> None:
    settings = load_settings({**BASE, **CHANNEL})
    assert settings.answer_interval(channel_connected=False) == 15


def test_answer_interval_without_a_channel_configured_every_node_is_fallback() -> None:
    settings = load_settings(BASE)
    assert settings.answer_interval(channel_connected=True) == 15


def test_answer_interval_never_exceeds_the_configured_heartbeat_interval() -> None:
    settings = load_settings({**BASE, **CHANNEL, "MODELFORGE_HEARTBEAT_INTERVAL_SECONDS": "5"})
    assert settings.answer_interval(channel_connected=False) == 5
    assert settings.answer_interval(channel_connected=True) == 5


def test_answer_interval_fallback_interval_is_read_and_bounded() -> None:
    settings = load_settings({**BASE, **CHANNEL, "MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS": "30"})
    assert settings.answer_interval(channel_connected=False) == 30
    with pytest.raises(SettingsError, match="MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS"):
        load_settings({**BASE, "MODELFORGE_FALLBACK_HEARTBEAT_INTERVAL_SECONDS": "0"})
