#!/usr/bin/env python3
"""Minimal reproduction of two moto DynamoDB fidelity gaps, fit to send upstream.

Self-contained: needs only ``pip install "moto[server,dynamodb]" boto3``. It starts moto's own
ThreadedMotoServer on 127.0.0.1 (a free port), with none of ModelForge's code or patches, and
prints what it saw. Bounded in time (``--seconds``, default 20, for the race).

1. Conditional writes are not atomic under concurrency. Real DynamoDB applies a conditional
   write to an item atomically: of N concurrent ``PutItem(ConditionExpression=
   "attribute_not_exists(pk)")`` on one new key exactly one succeeds and the rest get
   ConditionalCheckFailedException. moto's server handles requests on threads and checks the
   condition and writes the item in separate steps, so two requests can both pass.

2. A cancelled TransactWriteItems leaves phantom stream records. DynamoDB writes nothing and
   streams nothing for a cancelled transaction. moto applies the items one by one, and on
   cancellation swaps in deep copies of the tables taken before the transaction. A stream reader
   (shard iterator) opened before the transaction keeps the old table's shard: it reads records
   of the rolled-back writes, and never sees later writes (they go to the copy's shard).

Exit status: 1 if either gap showed, 0 if neither did.
Usage: python localstack/moto_fidelity_repro.py [--seconds 20] [--threads 8]
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Any

import boto3
import moto
from moto.server import ThreadedMotoServer

OPTIONS = {"region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _table(dynamodb: Any, name: str, stream: bool = False) -> str | None:
    spec = {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}} if stream else {}
    description = dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        **spec,
    )["TableDescription"]
    return description.get("LatestStreamArn")


def conditional_put_race(endpoint: str, seconds: float, threads: int) -> bool:
    """Rounds of N threads racing to create one key; report rounds with more than one winner."""
    print(f"[1] conditional writes under concurrency: {threads} threads per round, up to {seconds:.0f} s")
    clients = [boto3.client("dynamodb", endpoint_url=endpoint, **OPTIONS) for _ in range(threads)]
    _table(clients[0], "race")
    deadline = time.monotonic() + seconds
    rounds = doubled = 0
    worst = 0
    while time.monotonic() < deadline and doubled == 0:
        key = f"key-{rounds}"
        barrier = threading.Barrier(threads)
        wins: list[int] = []

        def attempt(index: int, key: str = key, barrier: threading.Barrier = barrier, wins: list[int] = wins) -> None:
            client = clients[index]
            barrier.wait()
            try:
                client.put_item(
                    TableName="race",
                    Item={"pk": {"S": key}, "writer": {"N": str(index)}},
                    ConditionExpression="attribute_not_exists(pk)",
                )
                wins.append(index)
            except client.exceptions.ConditionalCheckFailedException:
                pass

        workers = [threading.Thread(target=attempt, args=(index,)) for index in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        rounds += 1
        worst = max(worst, len(wins))
        if len(wins) > 1:
            doubled += 1
            print(
                f"    round {rounds}: {len(wins)} conditional puts of {key!r} all succeeded (writers {sorted(wins)});"
                " DynamoDB lets exactly one succeed"
            )
    print(f"    {rounds} rounds, {doubled} with more than one winner (most winners in a round: {worst})")
    return doubled > 0


def phantom_stream_records(endpoint: str) -> bool:
    """A cancelled transaction, read through a shard iterator opened before it."""
    print("[2] stream records of a cancelled TransactWriteItems")
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, **OPTIONS)
    streams = boto3.client("dynamodbstreams", endpoint_url=endpoint, **OPTIONS)
    stream_arn = _table(dynamodb, "phantom", stream=True)
    dynamodb.put_item(TableName="phantom", Item={"pk": {"S": "existing"}, "v": {"N": "1"}})
    shard_id = streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    before = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard_id, ShardIteratorType="LATEST")[
        "ShardIterator"
    ]
    try:
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": "phantom", "Item": {"pk": {"S": "rolled-back"}}}},
                {
                    "ConditionCheck": {
                        "TableName": "phantom",
                        "Key": {"pk": {"S": "missing"}},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
            ]
        )
        print("    the transaction was not cancelled (unexpected)")
    except dynamodb.exceptions.TransactionCanceledException:
        print("    TransactWriteItems cancelled as expected (ConditionCheck on a missing item)")
    dynamodb.put_item(TableName="phantom", Item={"pk": {"S": "after"}})
    stored = "Item" in dynamodb.get_item(TableName="phantom", Key={"pk": {"S": "rolled-back"}}, ConsistentRead=True)
    old_reader = _keys(streams, before)
    fresh = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
    new_reader = _keys(streams, fresh["ShardIterator"])
    print(f"    item of the cancelled transaction stored: {stored} (DynamoDB: False)")
    print(f"    reader opened before the transaction saw: {old_reader} (DynamoDB: [('INSERT', 'after')])")
    print(
        f"    reader opened after it, from TRIM_HORIZON: {new_reader}"
        " (DynamoDB: [('INSERT', 'existing'), ('INSERT', 'after')])"
    )
    return stored or old_reader != [("INSERT", "after")]


def _keys(streams: Any, iterator: str) -> list[tuple[str, str]]:
    records = streams.get_records(ShardIterator=iterator)["Records"]
    return [(record["eventName"], record["dynamodb"]["Keys"]["pk"]["S"]) for record in records]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="time limit of the race (default 20)")
    parser.add_argument("--threads", type=int, default=8, help="concurrent writers per round (default 8)")
    arguments = parser.parse_args()
    # frequent thread switches widen nothing in moto; they make an existing window show up sooner
    sys.setswitchinterval(1e-5)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    print(f"moto {moto.__version__}, boto3 {boto3.__version__}, ThreadedMotoServer on {endpoint}")
    try:
        raced = conditional_put_race(endpoint, arguments.seconds, arguments.threads)
        phantom = phantom_stream_records(endpoint)
    finally:
        server.stop()
    print(f"gap 1 (non-atomic conditional writes): {'REPRODUCED' if raced else 'not seen'}")
    print(f"gap 2 (phantom stream records of a cancelled transaction): {'REPRODUCED' if phantom else 'not seen'}")
    return 1 if raced or phantom else 0


if __name__ == "__main__":
    sys.exit(main())
