"""Canary: the moto internals tools/local_stack/modelforge_local_stack/emulator.py patches are still what it assumes.

moto is pinned exactly. Before moving the pin, run this file against the new moto; every failure
names what to re-check. The emulator's atomicity lock and its cancelled-transaction patch stand in
for two moto fidelity gaps (docs/ARCHITECTURE.md, localstack/moto_fidelity_repro.py); if moto
changed how it writes, rolls back or streams, the patch may be unneeded, or silently wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import tomllib
from pathlib import Path
from typing import Any

import pytest
from modelforge_local_stack import emulator
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
RECHECK = (
    "moto changed an internal that tools/local_stack/modelforge_local_stack/emulator.py relies on: re-check "
    "make_cancelled_transactions_leave_no_trace(), Emulator.bind() and persistence.py (snapshots read and write "
    "moto's tables, items and objects) against the new moto source, run localstack/moto_fidelity_repro.py "
    "to see whether the fidelity gaps remain, "
    "and update docs/ARCHITECTURE.md before moving the moto pin in pyproject.toml. Detail: "
)


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ImportError(dotted)


def _moto_transact_write_items() -> Any:
    """moto's own method, whether or not the emulator has already patched the class."""
    from moto.dynamodb.models import DynamoDBBackend

    method = DynamoDBBackend.transact_write_items
    return getattr(method, "__wrapped__", method) if getattr(method, "_modelforge_patched", False) else method


def test_installed_moto_is_the_pinned_one() -> None:
    pins = [
        Requirement(entry)
        for entry in tomllib.loads((REPO / "tools" / "local_stack" / "pyproject.toml").read_text())["project"][
            "dependencies"
        ]
    ]
    (moto,) = [pin for pin in pins if pin.name == "moto"]
    specifiers = list(moto.specifier)
    assert len(specifiers) == 1 and specifiers[0].operator == "==", RECHECK + f"moto must be pinned exactly, not {moto}"
    installed = importlib.metadata.version("moto")
    assert installed == specifiers[0].version, (
        f"moto {installed} is installed but pyproject.toml pins {specifiers[0].version}: run ./scripts/test to "
        "reinstall, or, if you are moving the pin, " + RECHECK
    )


@pytest.mark.parametrize("dotted", emulator.MOTO_INTERNALS)
def test_every_internal_the_emulator_uses_still_exists(dotted: str) -> None:
    try:
        _resolve(dotted)
    except (ImportError, AttributeError) as gone:
        pytest.fail(RECHECK + f"{dotted} is gone ({gone!r})")


def test_transact_write_items_keeps_its_signature_and_its_rollback_by_table_copies() -> None:
    original = _moto_transact_write_items()
    assert list(inspect.signature(original).parameters) == ["self", "transact_items"], (
        RECHECK + f"DynamoDBBackend.transact_write_items{inspect.signature(original)}"
    )
    source = inspect.getsource(original)
    # the patch skips these whole-table deep copies and undoes a cancelled transaction itself
    assert "copy.deepcopy(" in source and "self.tables[table_name] = original_table_state[table_name]" in source, (
        RECHECK + "transact_write_items no longer rolls back by swapping in deep copies of the tables"
    )


def test_the_dynamodb_models_module_uses_copy_only_where_the_patch_expects() -> None:
    """The patch swaps the module's ``copy`` for one that does not deep-copy tables; any other use
    of ``copy`` in that module would be affected too."""
    import moto.dynamodb.models as models

    source = inspect.getsource(models)
    uses = sorted(line.strip() for line in source.splitlines() if "copy." in line and not line.strip().startswith("#"))
    assert uses == ["orig_item = copy.deepcopy(item)", "original_table_state[table_name] = copy.deepcopy("], (
        RECHECK + f"moto.dynamodb.models now uses copy as: {uses}"
    )
    assert "import copy" in source.splitlines(), RECHECK + "moto.dynamodb.models no longer imports copy as a module"


def test_the_server_and_model_interfaces_the_emulator_and_its_snapshots_call() -> None:
    from moto.dynamodb.models.table import Table
    from moto.moto_server import werkzeug_app
    from moto.s3.models import S3Backend
    from werkzeug.serving import WSGIRequestHandler

    dispatcher = inspect.signature(werkzeug_app.DomainDispatcherApplication.__init__)
    assert list(dispatcher.parameters)[:2] == ["self", "create_app"], (
        RECHECK + f"DomainDispatcherApplication{dispatcher}"
    )
    assert issubclass(werkzeug_app.MotoRequestHandler, WSGIRequestHandler), RECHECK + "MotoRequestHandler's base"
    put_item = inspect.signature(Table.put_item).parameters
    assert list(put_item)[:2] == ["self", "item_attrs"] and "overwrite" in put_item, (
        RECHECK + f"Table.put_item{put_item}"
    )
    put_object = list(inspect.signature(S3Backend.put_object).parameters)
    assert put_object[:4] == ["self", "bucket_name", "key_name", "value"], RECHECK + f"S3Backend.put_object{put_object}"
    # a restore puts items with the table's stream detached, so that they stream no record
    assert "if self.stream_shard is not None:" in inspect.getsource(Table.put_item), RECHECK + "Table.put_item's stream"


def test_the_patched_emulator_leaves_no_trace_of_a_cancelled_transaction() -> None:
    """Behaviour, on the emulator itself: a cancelled transaction changes no item, streams no
    record, and a stream reader opened before it still sees later writes."""
    import boto3
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.table import StreamShard, Table

    server = emulator.Emulator(port=0)
    server.start()
    try:
        options = {
            "endpoint_url": server.endpoint_url,
            "region_name": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        dynamodb = boto3.client("dynamodb", **options)
        streams = boto3.client("dynamodbstreams", **options)
        name = "emulator-canary"
        stream_arn = dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        )["TableDescription"]["LatestStreamArn"]
        dynamodb.put_item(TableName=name, Item={"pk": {"S": "kept"}, "v": {"N": "1"}})
        shard = streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
        iterator = streams.get_shard_iterator(StreamArn=stream_arn, ShardId=shard, ShardIteratorType="LATEST")[
            "ShardIterator"
        ]

        with pytest.raises(dynamodb.exceptions.TransactionCanceledException):
            dynamodb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": name,
                            "Key": {"pk": {"S": "kept"}},
                            "UpdateExpression": "SET v = :two",
                            "ExpressionAttributeValues": {":two": {"N": "2"}},
                        }
                    },
                    {"Put": {"TableName": name, "Item": {"pk": {"S": "phantom"}}}},
                    {
                        "ConditionCheck": {
                            "TableName": name,
                            "Key": {"pk": {"S": "absent"}},
                            "ConditionExpression": "attribute_exists(pk)",
                        }
                    },
                ]
            )
        dynamodb.put_item(TableName=name, Item={"pk": {"S": "later"}})

        table = dynamodb_backends["123456789012"]["us-east-1"].tables[name]
        assert isinstance(table, Table) and isinstance(table.stream_shard, StreamShard), RECHECK + "Table.stream_shard"
        assert isinstance(table.stream_shard.items, list) and isinstance(table.items, dict), (
            RECHECK + "Table/StreamShard.items"
        )
        assert (table.hash_key_attr, table.range_key_attr) == ("pk", None), (
            RECHECK + "Table.hash_key_attr/range_key_attr"
        )

        got = dynamodb.get_item(TableName=name, Key={"pk": {"S": "kept"}}, ConsistentRead=True)["Item"]
        assert got["v"] == {"N": "1"}, RECHECK + "a cancelled transaction's update stayed"
        assert "Item" not in dynamodb.get_item(TableName=name, Key={"pk": {"S": "phantom"}}), (
            RECHECK + "a cancelled transaction's put stayed"
        )
        records = streams.get_records(ShardIterator=iterator)["Records"]
        keys = [record["dynamodb"]["Keys"]["pk"]["S"] for record in records]
        assert keys == ["later"], RECHECK + f"a stream reader opened before the cancelled transaction saw {keys}"
        dynamodb.delete_table(TableName=name)  # moto's backends are per process: leave none behind
    finally:
        server.stop()


def test_the_query_and_serializer_internals_the_fast_paths_rely_on() -> None:
    """key_index.py reads a Query's index name by position and hands moto its items through
    ``all_items()``; attribute_serializer.py replaces the JSON structure walk for one shape."""
    from moto.core.serialize import BaseJSONSerializer
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    query = inspect.unwrap(Table.query)
    assert list(inspect.signature(query).parameters)[:9] == [
        "self",
        "hash_key",
        "range_comparison",
        "range_objs",
        "limit",
        "exclusive_start_key",
        "scan_index_forward",
        "projection_expressions",
        "index_name",
    ], RECHECK + f"Table.query{inspect.signature(query)} (key_index.py reads index_name by position)"
    assert "hash_key_conditions" in inspect.signature(query).parameters, RECHECK + "Table.query's key conditions"
    assert inspect.getsource(query).count("self.all_items()") == 2, (
        RECHECK + "Table.query no longer finds its items through all_items() (key_index.py hands them there)"
    )
    update = list(inspect.signature(inspect.unwrap(DynamoDBBackend.update_item)).parameters)
    assert update[:3] == ["self", "table_name", "key"], RECHECK + f"DynamoDBBackend.update_item{update}"
    walk = list(inspect.signature(inspect.unwrap(BaseJSONSerializer._serialize_type_structure)).parameters)
    assert walk == ["self", "serialized", "value", "shape", "key"], (
        RECHECK + f"BaseJSONSerializer._serialize_type_structure{walk} (attribute_serializer.py replaces it)"
    )
