"""This function instance's settings, table bindings and clients, built on first use (one per process:
a Lambda instance, or the local stack)."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any


from modelforge_logging import jsonlog
from .dynamodb_stores import dynamodb_stores
from .known_callers import KnownCallers
from .models import bind_tables
from .settings import Settings, load_settings
from .stores import Stores
from .transactions import reset_connection


@dataclass(frozen=True)
class Instance:
    settings: Settings
    #: where state lives: the DynamoDB stores over the tables settings name
    stores: Stores
    #: node credentials this instance has verified (a cost saving: see known_callers.py)
    known_callers: KnownCallers = field(default_factory=KnownCallers)

    @functools.cached_property
    def s3(self) -> Any:
        """The S3 client, made when first needed (only the state-log function writes to S3)."""
        import boto3

        return boto3.client("s3")


_instance: Instance | None = None
_lock = threading.Lock()


def get() -> Instance:
    global _instance
    with _lock:
        if _instance is None:
            jsonlog.configure(os.environ.get("MODELFORGE_LOG_LEVEL", "INFO").upper())
            settings = load_settings()
            bind_tables(settings)
            _instance = Instance(settings=settings, stores=dynamodb_stores(settings.outbox_retention_seconds))
        return _instance


def reset() -> None:
    """Forget settings and clients (tests, and the local stack after changing the environment)."""
    global _instance
    with _lock:
        _instance = None
        reset_connection()
