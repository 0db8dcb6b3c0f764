"""What the DynamoDB stores write for each domain-level write: the record changes every store shares
(``stores/changes.py``) plus the index keys, shards and partitions only the DynamoDB stores derive.

The attribute sets below are the ones the services wrote before the store contract spoke the
domain; the state log records exactly these changes, so ``modelforge log replay`` rebuilds the
same tables (tests/integration/test_state_log.py proves replay equality on the wire)."""

from __future__ import annotations

import collections

import pytest
from chalicelib.domain.records import Heartbeat, Inventory, WorkItem
from chalicelib.stores import changes, node_store, work_store
from chalicelib.stores.work_store import with_index_keys

NOW = 1_000_000.0
NODE = "node_" + "0" * 24 + "0000000b"


def _item(status: str = "leased", **fields: object) -> WorkItem:
    values: dict[str, object] = {
        "work_id": "work_" + "1" * 32,
        "capability": "echo",
        "status": status,
        "created_at": NOW - 100,
        "updated_at": NOW - 50,
        "attempts": 1,
        "max_attempts": 3,
        "lease_seconds": 300,
        "epoch": 1,
        "input_key": "work-inputs/x.json",
        "input_sha256": "a" * 64,
        "input_size": 10,
        "node_id": NODE if status == "leased" else None,
        "lease_expires_at": NOW + 10 if status == "leased" else None,
        "queued_at": NOW - 100 if status == "queued" else None,
    }
    values.update(fields)
    return WorkItem(**values)  # type: ignore[arg-type]


def test_work_lease_sets_the_lease_indexes_and_leaves_the_queue_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work_store.random, "randrange", lambda n: 0)  # lease shard 0: "leased"
    queued = _item("queued", epoch=0, attempts=0)
    assert with_index_keys(queued, changes.leased(queued, NODE, NOW + 300.00049, NOW)) == {
        "status": "leased",
        "epoch": 1,
        "attempts": 1,
        "node_id": NODE,
        "lease_holder": NODE,
        "lease_partition": "leased",
        "lease_expires_at": NOW + 300.0,
        "queue_key": None,
        "queued_at": None,
        "updated_at": NOW,
    }


def test_work_renewal_touches_no_index_key() -> None:
    assert with_index_keys(_item(), changes.renewed(NOW + 300, NOW)) == {
        "lease_expires_at": NOW + 300,
        "updated_at": NOW,
    }


def test_work_completion_leaves_the_lease_indexes_only() -> None:
    result = {"sha256": "b" * 64, "size": 3, "key": "k"}
    assert with_index_keys(_item(), changes.completed(result, NOW)) == {
        "status": "succeeded",
        "result": result,
        "lease_partition": None,
        "lease_holder": None,
        "lease_expires_at": None,
        "finished_at": NOW,
        "updated_at": NOW,
    }


def test_work_requeue_moves_from_the_lease_indexes_to_the_queue_with_the_error_appended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(work_store.random, "randrange", lambda n: 0)  # shard 0: the bare capability
    item = _item(errors=[{"attempt": 0}])
    assert with_index_keys(item, changes.failed(item, {"attempt": 1}, True, NOW)) == {
        "errors": [{"attempt": 0}, {"attempt": 1}],
        "lease_partition": None,
        "lease_holder": None,
        "lease_expires_at": None,
        "updated_at": NOW,
        "status": "queued",
        "queue_key": "echo",
        "queued_at": NOW,
    }


def test_work_that_dies_leaves_the_lease_indexes_and_is_finished() -> None:
    assert with_index_keys(_item(), changes.failed(_item(), {"attempt": 1}, False, NOW)) == {
        "errors": [{"attempt": 1}],
        "lease_partition": None,
        "lease_holder": None,
        "lease_expires_at": None,
        "updated_at": NOW,
        "status": "dead",
        "finished_at": NOW,
    }


@pytest.mark.parametrize("status", ["queued", "leased"])
def test_work_cancel_leaves_every_index_whatever_its_state(status: str) -> None:
    assert with_index_keys(_item(status), changes.cancelled(NOW)) == {
        "status": "cancelled",
        "queue_key": None,
        "queued_at": None,
        "lease_partition": None,
        "lease_holder": None,
        "lease_expires_at": None,
        "finished_at": NOW,
        "updated_at": NOW,
    }


def test_node_index_partition_is_per_state_and_shard_and_never_while_pending() -> None:
    assert node_store.index_partition("online", NODE) == f"online#{0xB % node_store.SHARDS}"
    assert node_store.index_partition("stale", NODE) == f"stale#{0xB % node_store.SHARDS}"
    # offline nodes too: what the sweep's node retention reads
    assert node_store.index_partition("offline", NODE) == f"offline#{0xB % node_store.SHARDS}"
    assert node_store.index_partition("pending", NODE) is None


def test_node_heartbeat_bucket_starts_at_or_before_the_heartbeat() -> None:
    assert node_store.bucket(90.0, 45) == 90 and node_store.bucket(134.999, 45) == 90
    assert node_store.bucket(89.999, 45) == 45


def test_node_heartbeat_changes_what_it_reports_and_brings_nothing_else() -> None:
    beat = Heartbeat(health={"status": "ok"}, telemetry=[[0.0]], agent_version="1.3.0", protocol_version=1)
    assert changes.heartbeat(beat, NOW + 0.0004) == {
        "last_heartbeat_at": NOW,
        "liveness": "online",
        "health": {"status": "ok"},
        "telemetry": [[0.0]],
        "agent_version": "1.3.0",
        "protocol_version": 1,
    }


@pytest.mark.parametrize(
    ("source", "target", "delta"),
    [("online", "stale", -1), ("stale", "offline", 0), ("stale", "online", 1), ("pending", "online", 1)],
)
def test_online_counter_moves_only_into_or_out_of_online(source: str, target: str, delta: int) -> None:
    assert changes.online_delta(source, target) == delta


def test_inventory_replacement_writes_everything_but_the_claims() -> None:
    inventory = Inventory(
        NODE, {"gpus": []}, NOW, revision="r2", claimed_uuids={"GPU-a"}, rate_window_start=NOW, rate_window_count=2
    )
    assert changes.inventory_replaced(inventory) == {
        "inventory": {"gpus": []},
        "updated_at": NOW,
        "revision": "r2",
        "rate_window_start": NOW,
        "rate_window_count": 2,
    }


def test_a_seeded_online_node_item_carries_the_index_keys_of_its_transition_to_online() -> None:
    from chalicelib import instance

    item = instance.online_node_item(NODE, 1000.5, 900.0, bucket_seconds=45)
    assert item["liveness"] == {"S": "online"} and item["last_heartbeat_at"] == {"N": "1000.5"}
    assert item["liveness_shard"] == {"S": instance.sweep_index_partition("online", NODE)}
    # online since it was created: steady heartbeats since then left the entry in that bucket
    assert item["heartbeat_bucket"] == {"N": "900"}
    # a heartbeat older than the creation time (a test's clock in the past) bounds it instead
    assert instance.online_node_item(NODE, 800.5, 900.0, bucket_seconds=45)["heartbeat_bucket"] == {"N": "765"}
    assert instance.sweep_index_partition("pending", NODE) is None


def test_work_queue_key_shard_zero_is_the_capability_and_the_others_are_numbered() -> None:
    """Items queued before sharding (queue_key = the capability) sit in shard 0 and are still read."""
    assert work_store.queue_key("echo", 0) == "echo"
    assert work_store.queue_key("echo", 7) == "echo#7"
    assert len({work_store.queue_key("echo", n) for n in range(work_store.QUEUE_SHARDS)}) == work_store.QUEUE_SHARDS


def test_work_requeue_goes_to_a_random_queue_shard() -> None:
    item = _item()
    keys = {with_index_keys(item, changes.failed(item, {"attempt": 1}, True, NOW))["queue_key"] for _ in range(400)}
    assert keys == {work_store.queue_key("echo", n) for n in range(work_store.QUEUE_SHARDS)}


def test_shards_seen_holding_items_are_not_preferred_to_unknown_ones() -> None:
    """Claimers of one instance share the memory: preferring the shards first seen busy would herd
    them all onto those (and their transactions onto the same items)."""
    memory = work_store.EmptyShards(seconds=5, clock=lambda: 0.0)
    memory.saw("echo", 9, empty=False)
    memory.saw("echo", 2, empty=True)
    firsts = collections.Counter(memory.order("echo")[0] for _ in range(3000))
    assert set(firsts) == set(range(work_store.QUEUE_SHARDS)) - {2}
    assert max(firsts.values()) < 3 * min(firsts.values())  # spread alike (about 200 each)
    assert memory.order("echo")[-1] == 2


def test_empty_shards_are_read_last_but_always_read() -> None:
    clock = [0.0]
    memory = work_store.EmptyShards(seconds=5, clock=lambda: clock[0])
    for shard in (3, 5):
        memory.saw("echo", shard, empty=True)
    order = memory.order("echo")
    assert sorted(order) == list(range(work_store.QUEUE_SHARDS))
    assert set(order[-2:]) == {3, 5}
    memory.saw("echo", 3, empty=False)  # it held items again: no longer read last
    assert all(memory.order("echo")[-1] == 5 for _ in range(50))
    assert any(memory.order("echo")[0] == 3 for _ in range(200))
    clock[0] = 6.0  # forgotten after the memory's seconds
    assert any(memory.order("echo")[0] == 5 for _ in range(200))


def _reading_store(holding: set[int], monkeypatch: pytest.MonkeyPatch) -> tuple[work_store.DynamoWorkStore, list]:
    """A DynamoDB work store whose shard reads are recorded (shard, thread) and answer an item only
    for the shards in ``holding``."""
    import threading

    store = work_store.DynamoWorkStore(retention_seconds=60)
    reads: list[tuple[int, str]] = []
    guard = threading.Lock()

    def shard_front(capability: str, shard: int, limit: int) -> list:
        with guard:
            reads.append((shard, threading.current_thread().name))
        return [f"item-of-{shard}"] if shard in holding else []

    monkeypatch.setattr(store, "_shard_front", shard_front)
    return store, reads


def test_an_empty_queue_is_read_once_per_shard_one_then_the_rest_a_few_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, reads = _reading_store(set(), monkeypatch)
    assert store._first_shard_front("echo", 10) == []
    shards = [shard for shard, _ in reads]
    assert sorted(shards) == list(range(work_store.QUEUE_SHARDS))  # every shard, once
    assert not reads[0][1].startswith("queue-shard")  # the first read is the caller's own
    assert all(thread.startswith("queue-shard") for _, thread in reads[1:])


def test_reading_stops_at_the_wave_that_found_items(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(20):
        holding = {7}
        store, reads = _reading_store(holding, monkeypatch)
        assert store._first_shard_front("echo", 10) == ["item-of-7"]
        shards = [shard for shard, _ in reads]
        if shards[0] == 7:
            assert shards == [7]  # found by the first read: nothing more is read
            continue
        # the first read alone, then whole waves (the last may be short), and none after shard 7's
        rest = len(shards) - 1
        assert rest % work_store.SHARD_READERS == 0 or len(shards) == work_store.QUEUE_SHARDS
        last_wave = shards[1 + (rest - 1) // work_store.SHARD_READERS * work_store.SHARD_READERS :]
        assert 7 in last_wave and 7 not in shards[: len(shards) - len(last_wave)]


def test_work_lease_goes_to_a_random_lease_shard() -> None:
    queued = _item("queued", epoch=0, attempts=0)
    keys = {with_index_keys(queued, changes.leased(queued, NODE, NOW, NOW))["lease_partition"] for _ in range(400)}
    assert keys == {work_store.lease_partition(n) for n in range(work_store.LEASE_SHARDS)}
    assert work_store.lease_partition(0) == "leased"  # leases written before sharding are still swept


def test_a_logged_change_names_attributes_as_the_table_stores_them() -> None:
    """Replay writes a change back as logged: an attribute stored under a short name (the node
    item's ``gb``) must be logged under it, or the rebuilt table differs from the live one."""
    from chalicelib.stores.models import NodeModel
    from chalicelib.stores.state_log import update_change

    change = update_change(NodeModel, "node_1", {"gpu_blocks": 3, "parked_at": None, "liveness": "online"})
    assert change["set"] == {"gb": {"N": "3"}, "liveness": {"S": "online"}}
    assert change["remove"] == ["pk"]
