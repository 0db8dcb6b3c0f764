"""bench/cost.py measures what it prices, against the embedded emulator, and prices it from the table
file: counts that do not depend on the machine's speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chalicelib.stores import work_store

from tests.support import bench_scripts

REPO = Path(__file__).resolve().parents[2]
HEARTBEATS = 12
#: A price that is not AWS's, so the test can tell that the figures come from the file it names.
HTTP_API_PRICE = 7.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small run in its own process (it starts its own stack and admin token), priced from a copy
    of the price table with the HTTP API's price changed."""
    table = json.loads((REPO / "bench" / "aws_prices.json").read_text())
    table["prices"]["api_gateway_http_requests"]["usd"] = HTTP_API_PRICE
    prices = tmp_path_factory.mktemp("prices") / "prices.json"
    prices.write_text(json.dumps(table))
    ran = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "cost.py"),
            "--heartbeats",
            str(HEARTBEATS),
            "--claims",
            "2",
            "--nodes",
            "20",
            "60",
            "--prices",
            str(prices),
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    document: dict[str, Any] = json.loads(ran.stdout)
    document["_table"] = table
    return document


def test_a_steady_heartbeat_is_one_request_one_update_and_no_read_at_every_interval(report: dict[str, Any]) -> None:
    for interval in ("30", "45", "60"):
        figures = report["measured"][f"heartbeat_{interval}s"]
        assert figures["runs"] == HEARTBEATS
        assert figures["operations_per_run"] == {"UpdateItem": 1.0}
        each = figures["per_run"]
        assert each["api_requests"] == 1 and each["lambda_invocations"] == 1
        assert each["dynamodb_rru"] == 0 and figures["rru_per_run"] == 0
        assert each["s3_put_class"] == 0 and each["s3_get_class"] == 0
        # the 8-GPU node item stays under 1 KB: one write unit, and the sweep's index entry is
        # never moved by a steady heartbeat (only transitions write it)
        assert figures["table_wru_per_run"] == 1.0 and figures["index_wru_per_run"] == 0
    assert report["inputs"]["node_item_write_units"] == 1


def test_the_node_item_stays_under_1_kb_with_the_channel_attributes(report: dict[str, Any]) -> None:
    sizes = report["channel"]["node_item_bytes"]
    # measured: the bench's node asks for tickets, so its item holds one; a connection uses it up
    assert sizes["measured"] <= 1024 and sizes["connected"] < sizes["connected_parked"] <= 1024
    assert sizes["with_ticket"] <= 1024 and sizes["fallback_with_ticket"] <= 1024  # every state: one write unit
    assert sizes["heartbeat_write_units_connected_parked"] == 1


def test_the_node_month_includes_the_channel_line_by_line(report: dict[str, Any]) -> None:
    channel = report["channel"]["node_month"]
    assert set(channel) == {"connection minutes", "keep-alive pings", "forced reconnects", "ticket mints"}
    assert channel["connection minutes"]["usage"]["websocket_connection_minutes"] == pytest.approx(730 * 60)
    assert channel["keep-alive pings"]["usage"]["websocket_messages"] == pytest.approx(730 * 3600 / 300)
    assert channel["forced reconnects"]["usage"]["lambda_invocations"] == pytest.approx(
        2 * report["channel"]["connections_per_month"]
    )
    assert channel["ticket mints"]["usage"]["api_requests"] == 0  # minted inside a heartbeat's own write
    for interval, figures in report["node_month"].items():
        usage = figures["usage"]
        assert usage["websocket_connection_minutes"] == pytest.approx(730 * 60), interval
        assert figures["http"]["total"] > figures["http_total_without_channel"]


def test_dispatched_items_cost_the_claim_path_the_wake_and_the_parks(report: dict[str, Any]) -> None:
    per_item = report["channel"]["per_thousand_items"]
    assert per_item["wake"]["usage"]["websocket_messages"] == pytest.approx(1000 * report["channel"]["wake_per_item"])
    items, claims = report["per_thousand"]["dispatched_items"]["http"], report["per_thousand"]["claims"]["http"]
    assert items["total"] > claims["total"]
    assert report["measured"]["work_empty_claim"]["operations_per_run"].get("TransactWriteItems") is None


def test_every_breakdown_sums_to_its_total(report: dict[str, Any]) -> None:
    priced = [figures[api] for figures in report["node_month"].values() for api in ("rest", "http")]
    priced += [figures[api] for figures in report["per_thousand"].values() for api in ("rest", "http")]
    priced += [figures[api] for figures in report["sweep_month"].values() for api in ("rest", "http")]
    for figures in priced:
        assert sum(figures["lines"].values()) == pytest.approx(figures["total"], rel=1e-12)
        assert figures["largest"] == max(figures["lines"], key=figures["lines"].get)


def test_prices_come_from_the_table_file_with_their_date_and_source(report: dict[str, Any]) -> None:
    table = report["_table"]["prices"]
    entries = report["prices"]["entries"]
    assert set(entries) == set(table)
    for key, price in entries.items():
        assert (price["usd"], price["source"], price["read_on"]) == (
            table[key]["usd"],
            table[key]["source"],
            table[key]["read_on"],
        )
    month = report["node_month"]["45"]
    assert month["http"]["lines"]["API Gateway"] == pytest.approx(month["usage"]["api_requests"] * HTTP_API_PRICE / 1e6)
    assert month["rest"]["lines"]["API Gateway"] == pytest.approx(month["usage"]["api_requests"] * 3.50 / 1e6)


def test_a_node_month_counts_a_heartbeat_per_interval_and_an_hourly_inventory(report: dict[str, Any]) -> None:
    for interval, figures in report["node_month"].items():
        assert figures["usage"]["api_requests"] == pytest.approx(730 * 3600 / int(interval) + 730)


def test_a_claim_is_one_transaction_and_its_result_one_s3_put(report: dict[str, Any]) -> None:
    claim = report["measured"]["work_claim"]["operations_per_run"]
    # the queue's front is read from a random shard: a queue of 2 items spread over the 16 shards
    # takes up to one Query per shard to find them (stores/work_store.py, docs/SCALE.md); a read
    # that found both leaves the second to the next claim (services/queue_fronts.py)
    assert claim["TransactWriteItems"] == 1.0 and 0.5 <= claim["Query"] <= work_store.QUEUE_SHARDS
    assert report["measured"]["work_upload"]["operations_per_run"] == {"S3:PUT": 1.0}
    assert report["measured"]["work_upload"]["per_run"]["api_requests"] == 0


def test_the_sweep_over_a_healthy_fleet_reads_each_node_once_and_writes_nothing(report: dict[str, Any]) -> None:
    small, large = report["measured"]["sweep_run_20_nodes"], report["measured"]["sweep_run_60_nodes"]
    # the index names every node online since before the cutoff; each one's last heartbeat is an
    # eventually consistent read of half a unit (BatchGetItem)
    assert large["rru_per_run"] - small["rru_per_run"] == pytest.approx(40 * 0.5)
    assert small["operations_per_run"]["BatchGetItem"] == large["operations_per_run"]["BatchGetItem"] == 1
    assert small["per_run"]["dynamodb_wru"] == large["per_run"]["dynamodb_wru"] == 0
    assert small["per_run"]["scheduled_events"] == 1
    # a straight line through both runs: half a read unit more per node
    at_1000 = small["rru_per_run"] + (1000 - 20) * 0.5
    assert report["sweep_month"]["1000"]["per_run"]["dynamodb_rru"] == pytest.approx(at_1000)


@pytest.mark.parametrize(
    "argv",
    [
        ["--heartbeats", "9"],
        ["--claims", "0"],
        ["--gpus", "65"],
        ["--nodes", "60", "20"],
        ["--nodes", "5", "20"],
        ["--nodes", "20"],
    ],
)
def test_the_cost_bench_validates_its_options(argv: list[str]) -> None:
    ran = bench_scripts.run("cost", *argv, timeout=60)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "error:" in ran.stderr
