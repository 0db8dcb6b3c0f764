"""This function instance's settings, table bindings and clients, built on first use (one per process:
a Lambda instance, or the local stack)."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from modelforge_logging import jsonlog

from chalicelib.config.settings import Settings, load_settings
from chalicelib.services.known_callers import KnownCallers
from chalicelib.services.work_hint import WorkHint
from chalicelib.stores.contract import Stores
from chalicelib.stores.dynamodb import dynamodb_stores
from chalicelib.stores.models import bind_tables
from chalicelib.stores.transactions import reset_connection


@dataclass(frozen=True)
class Instance:
    settings: Settings
    #: where state lives: the DynamoDB stores over the tables settings name
    stores: Stores
    #: node credentials this instance has verified (a cost saving: see known_callers.py)
    known_callers: KnownCallers = field(default_factory=KnownCallers)
    #: which capabilities had queued work lately (the heartbeat's hint: see work_hint.py)
    work_hint: WorkHint = field(default_factory=WorkHint)

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
                settings.outbox_retention_seconds, settings.sweep_bucket_seconds, _s3_client, settings.state_log_bucket
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
