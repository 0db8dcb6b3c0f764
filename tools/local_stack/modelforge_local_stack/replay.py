"""Rebuild the control plane's tables from the S3 state log (`modelforge log replay`).

Events are applied in key order (time, then sequence within a transaction). Only empty
tables are written: replaying into live tables would mix two histories. A target table that does
not exist is created first, from its definition in infra/resources.json.

Where: a local stack named by its data dir (``--data-dir D``, or ``--local`` for the one
./scripts/dev-up runs): the running one's emulator, found in the data dir's lock file, or, when
it is stopped, the data dir itself (restored into an emulator in this process, replayed, and
saved back); or any AWS endpoint (``--endpoint-url``, LocalStack) or AWS itself. Every failure
is one line, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3

from .catalogue import REPO_ROOT, resources

#: State-log table names -> the environment variable naming the physical table.
TABLE_ENV = {table.name: table.env_var for table in resources.REPLAYED_TABLES}
#: The data dir of the stack ./scripts/dev-up runs (``--local``).
DEV_UP_DATA_DIR = REPO_ROOT / ".modelforge" / "control-plane"
DEFAULT_PREFIX = "modelforge"
LOCAL_REGION = "us-east-1"
EXIT_OK, EXIT_ERROR = 0, 1


class ReplayError(Exception):
    pass


@dataclass(frozen=True)
class ReplayReport:
    events: int
    writes: int
    #: target tables that did not exist and were created
    created: list[str] = field(default_factory=list)


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
    sets += [
        f"{name} = if_not_exists({name}, {value})" for name, value in placeholders("i", change.get("set_if_absent", {}))
    ]
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
    ((name, value),) = change["add"].items()
    return {
        "TableName": table,
        "Key": change["key"],
        "UpdateExpression": "ADD #a :a",
        "ExpressionAttributeNames": {"#a": name},
        "ExpressionAttributeValues": {":a": value},
    }


def _is_loopback(endpoint_url: str | None) -> bool:
    host = urlsplit(endpoint_url or "").hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def _client_options(endpoint_url: str | None, region: str | None) -> dict[str, Any]:
    """Region and credentials for boto3, or a ``ReplayError`` saying what is missing. A loopback
    endpoint (the local stack, LocalStack) takes any credentials, so it gets placeholders."""
    session = boto3.session.Session()
    options: dict[str, Any] = {"endpoint_url": endpoint_url}
    options["region_name"] = region or session.region_name or (LOCAL_REGION if _is_loopback(endpoint_url) else None)
    if options["region_name"] is None:
        raise ReplayError(
            "no AWS region: set AWS_DEFAULT_REGION (for the local stack, name its data dir with --data-dir D, or --local)"
        )
    if session.get_credentials() is None:
        if not _is_loopback(endpoint_url):
            raise ReplayError(
                "no AWS credentials: configure them as for the AWS CLI (for the local stack, name its data dir with "
                "--data-dir D, or --local)"
            )
        # the local emulator accepts any credentials; these are not secrets
        options.update(aws_access_key_id="local", aws_secret_access_key="local")
    return options


def _table_definitions() -> dict[str, dict[str, Any]]:
    """State-log table name -> its CloudFormation properties in infra/resources.json."""
    from .provision import load_resources

    definitions = load_resources()
    return {table.name: definitions[table.logical_id]["Properties"] for table in resources.REPLAYED_TABLES}


def _ensure_tables(dynamodb: Any, tables: dict[str, str]) -> list[str]:
    """Create the target tables that do not exist (as infra/resources.json defines them)."""
    from .provision import create_table_request

    existing: set[str] = set()
    for page in dynamodb.get_paginator("list_tables").paginate():
        existing.update(page.get("TableNames", []))
    created = []
    definitions = _table_definitions()
    for logical, physical in tables.items():
        if physical in existing:
            continue
        properties = definitions[logical]
        dynamodb.create_table(**create_table_request(properties, physical))
        dynamodb.get_waiter("table_exists").wait(TableName=physical, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        if properties.get("TimeToLiveSpecification"):
            dynamodb.update_time_to_live(
                TableName=physical, TimeToLiveSpecification=properties["TimeToLiveSpecification"]
            )
        created.append(physical)
    return created


def replay(
    *,
    bucket: str,
    tables: dict[str, str],
    endpoint_url: str | None = None,
    region: str | None = None,
) -> ReplayReport:
    """Apply every event in ``bucket`` to ``tables`` (state-log table name -> physical name),
    creating the tables that do not exist."""
    options = _client_options(endpoint_url, region)
    s3 = boto3.client("s3", **options)
    dynamodb = boto3.client("dynamodb", **options)
    try:
        s3.head_bucket(Bucket=bucket)
    except s3.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
            where = endpoint_url or "AWS"
            raise ReplayError(
                f"there is no bucket {bucket} at {where}: name the state-log bucket with --bucket"
            ) from None
        raise
    created = _ensure_tables(dynamodb, tables)
    for logical, physical in tables.items():
        if dynamodb.scan(TableName=physical, Limit=1, Select="COUNT")["Count"]:
            raise ReplayError(
                f"table {physical} ({logical}) is not empty; replay only rebuilds empty tables "
                "(--table-prefix P replays into new tables P-enrollments, P-nodes, ...)"
            )
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
    return ReplayReport(events=events, writes=writes, created=created)


def replay_data_dir(data_dir: Path, *, bucket: str, tables: dict[str, str]) -> tuple[ReplayReport, str]:
    """Replay into the local stack kept in ``data_dir``: into its running emulator, or, when no
    process holds the folder, into the folder itself (saved back as its snapshot). The report,
    and where it went, in words."""
    from .emulator import Emulator
    from .persistence import SNAPSHOT_FILE, DataDirInUse, DataDirLock, Persistence, SnapshotError

    if not data_dir.is_dir():
        raise ReplayError(
            f"there is no local stack data in {data_dir}: name the folder `local up --data-dir` was given "
            f"(./scripts/dev-up uses {DEV_UP_DATA_DIR})"
        )
    lock = DataDirLock(data_dir)
    try:
        lock.acquire_existing()
    except DataDirInUse as running:
        emulator_url = running.holder.get("emulator_url")
        if not isinstance(emulator_url, str) or not _is_loopback(emulator_url):
            raise ReplayError(
                f"the local stack using {data_dir} (pid {running.pid}) is still starting: try again in a moment"
            ) from None
        report = replay(bucket=bucket, tables=tables, endpoint_url=emulator_url, region=LOCAL_REGION)
        return report, f"the running local stack (pid {running.pid}, emulator {emulator_url})"
    try:
        if not (data_dir / SNAPSHOT_FILE).exists() and not any(data_dir.glob("aws-requests.jsonl")):
            raise ReplayError(f"{data_dir} holds no saved state (no {SNAPSHOT_FILE}): is it a local up data dir?")
        lock.acquire()
        emulator = Emulator()
        emulator.start()
        try:
            persistence = Persistence(data_dir, emulator, region=LOCAL_REGION)
            try:
                persistence.restore()
            except SnapshotError as error:
                raise ReplayError(str(error)) from None
            report = replay(bucket=bucket, tables=tables, endpoint_url=emulator.endpoint_url, region=LOCAL_REGION)
            persistence.stop()  # the rebuilt tables are saved with the rest
        finally:
            emulator.stop()
    finally:
        lock.release()
    return report, f"the stopped local stack in {data_dir} (saved to its {SNAPSHOT_FILE})"


# --- the command line: `modelforge log replay` ---------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir",
        type=Path,
        metavar="D",
        help="the local stack kept in D (what `local up --data-dir D` was given): its running emulator, or, "
        "when it is stopped, D itself",
    )
    where.add_argument(
        "--local",
        action="store_true",
        help=f"the stack ./scripts/dev-up runs (--data-dir {DEV_UP_DATA_DIR})",
    )
    where.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="an AWS endpoint such as LocalStack (default $AWS_ENDPOINT_URL, else AWS with your configured "
        "region and credentials)",
    )
    bucket_var = resources.STATE_LOG_BUCKET.env_var
    default_bucket = resources.STATE_LOG_BUCKET.local_name(DEFAULT_PREFIX)
    parser.add_argument("--bucket", help=f"the state-log bucket (default ${bucket_var}, else {default_bucket})")
    parser.add_argument(
        "--table-prefix",
        metavar="P",
        help="replay into the tables P-enrollments, P-nodes, ... (created when missing; the default is each "
        f"table's variable, else {DEFAULT_PREFIX}-…)",
    )
    for table in resources.REPLAYED_TABLES:
        parser.add_argument(
            f"--{table.name.replace('_', '-')}-table",
            dest=f"{table.name}_table",
            metavar="T",
            help=f"target table for {table.name} (default: from --table-prefix, else ${table.env_var}, else "
            f"{table.local_name(DEFAULT_PREFIX)})",
        )


def target_tables(args: argparse.Namespace, env: dict[str, str] | None = None) -> dict[str, str]:
    """State-log table name -> the physical table to rebuild: its own option, else the prefix,
    else its environment variable, else the local stack's name."""
    env = dict(os.environ) if env is None else env
    tables = {}
    for table in resources.REPLAYED_TABLES:
        explicit = getattr(args, f"{table.name}_table", None)
        if explicit:
            tables[table.name] = explicit
        elif args.table_prefix:
            tables[table.name] = table.local_name(args.table_prefix)
        else:
            tables[table.name] = env.get(table.env_var) or table.local_name(DEFAULT_PREFIX)
    return tables


def run(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

    tables = target_tables(args)
    bucket_var = resources.STATE_LOG_BUCKET.env_var
    bucket = args.bucket or os.environ.get(bucket_var) or resources.STATE_LOG_BUCKET.local_name(DEFAULT_PREFIX)
    data_dir = DEV_UP_DATA_DIR if args.local else args.data_dir
    endpoint_url = args.endpoint_url or (None if data_dir else os.environ.get("AWS_ENDPOINT_URL") or None)
    try:
        if data_dir is not None:
            report, where = replay_data_dir(data_dir, bucket=bucket, tables=tables)
        else:
            report, where = replay(bucket=bucket, tables=tables, endpoint_url=endpoint_url), endpoint_url or "AWS"
    except ReplayError as error:
        print(f"modelforge: {error}", file=sys.stderr)
        return EXIT_ERROR
    except EndpointConnectionError:
        print(
            f"modelforge: cannot reach {endpoint_url}: is it running? (for the local stack, name its data dir with "
            "--data-dir D, or --local: its emulator's URL changes on every start)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except (BotoCoreError, ClientError) as error:
        print(f"modelforge: log replay failed: {error}", file=sys.stderr)
        return EXIT_ERROR
    if report.events == 0:
        print(f"replayed 0 events: the state log (s3://{bucket}/{resources.STATE_LOG_PREFIX}) is empty, in {where}")
    else:
        print(f"replayed {report.events} events ({report.writes} writes) into {', '.join(tables.values())}, in {where}")
    if report.created:
        print(f"created the empty tables {', '.join(report.created)} first")
    return EXIT_OK
