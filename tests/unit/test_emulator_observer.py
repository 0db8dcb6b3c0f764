"""The emulator's observer (``SerializingMiddleware.observe``, used by bench/cost.py to price writes):
it sees each app request once, can read the state before and after it, and its reads are neither
counted nor observed."""

from __future__ import annotations

import json
from typing import Any

import boto3
from modelforge_local_stack import emulator

from tests.support.emulators import CLIENT_OPTIONS as OPTIONS


def test_observer_reads_an_item_before_and_after_a_write_and_its_reads_are_not_counted(
    emulator_server: emulator.Emulator,
) -> None:
    server = emulator_server
    dynamodb = boto3.client("dynamodb", endpoint_url=server.endpoint_url, **OPTIONS)
    dynamodb.create_table(
        TableName="observed",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(TableName="observed", Item={"pk": {"S": "a"}, "v": {"N": "1"}})
    seen: list[tuple[str, Any, Any]] = []

    def observer(request: emulator.ObservedRequest) -> bytes:
        if request.operation != "UpdateItem":
            return request.forward()
        key = json.loads(request.body)["Key"]
        read = {"TableName": "observed", "Key": key, "ConsistentRead": True}
        before = request.read("GetItem", read).get("Item")
        answer = request.forward()
        seen.append((request.operation, before, request.read("GetItem", read).get("Item")))
        return answer

    assert server.middleware is not None
    counted = server.middleware.snapshot()
    server.middleware.observe(observer)
    dynamodb.update_item(
        TableName="observed",
        Key={"pk": {"S": "a"}},
        UpdateExpression="SET v = :v",
        ExpressionAttributeValues={":v": {"N": "2"}},
    )
    server.middleware.observe(None)
    dynamodb.update_item(
        TableName="observed",
        Key={"pk": {"S": "a"}},
        UpdateExpression="SET v = :v",
        ExpressionAttributeValues={":v": {"N": "3"}},
    )

    assert seen == [("UpdateItem", {"pk": {"S": "a"}, "v": {"N": "1"}}, {"pk": {"S": "a"}, "v": {"N": "2"}})]
    after = server.middleware.snapshot()
    assert {name: after[name] - counted.get(name, 0) for name in after if after[name] != counted.get(name, 0)} == {
        "UpdateItem": 2
    }
    assert dynamodb.get_item(TableName="observed", Key={"pk": {"S": "a"}})["Item"]["v"] == {"N": "3"}


def test_observer_sees_s3_requests_without_reading_their_bodies(emulator_server: emulator.Emulator) -> None:
    server = emulator_server
    s3 = boto3.client("s3", endpoint_url=server.endpoint_url, **OPTIONS)
    s3.create_bucket(Bucket="observed-bucket")
    seen: list[tuple[str, str, bytes]] = []

    def observer(request: emulator.ObservedRequest) -> bytes:
        seen.append((request.operation, request.path, request.body))
        return request.forward()

    assert server.middleware is not None
    server.middleware.observe(observer)
    s3.put_object(Bucket="observed-bucket", Key="k", Body=b"payload")
    assert s3.get_object(Bucket="observed-bucket", Key="k")["Body"].read() == b"payload"
    server.middleware.observe(None)
    assert seen == [("S3:PUT", "/observed-bucket/k", b""), ("S3:GET", "/observed-bucket/k", b"")]
