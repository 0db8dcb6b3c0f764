"""The emulator's count of accepted writes (``SerializingMiddleware.changes``), which the bad-input
tests take as proof that a refused request changed nothing: it moves on every write DynamoDB or
S3 accepts, and on nothing else (reads, refused conditional writes, cancelled transactions, the
stream poller's requests)."""

from __future__ import annotations

import uuid

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError
from modelforge_local_stack import emulator

from tests.support.emulators import CLIENT_OPTIONS as OPTIONS


def _dynamodb(server: emulator.Emulator, user_agent: str | None = None):  # type: ignore[no-untyped-def]
    config = botocore.config.Config(user_agent_extra=user_agent) if user_agent else None
    return boto3.client("dynamodb", endpoint_url=server.endpoint_url, config=config, **OPTIONS)


def _table(server: emulator.Emulator) -> str:
    """A new table (moto's state outlives one emulator in a process: names never repeat)."""
    name = f"counted-{uuid.uuid4().hex}"
    _dynamodb(server).create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def test_accepted_writes_move_the_count_once_each(emulator_server: emulator.Emulator) -> None:
    server = emulator_server
    table = _table(server)
    dynamodb = _dynamodb(server)
    s3 = boto3.client("s3", endpoint_url=server.endpoint_url, **OPTIONS)
    s3.create_bucket(Bucket=table)
    start = server.changes
    dynamodb.put_item(TableName=table, Item={"pk": {"S": "a"}})
    dynamodb.update_item(
        TableName=table,
        Key={"pk": {"S": "a"}},
        UpdateExpression="SET v = :v",
        ExpressionAttributeValues={":v": {"N": "1"}},
    )
    dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": table, "Item": {"pk": {"S": "b"}}}}])
    s3.put_object(Bucket=table, Key="k", Body=b"x")
    s3.delete_object(Bucket=table, Key="k")
    assert server.changes - start == 5


def test_reads_and_refused_writes_leave_the_count_alone(emulator_server: emulator.Emulator) -> None:
    server = emulator_server
    table = _table(server)
    dynamodb = _dynamodb(server)
    s3 = boto3.client("s3", endpoint_url=server.endpoint_url, **OPTIONS)
    s3.create_bucket(Bucket=table)
    dynamodb.put_item(TableName=table, Item={"pk": {"S": "a"}})
    s3.put_object(Bucket=table, Key="k", Body=b"x")
    start = server.changes
    dynamodb.get_item(TableName=table, Key={"pk": {"S": "a"}})
    dynamodb.scan(TableName=table)
    s3.get_object(Bucket=table, Key="k")
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        dynamodb.put_item(TableName=table, Item={"pk": {"S": "a"}}, ConditionExpression="attribute_not_exists(pk)")
    with pytest.raises(ClientError, match="TransactionCanceled"):
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": table, "Item": {"pk": {"S": "c"}}}},
                {
                    "ConditionCheck": {
                        "TableName": table,
                        "Key": {"pk": {"S": "a"}},
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=table, Key="k", Body=b"y", IfNoneMatch="*")
    assert server.changes == start
    assert "c" not in {item["pk"]["S"] for item in dynamodb.scan(TableName=table)["Items"]}


def test_the_stream_pollers_writes_are_not_the_apps(emulator_server: emulator.Emulator) -> None:
    server = emulator_server
    table = _table(server)
    start = server.changes
    _dynamodb(server, user_agent=emulator.POLLER_USER_AGENT).put_item(TableName=table, Item={"pk": {"S": "p"}})
    assert server.changes == start
    _dynamodb(server).put_item(TableName=table, Item={"pk": {"S": "q"}})
    assert server.changes == start + 1
