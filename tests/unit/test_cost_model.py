"""The pure cost model of bench/cost.py (bench/modelforge_bench/cost_model.py): DynamoDB request units by the
billing rules, the price table, and what a fixed usage costs by line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from modelforge_bench import cost_model as model

NODES = model.TableShape(
    "nodes",
    ("node_id",),
    (model.IndexShape("by_liveness", ("liveness_shard", "heartbeat_bucket"), "KEYS_ONLY"),),
)
WORK = model.TableShape("work", ("work_id",), (model.IndexShape("by_queue", ("queue_key", "queued_at"), "ALL"),))


def node(bucket: int | None, padding: int = 0, shard: str = "online#1") -> dict[str, Any]:
    item: dict[str, Any] = {"node_id": {"S": "node_1"}, "telemetry": {"S": "x" * padding}}
    if bucket is not None:
        item |= {"liveness_shard": {"S": shard}, "heartbeat_bucket": {"N": str(bucket)}}
    return item


def test_index_write_units_move_costs_a_delete_and_a_put() -> None:
    assert model.index_write_units(node(45), node(90), NODES) == 2


def test_index_write_units_unchanged_keys_only_entry_costs_nothing() -> None:
    # the telemetry changed, but a keys-only entry holds none of it
    assert model.index_write_units(node(45, padding=10), node(45, padding=900), NODES) == 0


def test_index_write_units_entry_appearing_or_disappearing_costs_one_write() -> None:
    assert model.index_write_units(node(None), node(45), NODES) == 1
    assert model.index_write_units(node(45), node(None), NODES) == 1
    assert model.index_write_units(None, node(None), NODES) == 0


def test_index_write_units_all_projection_changed_in_place_costs_its_size() -> None:
    before = {"work_id": {"S": "w"}, "queue_key": {"S": "ocr"}, "queued_at": {"N": "1"}, "note": {"S": "a"}}
    after = {**before, "note": {"S": "b" * 1500}}
    assert model.index_write_units(before, after, WORK) == 2  # one write of a 1.5 KB entry


def test_write_request_units_bills_the_larger_image_and_doubles_in_a_transaction() -> None:
    small, large = node(45, padding=100), node(90, padding=1500)
    plain = model.write_request_units("Update", NODES, small, large, transactional=False)
    assert (plain.table_wru, plain.index_wru) == (2, 2)
    doubled = model.write_request_units("Update", NODES, small, large, transactional=True)
    assert (doubled.table_wru, doubled.index_wru) == (4, 2)  # index writes are standard writes


def test_write_request_units_condition_check_is_a_transactional_write_without_index_writes() -> None:
    units = model.write_request_units("ConditionCheck", NODES, node(45), node(45), transactional=True)
    assert (units.table_wru, units.index_wru) == (2, 0)


def test_read_request_units_round_per_request_or_per_item() -> None:
    assert model.read_request_units([0], consistent=True, per_item=True) == 1.0  # a missing item still costs
    assert model.read_request_units([0], consistent=False, per_item=True) == 0.5
    assert model.read_request_units([], consistent=False) == 0.5  # an empty query still costs
    assert model.read_request_units([3000, 3000], consistent=False) == 1.0  # 6000 bytes: two 4 KB units, halved
    assert model.read_request_units([3000, 3000], consistent=True, per_item=True) == 2.0
    assert model.read_request_units([100], consistent=True, transactional=True, per_item=True) == 2.0


def test_write_targets_names_every_item_a_request_writes() -> None:
    tables = {"nodes": NODES, "work": WORK}
    assert model.write_targets("UpdateItem", {"TableName": "nodes", "Key": {"node_id": {"S": "n"}}}, tables) == [
        ("Update", "nodes", {"node_id": {"S": "n"}}, False)
    ]
    put = {"TableName": "work", "Item": {"work_id": {"S": "w"}, "other": {"N": "1"}}}
    assert model.write_targets("PutItem", put, tables) == [("Put", "work", {"work_id": {"S": "w"}}, False)]
    transaction = {
        "TransactItems": [
            {"Update": {"TableName": "work", "Key": {"work_id": {"S": "w"}}}},
            {"ConditionCheck": {"TableName": "nodes", "Key": {"node_id": {"S": "n"}}}},
            {"Put": {"TableName": "nodes", "Item": {"node_id": {"S": "m"}}}},
        ]
    }
    assert [
        (action, table, transactional)
        for action, table, _, transactional in model.write_targets("TransactWriteItems", transaction, tables)
    ] == [
        ("Update", "work", True),
        ("ConditionCheck", "nodes", True),
        ("Put", "nodes", True),
    ]
    batch = {
        "RequestItems": {
            "nodes": [
                {"PutRequest": {"Item": {"node_id": {"S": "a"}}}},
                {"DeleteRequest": {"Key": {"node_id": {"S": "b"}}}},
            ]
        }
    }
    assert [action for action, *_ in model.write_targets("BatchWriteItem", batch, tables)] == ["Put", "Delete"]
    with pytest.raises(ValueError):
        model.write_targets("GetItem", {}, tables)


def _price(usd: float, quantity: float, unit: str) -> dict[str, Any]:
    return {
        "usd": usd,
        "quantity": quantity,
        "unit": unit,
        "source": "https://aws.amazon.com/example/",
        "read_on": "2026-12-01",
    }


def fixed_prices(tmp_path: Path, **changes: dict[str, Any]) -> Path:
    """A price table with round prices (not AWS's), so the expected dollars are easy to check."""
    prices = {
        key: _price(1.0, 1_000_000 if unit != "GB-seconds" and unit != "GB" else 1, unit)
        for key, unit in model.REQUIRED_PRICES.items()
    }
    prices.update(changes)
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"region": "us-east-1", "currency": "USD", "prices": prices}))
    return path


def test_cost_of_a_fixed_usage_is_each_dimension_times_its_price_and_the_lines_sum_to_the_total(tmp_path: Path) -> None:
    prices = model.Prices.load(
        fixed_prices(
            tmp_path,
            api_gateway_http_requests=_price(1.00, 1_000_000, "requests"),
            lambda_gb_second_x86_64=_price(0.0000166667, 1, "GB-seconds"),
            dynamodb_write_request_units=_price(0.625, 1_000_000, "write request units"),
            s3_put_copy_post_list_requests=_price(0.005, 1000, "requests"),
            cloudwatch_logs_ingestion=_price(0.50, 1, "GB"),
        )
    )
    usage = model.Usage(
        api_requests=2_000_000,
        lambda_invocations=3_000_000,
        lambda_billed_ms=4_000_000,  # at 512 MB: 2,000 GB-seconds
        dynamodb_wru=1_600_000,
        s3_put_class=10_000,
        log_bytes=2 * 1024**3,
    )
    lines = model.cost(usage, prices, model.Deployment(api="http", architecture="x86_64", memory_mb=512))
    assert lines["API Gateway"] == pytest.approx(2.00)
    assert lines["Lambda requests"] == pytest.approx(3.00)  # the fixed table's 1.00 per million
    assert lines["Lambda duration"] == pytest.approx(2000 * 0.0000166667)
    assert lines["DynamoDB writes"] == pytest.approx(1.00)
    assert lines["S3 requests"] == pytest.approx(0.05)
    assert lines["CloudWatch Logs"] == pytest.approx(1.00)
    assert set(lines) == set(model.LINES)
    assert model.total(lines) == pytest.approx(sum(lines.values()))
    assert model.dominant(lines)[0] == "Lambda requests"


def test_node_month_counts_heartbeats_and_inventory_resends_over_730_hours() -> None:
    month = model.node_month(model.Usage(api_requests=1, dynamodb_wru=2), 15, model.Usage(api_requests=1), 3600)
    assert month.api_requests == pytest.approx(730 * 3600 / 15 + 730)
    assert month.dynamodb_wru == pytest.approx(2 * 730 * 3600 / 15)


def test_linear_fit_goes_through_both_points_and_never_below_zero() -> None:
    assert model.linear_fit([(100, 1.0), (200, 2.0)], 1000) == pytest.approx(10.0)
    assert model.linear_fit([(100, 5.0), (200, 5.0)], 10_000) == pytest.approx(5.0)
    assert model.linear_fit([(100, 2.0), (200, 1.0)], 10_000) == 0.0


def test_the_price_table_holds_every_price_with_its_source_and_date() -> None:
    prices = model.Prices.load()
    assert set(prices.entries) == set(model.REQUIRED_PRICES)
    for key, price in prices.entries.items():
        assert price.source.startswith("https://aws.amazon.com/"), key
        assert price.read_on, key
    # the late-2024 DynamoDB on-demand prices, and the two API kinds the issue compares
    assert prices.rate("dynamodb_write_request_units") * 1e6 == pytest.approx(0.625)
    assert prices.rate("dynamodb_read_request_units") * 1e6 == pytest.approx(0.125)
    assert prices.rate("api_gateway_rest_requests") * 1e6 == pytest.approx(3.50)
    assert prices.rate("api_gateway_http_requests") * 1e6 == pytest.approx(1.00)


def test_a_price_table_without_a_source_or_a_price_is_refused_naming_them(tmp_path: Path) -> None:
    path = fixed_prices(tmp_path, lambda_requests={**_price(0.2, 1_000_000, "requests"), "source": ""})
    document = json.loads(path.read_text())
    del document["prices"]["data_transfer_out"]
    path.write_text(json.dumps(document))
    with pytest.raises(model.PriceTableError) as refused:
        model.Prices.load(path)
    assert "lambda_requests: 'source'" in str(refused.value)
    assert "data_transfer_out: missing" in str(refused.value)


# --- the push channel (modelforge_bench.channel_cost) -------------------------------------------


def test_channel_cost_forced_reconnects_spread_over_the_last_fifth_of_two_hours() -> None:
    from modelforge_bench import channel_cost

    assert channel_cost.mean_connection_seconds() == pytest.approx(0.9 * 7200)
    assert channel_cost.connections_per_month() == pytest.approx(730 * 3600 / 6480)


def test_channel_cost_node_month_counts_minutes_pings_reconnects_and_mints() -> None:
    from modelforge_bench import channel_cost

    handler = model.Usage(api_requests=1, lambda_invocations=1, lambda_billed_ms=12, dynamodb_wru=1, log_bytes=400)
    sizes = channel_cost.NodeItemSizes(
        measured=880, connected=960, connected_parked=980, with_ticket=1040, fallback_with_ticket=1000
    )
    lines = channel_cost.node_month(handler, sizes)
    connections = channel_cost.connections_per_month()
    assert lines["connection minutes"].websocket_connection_minutes == 730 * 60
    pings = lines["keep-alive pings"]
    assert pings.websocket_messages == pings.lambda_invocations == 730 * 12
    assert pings.lambda_billed_ms == 12 * 730 * 12 and pings.log_bytes == 400 * 730 * 12
    assert pings.api_requests == 0 and pings.dynamodb_wru == 0  # a ping writes nothing
    reconnects = lines["forced reconnects"]
    assert reconnects.lambda_invocations == pytest.approx(2 * connections)
    # connect: the item billed at its larger image (with the ticket: 2 units) + the by_channel entry;
    # disconnect: 1 unit + the entry leaving
    assert reconnects.dynamodb_wru == pytest.approx(connections * (2 + 1 + 1 + 1))
    assert reconnects.dynamodb_rru == pytest.approx(connections * 1.5)
    mints = lines["ticket mints"]
    assert mints.api_requests == 0 and mints.lambda_invocations == 0
    assert mints.dynamodb_wru == pytest.approx(connections)  # the ticket tips the item over 1 KB
    assert mints.transfer_out_bytes > 0


def test_channel_cost_per_item_wakes_two_parked_nodes_and_counts_their_parks() -> None:
    from modelforge_bench import channel_cost

    empty_claim = model.Usage(api_requests=1, lambda_invocations=1, dynamodb_rru=1.5)
    sizes = channel_cost.NodeItemSizes(
        measured=880, connected=960, connected_parked=980, with_ticket=1040, fallback_with_ticket=1000
    )
    lines = channel_cost.per_item(empty_claim, sizes)
    assert lines["wake"].websocket_messages == 2 and lines["wake"].dynamodb_wru == 4
    assert lines["parks"].dynamodb_wru == 2 * 3 and lines["parks"].dynamodb_rru == 2 * 0.5
    assert lines["empty claims"].api_requests == 1


def test_channel_cost_node_item_sizes_add_the_channel_attributes() -> None:
    from modelforge_bench import channel_cost

    item = {"node_id": {"S": "node_" + "0" * 32}, "telemetry": {"S": "x" * 700}}
    sizes = channel_cost.node_item_sizes(item)
    assert sizes.measured < sizes.connected < sizes.connected_parked
    assert sizes.with_ticket - sizes.measured > 64  # a SHA-256 in hex and its expiry
    assert sizes.as_dict()["heartbeat_write_units_connected_parked"] == 1
    # a measured item that holds a minted ticket: the connection used it up
    with_ticket = channel_cost.node_item_sizes({**item, **channel_cost.TICKET_ATTRIBUTES})
    assert (with_ticket.connected, with_ticket.connected_parked) == (sizes.connected, sizes.connected_parked)
    assert with_ticket.with_ticket == sizes.with_ticket


def test_channel_cost_connected_state_follows_the_store_a_connection_uses_the_ticket_up() -> None:
    from chalicelib.stores import changes
    from chalicelib.stores.models import NodeModel
    from modelforge_bench import channel_cost

    stored = {name: attribute.attr_name for name, attribute in NodeModel.get_attributes().items()}
    removed = {stored[name] for name, value in changes.channel_connected("c" * 16, 1.0).items() if value is None}
    assert removed == set(channel_cost.TICKET_ATTRIBUTES)


def test_cost_prices_websocket_messages_and_connection_minutes(tmp_path: Path) -> None:
    prices = model.Prices.load(fixed_prices(tmp_path))
    lines = model.cost(
        model.Usage(websocket_messages=3_000_000, websocket_connection_minutes=4_000_000), prices, model.Deployment()
    )
    assert lines["WebSocket messages"] == pytest.approx(3 * prices["api_gateway_websocket_messages"].usd)
    assert lines["WebSocket minutes"] == pytest.approx(4 * prices["api_gateway_websocket_connection_minutes"].usd)


def test_channel_cost_attributes_are_the_names_the_nodes_table_stores() -> None:
    from chalicelib.stores.models import NodeModel
    from modelforge_bench import channel_cost

    stored = {name: attribute.attr_name for name, attribute in NodeModel.get_attributes().items()}
    names = {**channel_cost.CONNECTED_ATTRIBUTES, **channel_cost.PARKED_ATTRIBUTES, **channel_cost.TICKET_ATTRIBUTES}
    assert set(names) == {
        stored[field]
        for field in (
            "channel_connection_id",
            "channel_connected_at",
            "channel_state",
            "parked_at",
            "gpu_blocks",
            "slots_busy",
            "channel_ticket_sha256",
            "channel_ticket_expires_at",
        )
    }
