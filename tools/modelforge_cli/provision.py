"""Create the control plane's tables and bucket from infra/resources.json.

The same CloudFormation definitions are deployed to AWS and created in the local emulator,
so the local stack cannot drift from the deployed one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3

from .catalogue import REPO_ROOT, resources

RESOURCES_FILE = REPO_ROOT / "infra" / "resources.json"

#: CloudFormation logical id -> the environment variable that names it for the functions.
RESOURCE_ENV = {resource.logical_id: resource.env_var for resource in resources.ALL}
_TABLE_PROPERTIES = ("AttributeDefinitions", "KeySchema", "BillingMode", "GlobalSecondaryIndexes", "StreamSpecification")


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
