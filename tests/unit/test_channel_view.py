"""How a node's push channel reads in the node view and in readiness: connected, or fallback and why
(fallback never fails readiness)."""

from __future__ import annotations

import pytest
from chalicelib.api import views
from chalicelib.domain import channel_state
from chalicelib.services import readiness
from chalicelib.services.listing import NodeDetails

from tests.support.memory_stores import memory_stores
from tests.unit.service_bodies import NOW, SETTINGS, node_record, settings_with

CHANNEL = settings_with(
    MODELFORGE_CHANNEL_URL="wss://channel.example.com/live",
    MODELFORGE_CHANNEL_MANAGEMENT_URL="https://channel.example.com/live",
)


@pytest.mark.parametrize(
    ("fields", "configured", "expected"),
    [
        ({"channel_connection_id": "c="}, True, ("connected", None)),
        ({"channel_connection_id": "c=", "channel_reason": "old"}, True, ("connected", None)),
        ({"channel_reason": "proxy refused"}, True, ("fallback", "proxy refused")),
        ({"channel_state": "off"}, True, ("fallback", channel_state.TURNED_OFF)),
        ({"channel_state": "connecting"}, True, ("fallback", channel_state.NO_CONNECTION)),
        ({}, True, ("fallback", channel_state.NO_CONNECTION)),
        ({"channel_connection_id": "c="}, False, ("fallback", channel_state.NOT_CONFIGURED)),
    ],
)
def test_channel_of_node_is_connected_only_with_a_live_connection(
    fields: dict[str, str], configured: bool, expected: tuple[str, str | None]
) -> None:
    assert channel_state.channel_of(node_record(**fields), configured) == expected


def test_node_view_carries_channel_and_its_reason() -> None:
    shown = views.node(NodeDetails(node_record(channel_reason="proxy refused"), None, None), CHANNEL, NOW)
    assert (shown["channel"], shown["channel_reason"]) == ("fallback", "proxy refused")
    shown = views.node(NodeDetails(node_record(channel_connection_id="c="), None, None), CHANNEL, NOW)
    assert (shown["channel"], shown["channel_reason"]) == ("connected", None)


@pytest.mark.parametrize(
    ("fields", "settings", "detail"),
    [
        ({"channel_connection_id": "c="}, CHANNEL, "connected"),
        ({"channel_reason": "proxy refused"}, CHANNEL, "fallback: proxy refused"),
        ({}, SETTINGS, f"fallback: {channel_state.NOT_CONFIGURED}"),
    ],
)
def test_readiness_push_channel_passes_connected_or_in_fallback(fields: dict[str, str], settings, detail: str) -> None:  # type: ignore[no-untyped-def]
    stores = memory_stores()
    node = node_record(**fields)
    stores.nodes.seed(node)
    [check] = [
        check for check in readiness.check(stores, settings, node.node_id, NOW).checks if check.name == "push_channel"
    ]
    assert (check.ok, check.detail, check.next_step) == (True, detail, None)
