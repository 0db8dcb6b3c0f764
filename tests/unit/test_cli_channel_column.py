"""`modelforge nodes list` prints the node's push channel in its CHANNEL column; `nodes show` says why."""

from __future__ import annotations

from modelforge_cli import nodes_cli


def _node(**fields: object) -> dict[str, object]:
    return {"display_name": "box", "node_id": "node_" + "a" * 32, "status": "online", **fields}


def test_nodes_list_channel_column_shows_connected_or_fallback() -> None:
    assert nodes_cli.HEADERS[-1] == "CHANNEL"
    assert nodes_cli.row(_node(channel="connected"))[-1] == "connected"
    assert nodes_cli.row(_node(channel="fallback", channel_reason="proxy refused"))[-1] == "fallback"


def test_nodes_list_channel_column_of_an_older_control_plane_is_a_dash() -> None:
    assert nodes_cli.row(_node())[-1] == "-"


def test_nodes_show_gives_the_fallback_reason() -> None:
    text = nodes_cli.describe(_node(channel="fallback", channel_reason="no channel connection"))
    assert "fallback no channel connection" in text


def test_nodes_show_gives_the_slots_a_heartbeat_reported() -> None:
    text = nodes_cli.describe(_node(slots={"total": 4, "busy": 1, "schedulable": 3}))
    assert "4 (1 busy, 3 schedulable)" in text
    assert "slots:                -" in nodes_cli.describe(_node(slots=None))  # an agent that does not report them
