"""This function instance's settings, table bindings and clients, built on first use (one per process:
a Lambda instance, or the local stack).

It is also the control plane's one public entry point for tools that run it in their own process
(the local stack, ``bench/``): the functions at the end of this module. Everything else in
``chalicelib`` is internal and may change with any release.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modelforge_logging import jsonlog

from chalicelib.config.settings import Settings, load_settings
from chalicelib.services.known_callers import KnownCallers
from chalicelib.services.queue_fronts import QueueFronts
from chalicelib.services.work_hint import WorkHint
from chalicelib.stores.contract import Stores
from chalicelib.stores.dynamodb import dynamodb_stores
from chalicelib.stores.models import bind_tables
from chalicelib.stores.transactions import reset_connection

if TYPE_CHECKING:
    from chalicelib.services.sweep import SweepReport


@dataclass(frozen=True)
class Instance:
    """What one function instance keeps between requests: its settings, stores and caches."""

    settings: Settings
    #: where state lives: the DynamoDB stores over the tables settings name
    stores: Stores
    #: node credentials this instance has verified (a cost saving: see known_callers.py)
    known_callers: KnownCallers = field(default_factory=KnownCallers)
    #: which capabilities had queued work lately (the heartbeat's hint: see work_hint.py)
    work_hint: WorkHint = field(default_factory=WorkHint)
    #: the untried rest of this instance's last read of each queue's front (a cost saving: see
    #: queue_fronts.py)
    queue_fronts: QueueFronts = field(default_factory=QueueFronts)

    @property
    def s3(self) -> Any:
        return _s3_client()


@functools.lru_cache(maxsize=1)
def _s3_client() -> Any:
    """The S3 client, made when first needed (not at cold start: the state-log function and the
    work routes use it)."""
    import boto3
    from botocore.config import Config

    # Signature Version 4: presigned work URLs must be accepted by buckets that refuse SigV2 (every
    # bucket created since 2020), and botocore would otherwise presign SigV2 in us-east-1
    return boto3.client("s3", config=Config(signature_version="s3v4"))


_instance: Instance | None = None
_lock = threading.Lock()


def get() -> Instance:
    global _instance
    with _lock:
        if _instance is None:
            jsonlog.configure(os.environ.get("MODELFORGE_LOG_LEVEL", "INFO").upper())
            settings = load_settings()
            bind_tables(settings)
            stores = dynamodb_stores(
                settings.outbox_retention_seconds,
                settings.sweep_bucket_seconds,
                _s3_client,
                settings.state_log_bucket,
                settings.channel_management_url,
            )
            _instance = Instance(settings=settings, stores=stores)
        return _instance


def reset() -> None:
    """Forget settings and clients (tests, and the local stack after changing the environment)."""
    global _instance
    with _lock:
        _instance = None
        reset_connection()
        _s3_client.cache_clear()


# --- the public entry point for tools running the control plane in their process ----------------


def settings() -> Settings:
    """This process's settings (read from the environment on first use; ``reset`` reads them again)."""
    return get().settings


def stores() -> Stores:
    """The stores (``stores/contract.py``) over this process's tables and bucket."""
    return get().stores


def work_status(work_id: str) -> str | None:
    """The work item's status, None when there is no such item."""
    item = get().stores.work.get(work_id)
    return None if item is None else item.status


def run_sweep(now: float, with_settings: Settings | None = None) -> SweepReport:
    """One liveness sweep at ``now``, as the scheduled function runs it (with other settings if
    given, e.g. another mass-outage fraction)."""
    from chalicelib.services import sweep

    return sweep.run(get().stores, with_settings or get().settings, now)


def repair_online_counter(now: float) -> int:
    """Count the online nodes and set the online-node counter to it (guarded and logged, as the
    sweep's repair); the count. For nodes written straight into the table."""
    from chalicelib.services import sweep

    return sweep.repair_online_counter(get().stores, now)


def online_node_item(
    node_id: str, last_heartbeat_at: float, created_at: float, bucket_seconds: int | None = None
) -> dict[str, Any]:
    """The wire item (DynamoDB JSON) of an enrolled node that is online and last heartbeated at
    ``last_heartbeat_at``, with the sweep's index keys its transition to online wrote (online since
    ``created_at``, in a bucket ``bucket_seconds`` wide, by default as settings say): for seeding a
    large fleet straight into the nodes table."""
    from chalicelib.stores import node_store

    width = bucket_seconds or get().settings.sweep_bucket_seconds
    return node_store.online_node_item(node_id, last_heartbeat_at, created_at, width)


def sweep_index_partition(liveness: str, node_id: str) -> str | None:
    """The sweep index partition (``liveness_shard``) a node in ``liveness`` is stored under."""
    from chalicelib.stores import node_store

    return node_store.index_partition(liveness, node_id)


#: The modules the heartbeat route imports on its first call (a unit test keeps this equal to app.py).
HEARTBEAT_ROUTE_IMPORTS = (
    "chalicelib.api.agent_answer",
    "chalicelib.api.channel_edge",
    "chalicelib.domain.requests",
    "chalicelib.services.nodes",
)


def load_heartbeat_path() -> None:
    """Load what the first heartbeat of a function instance loads (its request schema, the table
    models and a DynamoDB connection), without a request or any network call: for cold-start
    measurement."""
    import importlib

    from chalicelib.domain import validation
    from chalicelib.stores import transactions  # the table models come with it

    for name in HEARTBEAT_ROUTE_IMPORTS:  # what app.heartbeat imports on its first call
        importlib.import_module(name)
    validation._validator("HEARTBEAT")
    transactions.connection()
