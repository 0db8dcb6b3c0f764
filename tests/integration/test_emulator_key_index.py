"""The emulator's index Query reads only the key's items (modelforge_local_stack/key_index.py), and
answers exactly what moto's own Query answers, after every kind of write.

Random writes of every kind the stack and its tools make (put, update in place, remove of an index
attribute, delete, batch write, transactions that commit and transactions that are cancelled and
undone) go to a real emulator over HTTP. After each one, every index Query the tables allow is
answered both ways on the same state: by the patched Query and by moto's own (unpatched) one,
and the two must be equal item for item, in order; the same Query over the wire, page by page,
must give the same items.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from modelforge_local_stack import emulator, key_index

from tests.support.emulators import CLIENT_OPTIONS, bare_emulator

REGION = CLIENT_OPTIONS["region_name"]
ACCOUNT = "123456789012"
VALUES = ["a", "b", "c"]
RANGE_TABLE = "key-index-range"
HASH_TABLE = "key-index-hash"


@pytest.fixture(scope="module")
def server() -> Iterator[emulator.Emulator]:
    with bare_emulator() as running:
        yield running


@pytest.fixture
def dynamodb(server: emulator.Emulator) -> Iterator[Any]:
    client = boto3.client("dynamodb", endpoint_url=server.endpoint_url, **CLIENT_OPTIONS)
    _create(client)
    try:
        yield client
    finally:
        for name in (RANGE_TABLE, HASH_TABLE):
            client.delete_table(TableName=name)  # moto's backends are per process: leave none behind


def _create(client: Any) -> None:
    strings = ("pk", "sk", "q", "qs", "g")
    client.create_table(
        TableName=RANGE_TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": name, "AttributeType": "S"} for name in strings],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_q",
                "KeySchema": [{"AttributeName": "q", "KeyType": "HASH"}, {"AttributeName": "qs", "KeyType": "RANGE"}],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": "by_g",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    )
    client.create_table(
        TableName=HASH_TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": name, "AttributeType": "S"} for name in ("pk", "g")],
        BillingMode="PAY_PER_REQUEST",
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_g",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )


def _key(rng: random.Random, table: str) -> dict[str, Any]:
    key = {"pk": {"S": f"p{rng.randrange(6)}"}}
    if table == RANGE_TABLE:
        key["sk"] = {"S": f"s{rng.randrange(4)}"}
    return key


def _indexed(rng: random.Random, table: str) -> dict[str, Any]:
    """Index attributes, each present or not, from a small set of values so that keys collide."""
    attributes: dict[str, Any] = {"n": {"N": str(rng.randrange(100))}}
    names = ("q", "qs", "g") if table == RANGE_TABLE else ("g",)
    for name in names:
        if rng.random() < 0.75:
            attributes[name] = {"S": rng.choice(VALUES) + (str(rng.randrange(3)) if name == "qs" else "")}
    return attributes


def _update(rng: random.Random, table: str) -> dict[str, Any]:
    name = rng.choice(("q", "qs", "g") if table == RANGE_TABLE else ("g",))
    if rng.random() < 0.3:
        return {"UpdateExpression": f"REMOVE {name}"}
    return {"UpdateExpression": f"SET {name} = :v", "ExpressionAttributeValues": {":v": {"S": rng.choice(VALUES)}}}


def _write(client: Any, rng: random.Random) -> str:
    """One random write; its kind."""
    table = rng.choice((RANGE_TABLE, HASH_TABLE))
    kind = rng.choice(("put", "update", "delete", "batch", "transaction", "cancelled"))
    if kind == "put":
        client.put_item(TableName=table, Item={**_key(rng, table), **_indexed(rng, table)})
    elif kind == "update":
        client.update_item(TableName=table, Key=_key(rng, table), **_update(rng, table))
    elif kind == "delete":
        client.delete_item(TableName=table, Key=_key(rng, table))
    elif kind == "batch":
        requests: dict[str, dict[str, Any]] = {}
        for _ in range(3):
            key = _key(rng, table)
            request = {"PutRequest": {"Item": {**key, **_indexed(rng, table)}}}
            if rng.random() < 0.3:
                request = {"DeleteRequest": {"Key": key}}
            requests[repr(sorted(key.items()))] = request  # one request per key, as DynamoDB demands
        client.batch_write_item(RequestItems={table: list(requests.values())})
    else:
        first, second = _key(rng, table), _key(rng, table)
        while second == first:
            second = _key(rng, table)
        entries: list[dict[str, Any]] = [
            {"Update": {"TableName": table, "Key": first, **_update(rng, table)}},
            {"Put": {"TableName": table, "Item": {**second, **_indexed(rng, table)}}},
        ]
        if kind == "cancelled":
            entries.append(
                {
                    "ConditionCheck": {
                        "TableName": HASH_TABLE,
                        "Key": {"pk": {"S": "never-written"}},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                }
            )
            with pytest.raises(client.exceptions.TransactionCanceledException):
                client.transact_write_items(TransactItems=entries)
        else:
            client.transact_write_items(TransactItems=entries)
    return kind


def _queries() -> Iterator[tuple[str, str, str, str]]:
    for value in [*VALUES, "absent"]:
        yield RANGE_TABLE, "by_q", "q", value
        yield RANGE_TABLE, "by_g", "g", value
        yield HASH_TABLE, "by_g", "g", value


def _both_ways(table: Any, index: str, attribute: str, value: str) -> tuple[list[Any], list[Any]]:
    """The patched Query's answer and moto's own, as item JSON, on the same state."""
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    arguments: tuple[Any, ...] = (None, None, [], None, None, True, None, index, False, None)
    conditions = {"hash_key_conditions": [(attribute, DynamoType({"S": value}))]}
    patched, _, _ = table.query(*arguments, **conditions)
    own, _, _ = Table.query.__wrapped__(table, *arguments, **conditions)
    return [item.to_json() for item in patched], [item.to_json() for item in own]


def _over_the_wire(client: Any, table: str, index: str, attribute: str, value: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    page: dict[str, Any] = {}
    while True:
        answer = client.query(
            TableName=table,
            IndexName=index,
            KeyConditionExpression="#a = :v",
            ExpressionAttributeNames={"#a": attribute},
            ExpressionAttributeValues={":v": {"S": value}},
            Limit=2,
            **page,
        )
        items.extend(answer["Items"])
        if "LastEvaluatedKey" not in answer:
            return items
        page = {"ExclusiveStartKey": answer["LastEvaluatedKey"]}


@pytest.mark.parametrize("seed", range(4))
def test_index_queries_answer_as_moto_does_after_every_kind_of_write(
    server: emulator.Emulator, dynamodb: Any, seed: int
) -> None:
    from moto.dynamodb.models import dynamodb_backends

    rng = random.Random(seed)
    tables = dynamodb_backends[ACCOUNT][REGION].tables
    kinds: set[str] = set()
    matched = 0
    for step in range(120):
        kinds.add(_write(dynamodb, rng))
        for table_name, index, attribute, value in _queries():
            with server.exclusive():
                patched, own = _both_ways(tables[table_name], index, attribute, value)
            assert patched == own, f"seed {seed} step {step}: {table_name}.{index} {attribute}={value}"
            matched += len(own)
            if step % 10 == 0:
                wire = _over_the_wire(dynamodb, table_name, index, attribute, value)
                assert wire == [item["Attributes"] for item in own], f"seed {seed} step {step}: over the wire"
    assert kinds == {"put", "update", "delete", "batch", "transaction", "cancelled"}
    assert matched > 500, "the random writes must leave items to find"  # the comparison compared something


def test_the_maps_are_used_and_read_only_the_keys_items(server: emulator.Emulator, dynamodb: Any) -> None:
    """The patch is live on the emulator, and a Query hands moto only the key's items."""
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.table import Table

    assert getattr(Table.query, "_modelforge_patched", False)
    for number in range(50):
        dynamodb.put_item(
            TableName=HASH_TABLE, Item={"pk": {"S": f"k{number}"}, "g": {"S": "hot" if number < 3 else "cold"}}
        )
    table = dynamodb_backends[ACCOUNT][REGION].tables[HASH_TABLE]
    with server.exclusive():
        handed = key_index._candidates_for(table, None, "by_g", _conditions("g", "hot"))
        assert handed is not None and sorted(item.attrs["pk"].value for item in handed) == ["k0", "k1", "k2"]
        dynamodb_item = table.get_item(_string("k1"))
    assert dynamodb_item is not None
    # an update that moves an item to another key moves it in the map
    dynamodb.update_item(
        TableName=HASH_TABLE,
        Key={"pk": {"S": "k1"}},
        UpdateExpression="SET g = :v",
        ExpressionAttributeValues={":v": {"S": "cold"}},
    )
    with server.exclusive():
        handed = key_index._candidates_for(table, None, "by_g", _conditions("g", "hot"))
    assert handed is not None and sorted(item.attrs["pk"].value for item in handed) == ["k0", "k2"]
    # a deleted item leaves the map (a key left behind would cost a lookup per Query, for ever)
    dynamodb.delete_item(TableName=HASH_TABLE, Key={"pk": {"S": "k0"}})
    with server.exclusive():
        held = {key[0].value for key in table.__dict__["_modelforge_key_index"]["by_g"].value_by_key}
    assert "k0" not in held and {"k2", "k3"} <= held


def _string(value: str) -> Any:
    from moto.dynamodb.models.dynamo_type import DynamoType

    return DynamoType({"S": value})


def _conditions(attribute: str, value: str) -> list[tuple[str, Any]]:
    return [(attribute, _string(value))]
