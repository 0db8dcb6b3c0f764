"""LocalStack's init hook (localstack/init/ready.d/) creates every resource of the catalogue, and
localstack/docker-compose.yml mounts what it needs.

LocalStack itself cannot run here (its DynamoDB downloads a JDK, its Lambda needs Docker), so the
hook runs exactly as LocalStack runs a ``.py`` ready hook, ``exec(code, {})`` in a Python that has
boto3, with its endpoint pointed at the embedded emulator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from modelforge_local_stack import provision
from modelforge_local_stack.emulator import Emulator

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "localstack" / "docker-compose.yml"
HOOK = REPO / "localstack" / "init" / "ready.d" / "modelforge-resources.py"
MOUNTED_REPO = "/opt/modelforge"
#: How LocalStack's PythonScriptRunner runs a .py init script (localstack/runtime/init.py).
AS_LOCALSTACK_RUNS_IT = "import sys\nwith open(sys.argv[1], 'rb') as fd:\n    exec(fd.read(), {})\n"
OPTIONS = {"region_name": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}


@pytest.fixture()
def emulator() -> Iterator[Emulator]:
    running = Emulator(port=0)
    running.start()
    yield running
    running.stop()


def run_hook(endpoint_url: str) -> subprocess.CompletedProcess[str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "MODELFORGE_")) and key != "PYTHONPATH"
    }
    environment |= {
        "MODELFORGE_LOCALSTACK_REPO": str(REPO),
        "MODELFORGE_LOCALSTACK_ENDPOINT_URL": endpoint_url,
        "NO_PROXY": "127.0.0.1",
    }
    return subprocess.run(
        [sys.executable, "-c", AS_LOCALSTACK_RUNS_IT, str(HOOK)],
        cwd="/",  # LocalStack's working directory is its own
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _keys(schema: list[dict[str, str]]) -> list[tuple[str, str]]:
    return sorted((part["AttributeName"], part["KeyType"]) for part in schema)


def assert_catalogue_provisioned(endpoint_url: str) -> None:
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint_url, **OPTIONS)
    s3 = boto3.client("s3", endpoint_url=endpoint_url, **OPTIONS)
    names = provision.resource_names(provision.DEFAULT_PREFIX)
    for logical_id, resource in provision.load_resources().items():
        name, wanted = names[provision.RESOURCE_ENV[logical_id]], resource["Properties"]
        if resource["Type"] == "AWS::S3::Bucket":
            s3.head_bucket(Bucket=name)
            assert s3.get_bucket_versioning(Bucket=name).get("Status") == wanted["VersioningConfiguration"]["Status"]
            continue
        table = dynamodb.describe_table(TableName=name)["Table"]
        assert table["TableStatus"] == "ACTIVE", name
        assert _keys(table["KeySchema"]) == _keys(wanted["KeySchema"]), name
        assert sorted(map(tuple, (d.values() for d in table["AttributeDefinitions"]))) == sorted(
            map(tuple, (d.values() for d in wanted["AttributeDefinitions"]))
        ), name
        assert table["BillingModeSummary"]["BillingMode"] == wanted["BillingMode"], name
        indexes = {index["IndexName"]: index for index in table.get("GlobalSecondaryIndexes", [])}
        assert set(indexes) == {index["IndexName"] for index in wanted.get("GlobalSecondaryIndexes", [])}, name
        for index in wanted.get("GlobalSecondaryIndexes", []):
            made = indexes[index["IndexName"]]
            assert _keys(made["KeySchema"]) == _keys(index["KeySchema"]), (name, index["IndexName"])
            assert made["Projection"]["ProjectionType"] == index["Projection"]["ProjectionType"], (
                name,
                index["IndexName"],
            )
        stream: dict[str, Any] = table.get("StreamSpecification", {})
        if "StreamSpecification" in wanted:
            assert (
                stream.get("StreamEnabled") is True
                and stream["StreamViewType"] == wanted["StreamSpecification"]["StreamViewType"]
            )
            assert table.get("LatestStreamArn"), name
        else:
            assert not stream.get("StreamEnabled"), name
        ttl = dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        if "TimeToLiveSpecification" in wanted:
            assert (
                ttl["TimeToLiveStatus"] == "ENABLED"
                and ttl["AttributeName"] == wanted["TimeToLiveSpecification"]["AttributeName"]
            )


def test_the_init_hook_creates_every_catalogue_resource_and_a_second_run_changes_nothing(emulator: Emulator) -> None:
    first = run_hook(emulator.endpoint_url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert_catalogue_provisioned(emulator.endpoint_url)
    assert "table modelforge-outbox: ACTIVE, stream NEW_IMAGE" in first.stdout
    dynamodb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, **OPTIONS)
    tables = sorted(dynamodb.list_tables()["TableNames"])
    dynamodb.put_item(TableName="modelforge-control", Item={"name": {"S": "kept"}})

    again = run_hook(emulator.endpoint_url)  # a LocalStack restart runs the hook again

    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(dynamodb.list_tables()["TableNames"]) == tables
    assert dynamodb.get_item(TableName="modelforge-control", Key={"name": {"S": "kept"}}).get("Item")
    assert_catalogue_provisioned(emulator.endpoint_url)


def test_the_init_hook_fails_loudly_when_the_endpoint_does_not_answer() -> None:
    failed = run_hook("http://127.0.0.1:9")  # the discard port: nothing listens
    assert failed.returncode != 0
    assert "CalledProcessError" in failed.stderr


def _compose_config(env: dict[str, str]) -> dict[str, Any]:
    compose = shutil.which("docker-compose")
    # a failure, not a skip: scripts/test installs it (scripts/_system_packages.sh), and a skip would
    # hide a missing install in CI
    assert compose is not None, (
        "docker-compose (Debian package docker-compose) is not installed: run ./scripts/test as root (it installs "
        "it), or: sudo apt-get install -y --no-install-recommends docker-compose"
    )
    base = {key: value for key, value in os.environ.items() if not key.startswith("LOCALSTACK_")}
    ran = subprocess.run(
        [compose, "-f", str(COMPOSE_FILE), "config"], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    config: dict[str, Any] = yaml.safe_load(ran.stdout)
    return config


@pytest.mark.parametrize("token", [None, "ls-example-token"])
def test_the_compose_file_resolves_pins_its_image_and_mounts_the_hook_and_the_catalogue(token: str | None) -> None:
    config = _compose_config({"LOCALSTACK_AUTH_TOKEN": token} if token else {})
    service = config["services"]["localstack"]
    image = service["image"]
    name, _, digest = image.partition("@sha256:")
    assert len(digest) == 64 and all(c in "0123456789abcdef" for c in digest), image
    assert ":" in name and not name.endswith(":latest"), image
    assert service["environment"]["LOCALSTACK_AUTH_TOKEN"] == (token or "")
    assert {"dynamodb", "dynamodbstreams", "s3"} <= set(service["environment"]["SERVICES"].split(","))
    assert service["ports"] == ["127.0.0.1:4566:4566/tcp"]
    mounts = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        mounts[target] = (source, mode)
    binds = {target: source for target, (source, mode) in mounts.items() if source.startswith("/")}
    assert binds == {
        f"/etc/localstack/init/ready.d/{HOOK.name}": str(HOOK),
        f"{MOUNTED_REPO}/infra/resources.json": str(REPO / "infra" / "resources.json"),
        f"{MOUNTED_REPO}/tools/local_stack/modelforge_local_stack": str(
            REPO / "tools" / "local_stack" / "modelforge_local_stack"
        ),
        f"{MOUNTED_REPO}/functions/chalicelib": str(REPO / "functions" / "chalicelib"),
    }
    for target, source in binds.items():
        assert Path(source).exists(), source
        assert mounts[target][1] == ["ro"], target
    # the hook looks where the compose file mounts, and at LocalStack's own port
    text = HOOK.read_text()
    assert f'"{MOUNTED_REPO}"' in text and '"http://localhost:4566"' in text


def test_provision_refuses_a_prefix_that_makes_invalid_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        provision.main(["--endpoint-url", "http://127.0.0.1:9", "--prefix", "Bad_Prefix"])
    assert exited.value.code == 2
    assert "--prefix" in capsys.readouterr().err
