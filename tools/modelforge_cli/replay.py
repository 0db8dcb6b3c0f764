"""Rebuild the control plane's tables from the S3 state log.

Events are applied in key order (time, then sequence within a transaction). Only empty
tables are written: replaying into live tables would mix two histories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import boto3

from .catalogue import resources

#: State-log table names -> the environment variable naming the physical table.
TABLE_ENV = {table.name: table.env_var for table in resources.REPLAYED_TABLES}


class ReplayError(Exception):
    pass


@dataclass(frozen=True)
class ReplayReport:
    events: int
    writes: int


def _update_request(table: str, change: dict[str, Any]) -> dict[str, Any]:
    """One UpdateItem making the change: SET, SET if_not_exists, REMOVE, ADD and DELETE parts."""
    names: dict[str, str] = {}
    values: dict[str, Any] = {}

    def placeholders(prefix: str, attributes: dict[str, Any]) -> list[tuple[str, str]]:
        pairs = []
        for index, (name, value) in enumerate(sorted(attributes.items())):
            names[f"#{prefix}{index}"] = name
            values[f":{prefix}{index}"] = value
            pairs.append((f"#{prefix}{index}", f":{prefix}{index}"))
        return pairs

    sets = [f"{name} = {value}" for name, value in placeholders("s", change.get("set", {}))]
    sets += [f"{name} = if_not_exists({name}, {value})" for name, value in placeholders("i", change.get("set_if_absent", {}))]
    adds = [f"{name} {value}" for name, value in placeholders("a", change.get("add", {}))]
    deletes = [f"{name} {value}" for name, value in placeholders("d", change.get("delete", {}))]
    removes = []
    for index, name in enumerate(change.get("remove", [])):
        names[f"#r{index}"] = name
        removes.append(f"#r{index}")
    clauses = (("SET", sets), ("REMOVE", removes), ("ADD", adds), ("DELETE", deletes))
    expression = " ".join(f"{verb} {', '.join(parts)}" for verb, parts in clauses if parts)
    request: dict[str, Any] = {"TableName": table, "Key": change["key"], "UpdateExpression": expression}
    if names:
        request["ExpressionAttributeNames"] = names
    if values:
        request["ExpressionAttributeValues"] = values
    return request


def _add_request(table: str, change: dict[str, Any]) -> dict[str, Any]:
    (name, value), = change["add"].items()
    return {
        "TableName": table,
        "Key": change["key"],
        "UpdateExpression": "ADD #a :a",
        "ExpressionAttributeNames": {"#a": name},
        "ExpressionAttributeValues": {":a": value},
    }


def replay(
    *,
    bucket: str,
    tables: dict[str, str],
    endpoint_url: str | None = None,
    region: str | None = None,
) -> ReplayReport:
    """Apply every event in ``bucket`` to ``tables`` (state-log table name -> physical name)."""
    s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region)
    for logical, physical in tables.items():
        if dynamodb.scan(TableName=physical, Limit=1, Select="COUNT")["Count"]:
            raise ReplayError(f"table {physical} ({logical}) is not empty; replay only rebuilds empty tables")
    events = writes = 0
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=resources.STATE_LOG_PREFIX):
        for entry in page.get("Contents", []):
            event = json.loads(s3.get_object(Bucket=bucket, Key=entry["Key"])["Body"].read())
            events += 1
            for change in event["changes"]:
                table = tables.get(change["table"])
                if table is None:
                    raise ReplayError(f"event {event['event_id']} changes unknown table {change['table']!r}")
                if change["op"] == "put":
                    dynamodb.put_item(TableName=table, Item=change["item"])
                elif change["op"] == "update":
                    dynamodb.update_item(**_update_request(table, change))
                elif change["op"] == "add":
                    dynamodb.update_item(**_add_request(table, change))
                elif change["op"] == "delete":
                    dynamodb.delete_item(TableName=table, Key=change["key"])
                else:
                    raise ReplayError(f"event {event['event_id']} has unknown operation {change['op']!r}")
                writes += 1
    return ReplayReport(events=events, writes=writes)
