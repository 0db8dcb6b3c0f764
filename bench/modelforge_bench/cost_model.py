"""The AWS cost model of bench/cost.py: DynamoDB request units by DynamoDB's billing rules, the price
table (bench/aws_prices.json), and what a month of use costs, by service.

Not a script, and pure: no AWS, no emulator, no clock. bench/cost.py measures what an operation
uses (``Usage``) against the embedded emulator and prices it here; tests feed it fixed inputs.

Billing rules applied (the DynamoDB developer guide and pricing page, on-demand mode):

- a write costs one write request unit (WRU) per started 1 KB of the larger of the item's sizes
  before and after the write; a transactional write (each action of ``TransactWriteItems``, a
  ``ConditionCheck`` included) costs two;
- a global secondary index costs a write of its entry's size when an entry appears, disappears
  or changes, and two (a delete and a put) when its key changes; an entry that does not change
  costs nothing. Index writes are priced as standard writes, also inside a transaction;
- a read costs one read request unit (RRU) per started 4 KB of the data read, half that when
  eventually consistent (always, on an index), at least one unit per request; a ``Query`` or
  ``Scan`` sums the sizes of every item it read before rounding;
- item sizes follow DynamoDB's rules (``modelforge_cli.item_size``).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from modelforge_cli.item_size import item_size, write_units

#: bench/aws_prices.json (this package is installed editable, from the checkout, for developers only)
PRICES_FILE = Path(__file__).resolve().parents[1] / "aws_prices.json"
READ_UNIT_BYTES = 4096
#: AWS's pricing convention for a month
HOURS_PER_MONTH = 730
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
#: AWS bills data volumes (log ingestion, data transfer) per GB of 2^30 bytes
BYTES_PER_GB = 1024**3

#: What Lambda itself writes to CloudWatch Logs per invocation in its default (text) log format:
#: START, END and REPORT lines (request id and figures shaped as Lambda prints them).
LAMBDA_PLATFORM_LINES = (
    "START RequestId: 8f507cfc-3ba4-4f3a-9c1e-6d2b5a7e0c11 Version: $LATEST\n",
    "END RequestId: 8f507cfc-3ba4-4f3a-9c1e-6d2b5a7e0c11\n",
    "REPORT RequestId: 8f507cfc-3ba4-4f3a-9c1e-6d2b5a7e0c11\tDuration: 10.25 ms\tBilled Duration: 11 ms\t"
    "Memory Size: 256 MB\tMax Memory Used: 92 MB\t\n",
)
LAMBDA_PLATFORM_BYTES = sum(len(line.encode()) for line in LAMBDA_PLATFORM_LINES)

#: Every price the model uses: key -> what it is priced per (``per`` in the table must say so).
REQUIRED_PRICES: dict[str, str] = {
    "api_gateway_rest_requests": "requests",
    "api_gateway_http_requests": "requests",
    "lambda_requests": "requests",
    "lambda_gb_second_x86_64": "GB-seconds",
    "lambda_gb_second_arm64": "GB-seconds",
    "dynamodb_write_request_units": "write request units",
    "dynamodb_read_request_units": "read request units",
    "dynamodb_streams_read_requests": "streams read request units",
    "dynamodb_streams_read_requests_by_lambda": "streams read request units",
    "s3_put_copy_post_list_requests": "requests",
    "s3_get_and_other_requests": "requests",
    "cloudwatch_logs_ingestion": "GB",
    "eventbridge_scheduled_rule_events": "events",
    "eventbridge_scheduler_invocations": "invocations",
    "data_transfer_out": "GB",
    "api_gateway_websocket_messages": "messages",
    "api_gateway_websocket_connection_minutes": "connection minutes",
}


class PriceTableError(ValueError):
    """The price table is missing a price, or a price lacks its amount, unit, source or date."""


@dataclass(frozen=True)
class Price:
    usd: float
    #: how many units ``usd`` buys (1000000 for "per million requests")
    quantity: float
    unit: str
    source: str
    read_on: str
    note: str = ""

    @property
    def per_unit(self) -> float:
        return self.usd / self.quantity


@dataclass(frozen=True)
class Prices:
    region: str
    currency: str
    entries: dict[str, Price]
    path: str

    def __getitem__(self, key: str) -> Price:
        return self.entries[key]

    def rate(self, key: str) -> float:
        """US dollars for one unit (one request, one GB-second, one GB)."""
        return self.entries[key].per_unit

    @classmethod
    def load(cls, path: Path = PRICES_FILE) -> Prices:
        """Read and check the table: every required price, each with a non-negative amount, a
        positive quantity, its unit, an https source and the ISO date it was read."""
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise PriceTableError(f"cannot read the price table {path}: {error}") from None
        problems: list[str] = []
        entries: dict[str, Price] = {}
        raw_prices = document.get("prices") if isinstance(document, dict) else None
        if not isinstance(raw_prices, dict):
            raise PriceTableError(f"{path}: no 'prices' object")
        for key, unit in REQUIRED_PRICES.items():
            raw = raw_prices.get(key)
            if not isinstance(raw, dict):
                problems.append(f"{key}: missing")
                continue
            price = _price(key, raw, unit, problems)
            if price is not None:
                entries[key] = price
        if document.get("region") != "us-east-1" or document.get("currency") != "USD":
            problems.append("region must be us-east-1 and currency USD (on-demand list prices)")
        if problems:
            raise PriceTableError(f"{path}: " + "; ".join(problems))
        return cls(document["region"], document["currency"], entries, str(path))


def _price(key: str, raw: dict[str, Any], unit: str, problems: list[str]) -> Price | None:
    usd, quantity = raw.get("usd"), raw.get("quantity")
    before = len(problems)
    if not isinstance(usd, (int, float)) or isinstance(usd, bool) or usd < 0:
        problems.append(f"{key}: 'usd' must be a number >= 0")
    if not isinstance(quantity, (int, float)) or isinstance(quantity, bool) or quantity <= 0:
        problems.append(f"{key}: 'quantity' must be a number > 0")
    if raw.get("unit") != unit:
        problems.append(f"{key}: 'unit' must be {unit!r}")
    source = raw.get("source")
    if not isinstance(source, str) or not source.startswith("https://"):
        problems.append(f"{key}: 'source' must name the https:// page the price was read from")
    read_on = raw.get("read_on")
    try:
        datetime.date.fromisoformat(str(read_on))
    except ValueError:
        problems.append(f"{key}: 'read_on' must be the ISO date the price was read")
    if len(problems) > before:
        return None
    return Price(float(usd), float(quantity), unit, str(source), str(read_on), str(raw.get("note", "")))  # type: ignore[arg-type]


# --- DynamoDB request units --------------------------------------------------------------------


@dataclass(frozen=True)
class IndexShape:
    name: str
    keys: tuple[str, ...]
    #: ALL, KEYS_ONLY or INCLUDE
    projection: str
    non_key_attributes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TableShape:
    name: str
    keys: tuple[str, ...]
    indexes: tuple[IndexShape, ...] = ()

    def key_of(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return {name: item[name] for name in self.keys}


def table_shape(name: str, properties: Mapping[str, Any]) -> TableShape:
    """The keys and global secondary indexes of a table, from its CloudFormation properties."""

    def keys(schema: list[dict[str, str]]) -> tuple[str, ...]:
        return tuple(part["AttributeName"] for part in sorted(schema, key=lambda part: part["KeyType"] != "HASH"))

    indexes = tuple(
        IndexShape(
            index["IndexName"],
            keys(index["KeySchema"]),
            index["Projection"]["ProjectionType"],
            tuple(index["Projection"].get("NonKeyAttributes", ())),
        )
        for index in properties.get("GlobalSecondaryIndexes", ())
    )
    return TableShape(name, keys(properties["KeySchema"]), indexes)


def index_entry(item: Mapping[str, Any] | None, table: TableShape, index: IndexShape) -> dict[str, Any] | None:
    """What ``index`` holds for ``item``: None when the item lacks one of the index's keys (a
    sparse index holds no entry for it)."""
    if item is None or any(name not in item for name in index.keys):
        return None
    if index.projection == "ALL":
        return dict(item)
    kept = set(table.keys) | set(index.keys)
    if index.projection == "INCLUDE":
        kept |= set(index.non_key_attributes)
    return {name: value for name, value in item.items() if name in kept}


def index_write_units(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, table: TableShape) -> int:
    """Write request units the table's global secondary indexes cost for one write."""
    units = 0
    for index in table.indexes:
        old, new = index_entry(before, table, index), index_entry(after, table, index)
        if old == new:
            continue
        if old is None or new is None:  # an entry appears or disappears
            units += write_units(item_size(old or new or {}))
        elif any(old[name] != new[name] for name in index.keys):  # moved: delete and put
            units += write_units(item_size(old)) + write_units(item_size(new))
        else:  # a projected attribute changed in place
            units += write_units(max(item_size(old), item_size(new)))
    return units


@dataclass
class RequestUnits:
    """Request units and requests of DynamoDB and S3, as the emulator saw them."""

    table_wru: float = 0.0
    index_wru: float = 0.0
    rru: float = 0.0
    s3_put_class: int = 0
    s3_get_class: int = 0
    #: AWS operations by name (``UpdateItem``, ``S3:PUT``)
    operations: dict[str, int] = field(default_factory=dict)

    @property
    def wru(self) -> float:
        return self.table_wru + self.index_wru

    def add(self, other: RequestUnits) -> None:
        self.table_wru += other.table_wru
        self.index_wru += other.index_wru
        self.rru += other.rru
        self.s3_put_class += other.s3_put_class
        self.s3_get_class += other.s3_get_class
        for name, count in other.operations.items():
            self.operations[name] = self.operations.get(name, 0) + count


def write_request_units(
    action: str,
    table: TableShape,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    *,
    transactional: bool,
) -> RequestUnits:
    """One write action (``Put``, ``Update``, ``Delete`` or ``ConditionCheck``) on one item, given
    the item before and after it (a failed condition leaves them equal: still billed)."""
    if action not in ("Put", "Update", "Delete", "ConditionCheck"):
        raise ValueError(f"unknown write action {action!r}")
    size = max(item_size(before or {}), item_size(after or {}))
    factor = 2 if transactional else 1
    index = 0 if action == "ConditionCheck" else index_write_units(before, after, table)
    return RequestUnits(table_wru=factor * write_units(size), index_wru=float(index))


#: One write of a request: (action, table, key, transactional).
WriteTarget = tuple[str, str, dict[str, Any], bool]


def write_targets(operation: str, payload: Mapping[str, Any], tables: Mapping[str, TableShape]) -> list[WriteTarget]:
    """The items a DynamoDB write request writes (or, ``ConditionCheck``, checks), from its body."""

    def key(table: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if "Key" in body:
            return dict(body["Key"])
        shape = tables.get(table)
        if shape is None:
            raise ValueError(f"a Put on {table}, whose keys are unknown")
        return shape.key_of(body["Item"])

    if operation in ("PutItem", "UpdateItem", "DeleteItem"):
        action = operation.removesuffix("Item")
        return [(action, payload["TableName"], key(payload["TableName"], payload), False)]
    if operation == "TransactWriteItems":
        targets = []
        for entry in payload["TransactItems"]:
            ((action, body),) = entry.items()
            targets.append((action, body["TableName"], key(body["TableName"], body), True))
        return targets
    if operation == "BatchWriteItem":
        return [
            ("Put", table, key(table, request["PutRequest"]), False)
            if "PutRequest" in request
            else ("Delete", table, key(table, request["DeleteRequest"]), False)
            for table, requests in payload["RequestItems"].items()
            for request in requests
        ]
    raise ValueError(f"{operation} is not a write")


def read_request_units(
    sizes: list[int], *, consistent: bool, transactional: bool = False, per_item: bool = False
) -> float:
    """Read request units of one read request: ``sizes`` are the sizes of the items it read
    (``per_item``: each item rounds up on its own, as in ``GetItem``/``BatchGetItem``)."""
    factor = 2.0 if transactional else (1.0 if consistent else 0.5)
    if per_item:
        return factor * sum(max(1, math.ceil(size / READ_UNIT_BYTES)) for size in sizes) if sizes else factor
    return factor * max(1, math.ceil(sum(sizes) / READ_UNIT_BYTES))


# --- what an operation uses, and what that costs ----------------------------------------------------


@dataclass
class Usage:
    """What one operation (a heartbeat, a claim, a sweep run) uses of each billed dimension."""

    api_requests: float = 0.0
    lambda_invocations: float = 0.0
    #: the sum, over the invocations, of each one's duration rounded up to a whole millisecond
    lambda_billed_ms: float = 0.0
    dynamodb_wru: float = 0.0
    dynamodb_rru: float = 0.0
    #: GetRecords calls of the outbox stream by the state-log function's event source mapping
    stream_reads_by_lambda: float = 0.0
    s3_put_class: float = 0.0
    s3_get_class: float = 0.0
    log_bytes: float = 0.0
    scheduled_events: float = 0.0
    transfer_out_bytes: float = 0.0
    #: WebSocket API messages, sent and received, each counted per started 32 KB
    websocket_messages: float = 0.0
    websocket_connection_minutes: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def scaled(self, factor: float) -> Usage:
        return Usage(**{f.name: getattr(self, f.name) * factor for f in fields(self)})

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Deployment:
    """How the stack is deployed, as far as prices go."""

    api: str = "http"  # "http" (HTTP API) or "rest" (REST API)
    architecture: str = "x86_64"  # or "arm64"
    memory_mb: int = 256
    schedule: str = "rule"  # "rule" (an EventBridge scheduled rule) or "scheduler" (EventBridge Scheduler)

    def __post_init__(self) -> None:
        if self.api not in ("http", "rest") or self.architecture not in ("x86_64", "arm64"):
            raise ValueError(f"unknown deployment {self}")
        if self.schedule not in ("rule", "scheduler") or not 128 <= self.memory_mb <= 10240:
            raise ValueError(f"unknown deployment {self}")


#: The lines of a breakdown, in print order (each one AWS service, or one dimension of it).
LINES = (
    "API Gateway",
    "Lambda requests",
    "Lambda duration",
    "DynamoDB writes",
    "DynamoDB reads",
    "DynamoDB Streams",
    "S3 requests",
    "CloudWatch Logs",
    "EventBridge",
    "Data transfer out",
    "WebSocket messages",
    "WebSocket minutes",
)


def cost(usage: Usage, prices: Prices, deployment: Deployment) -> dict[str, float]:
    """US dollars of ``usage`` by line (``LINES``); the total is the sum of the lines."""
    gb_seconds = deployment.memory_mb / 1024 * usage.lambda_billed_ms / 1000
    return {
        "API Gateway": usage.api_requests * prices.rate(f"api_gateway_{deployment.api}_requests"),
        "Lambda requests": usage.lambda_invocations * prices.rate("lambda_requests"),
        "Lambda duration": gb_seconds * prices.rate(f"lambda_gb_second_{deployment.architecture}"),
        "DynamoDB writes": usage.dynamodb_wru * prices.rate("dynamodb_write_request_units"),
        "DynamoDB reads": usage.dynamodb_rru * prices.rate("dynamodb_read_request_units"),
        "DynamoDB Streams": usage.stream_reads_by_lambda * prices.rate("dynamodb_streams_read_requests_by_lambda"),
        "S3 requests": usage.s3_put_class * prices.rate("s3_put_copy_post_list_requests")
        + usage.s3_get_class * prices.rate("s3_get_and_other_requests"),
        "CloudWatch Logs": usage.log_bytes / BYTES_PER_GB * prices.rate("cloudwatch_logs_ingestion"),
        "EventBridge": usage.scheduled_events
        * prices.rate(
            "eventbridge_scheduled_rule_events"
            if deployment.schedule == "rule"
            else "eventbridge_scheduler_invocations"
        ),
        "Data transfer out": usage.transfer_out_bytes / BYTES_PER_GB * prices.rate("data_transfer_out"),
        "WebSocket messages": usage.websocket_messages * prices.rate("api_gateway_websocket_messages"),
        "WebSocket minutes": usage.websocket_connection_minutes
        * prices.rate("api_gateway_websocket_connection_minutes"),
    }


def total(lines: Mapping[str, float]) -> float:
    return sum(lines.values())


def dominant(lines: Mapping[str, float]) -> tuple[str, float]:
    """The largest line and its share of the total (0 when everything is free)."""
    name = max(lines, key=lambda line: lines[line])
    whole = total(lines)
    return name, (lines[name] / whole if whole else 0.0)


def node_month(heartbeat: Usage, interval_seconds: float, inventory: Usage, inventory_refresh_seconds: float) -> Usage:
    """What one node uses in a month: a heartbeat every interval and its inventory re-sent every
    refresh period (the agent waits the interval after each answer, so this is an upper bound)."""
    return heartbeat.scaled(SECONDS_PER_MONTH / interval_seconds) + inventory.scaled(
        SECONDS_PER_MONTH / inventory_refresh_seconds
    )


def linear_fit(points: list[tuple[float, float]], at: float) -> float:
    """The straight line through two measured (size, value) points, at ``at`` (never below 0)."""
    (x1, y1), (x2, y2) = points
    slope = (y2 - y1) / (x2 - x1)
    return max(0.0, y1 + slope * (at - x1))
