"""Create the control plane's tables and bucket from infra/resources.json.

The same CloudFormation definitions are deployed to AWS and created in the local emulator,
so the local stack cannot drift from the deployed one.

``python -m modelforge_local_stack.provision --endpoint-url URL`` does the same against any AWS endpoint
(LocalStack's init hook, localstack/init/ready.d/, runs it). It needs only boto3 and this
package's catalogue (no other part of the project), so it runs in LocalStack's own Python.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import boto3

from .catalogue import REPO_ROOT, resources

RESOURCES_FILE = REPO_ROOT / "infra" / "resources.json"

#: CloudFormation logical id -> the environment variable that names it for the functions.
RESOURCE_ENV = {resource.logical_id: resource.env_var for resource in resources.ALL}
_TABLE_PROPERTIES = (
    "AttributeDefinitions",
    "KeySchema",
    "BillingMode",
    "GlobalSecondaryIndexes",
    "StreamSpecification",
)


def load_resources(path: Path = RESOURCES_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())["Resources"]


def resource_names(prefix: str) -> dict[str, str]:
    """Physical names for a local stack: '<prefix>-enrollments', ... (env var -> name)."""
    return resources.local_names(prefix)


def create_table_request(properties: dict[str, Any], table_name: str) -> dict[str, Any]:
    request = {key: properties[key] for key in _TABLE_PROPERTIES if key in properties}
    if "StreamSpecification" in request:
        request["StreamSpecification"] = {"StreamEnabled": True, **request["StreamSpecification"]}
    return {"TableName": table_name, **request}


def provision(endpoint_url: str, names: dict[str, str], region: str = "us-east-1") -> None:
    """Create every table and bucket that does not exist yet (idempotent)."""
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region)
    s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    existing_tables = set(dynamodb.list_tables()["TableNames"])
    existing_buckets = {bucket["Name"] for bucket in s3.list_buckets().get("Buckets", [])}
    for logical_id, resource in load_resources().items():
        name = names[RESOURCE_ENV[logical_id]]
        properties = resource["Properties"]
        if resource["Type"] == "AWS::DynamoDB::Table" and name not in existing_tables:
            dynamodb.create_table(**create_table_request(properties, name))
            ttl = properties.get("TimeToLiveSpecification")
            if ttl:
                dynamodb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)
        elif resource["Type"] == "AWS::S3::Bucket" and name not in existing_buckets:
            s3.create_bucket(Bucket=name)
            if properties.get("VersioningConfiguration"):
                s3.put_bucket_versioning(Bucket=name, VersioningConfiguration=properties["VersioningConfiguration"])


#: The prefix `modelforge local up` names its resources with (``modelforge-nodes``, ...).
DEFAULT_PREFIX = "modelforge"
#: A prefix that makes valid table and bucket names (buckets: lower case, at most 63 characters).
_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,39}$")


def wait_until_active(endpoint_url: str, names: dict[str, str], region: str = "us-east-1") -> list[str]:
    """Wait for every table of the catalogue to be ACTIVE; one line describing each resource."""
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint_url, region_name=region)
    s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    lines = []
    for logical_id, resource in load_resources().items():
        name = names[RESOURCE_ENV[logical_id]]
        if resource["Type"] == "AWS::DynamoDB::Table":
            dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
            table = dynamodb.describe_table(TableName=name)["Table"]
            indexes = [index["IndexName"] for index in table.get("GlobalSecondaryIndexes", [])]
            stream = table.get("StreamSpecification", {}).get("StreamViewType")
            lines.append(
                f"table {name}: {table['TableStatus']}"
                + (f", indexes {', '.join(indexes)}" if indexes else "")
                + (f", stream {stream}" if stream else "")
            )
        else:
            s3.head_bucket(Bucket=name)
            lines.append(f"bucket {name}: present")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelforge_local_stack.provision",
        description="Create the control plane's tables, outbox stream and state-log bucket from infra/resources.json "
        "in an AWS endpoint (e.g. LocalStack); resources that exist are left as they are.",
    )
    parser.add_argument("--endpoint-url", required=True, help="the AWS endpoint, e.g. http://localhost:4566")
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"names are PREFIX-nodes, PREFIX-state-log, ... (default {DEFAULT_PREFIX}, as local up)",
    )
    parser.add_argument("--region", default="us-east-1", help="the region (default us-east-1)")
    args = parser.parse_args(argv)
    if not _PREFIX_RE.fullmatch(args.prefix):
        parser.error("--prefix must be 2-40 lower-case letters, digits or '-', starting with a letter or digit")
    names = resource_names(args.prefix)
    provision(args.endpoint_url, names, args.region)
    for line in wait_until_active(args.endpoint_url, names, args.region):
        print(f"modelforge provision: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
