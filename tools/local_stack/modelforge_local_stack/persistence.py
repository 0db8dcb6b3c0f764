"""`local up --data-dir D`: the emulator's state kept across restarts, in a size that follows the
state, not the uptime.

What the folder holds:

- ``local-up.lock``: locked (``flock``) by the one process that uses the folder, which writes its
  pid and URLs there. A second process is refused before it changes anything, naming the file and
  the pid; the lock goes with its process, so a crash leaves nothing to clean up.
- ``snapshot.json``: every table (its definition and items) and bucket (versioning, and the latest
  version of each object: key, metadata, SHA-256 of the body) of the emulator, taken in one piece
  while no request runs, and written whole (temporary file, fsync, rename). It is taken on stop and
  every ``interval`` seconds while anything changed, so a crash loses at most that much.
- ``objects/<sha256>``: the object bodies, by content, so an unchanged object is written once; a
  body that no snapshot names any more is removed after the next snapshot.

A restore creates each table and bucket through the API (streams are new), then puts items and
objects straight into moto's models, without stream records: nothing is delivered twice. The one
exception is the outbox (``Outbox``): an outbox item whose state-log object is not in the restored
bucket was not shipped yet, so it gets its INSERT stream record again and the stream poller ships
it. Nothing is re-shipped, nothing is lost.

Data dirs written by earlier versions hold moto's request recording (``aws-requests.jsonl``,
every request, growing with uptime). It is migrated once: the requests that change state are
replayed (stream reads and other reads are left out), a snapshot is taken, and the recording is
removed.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelforge_cli.tables import counted
from modelforge_protocol import files

from .emulator import POLLER_USER_AGENT, READ_OPERATIONS, Emulator
from .periodic import Periodic

log = logging.getLogger("modelforge.local.persistence")

LOCK_FILE = "local-up.lock"
SNAPSHOT_FILE = "snapshot.json"
OBJECTS_DIR = "objects"
LEGACY_RECORDING = "aws-requests.jsonl"
SNAPSHOT_FORMAT = 1
REGION = "us-east-1"
#: How often a running stack writes a snapshot when anything changed (seconds).
DEFAULT_SNAPSHOT_INTERVAL_SECONDS = 10.0


class DataDirInUse(Exception):
    """Another process holds the data dir's lock."""

    def __init__(self, data_dir: Path, lock_path: Path, holder: dict[str, Any]) -> None:
        self.data_dir, self.lock_path, self.holder = data_dir, lock_path, holder
        self.pid = holder.get("pid")
        who = f"pid {self.pid}" if self.pid else "a process whose pid it has not written yet"
        super().__init__(
            f"the data dir {data_dir} is in use by another modelforge local up ({who}; lock file {lock_path}): "
            "stop that one first, or choose another --data-dir"
        )


class SnapshotError(Exception):
    """The data dir's snapshot cannot be read or written; the message says what to do."""


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


class DataDirLock:
    """The data dir's lock file, held with ``flock`` for as long as this process uses the folder."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        self._described = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire_existing(self) -> None:
        """Lock the folder when its lock file exists already, changing nothing; ``DataDirInUse``
        when another process holds it. (A folder without one is locked by ``acquire``.)"""
        if self._fd is None and self.path.is_file():
            self._lock(os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW))

    def acquire(self, **details: Any) -> None:
        """Create the folder (0700) and its lock file as needed, lock it, and write our pid. A
        folder that other users can enter is refused: it holds the control plane's state."""
        if self._fd is None:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            mode = self.data_dir.stat().st_mode & 0o777
            if mode & 0o077:
                raise SnapshotError(
                    f"the data dir {self.data_dir} is open to other users (mode {mode:04o}) and holds the control "
                    f"plane's state: run chmod 700 {self.data_dir}"
                )
            self._lock(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
        self.describe(**details)

    def _lock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(self.data_dir, self.path, _read_holder(self.path)) from None
            raise
        self._fd = fd

    def describe(self, **details: Any) -> None:
        """Write our pid and ``details`` (the URLs we serve) into the lock file."""
        assert self._fd is not None
        text = json.dumps({"pid": os.getpid(), **details}, sort_keys=True) + "\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)
        self._described = True

    def release(self) -> None:
        if self._fd is not None:
            if self._described:  # what we wrote: a lock file left behind names nobody
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd, self._described = None, False


@dataclass(frozen=True)
class Outbox:
    """A stream-enabled table whose items are each shipped as one object (the state log): an item
    is unshipped while ``object_key(item)`` is missing from ``bucket``."""

    table: str
    bucket: str
    object_key: Callable[[dict[str, Any]], str | None]


@dataclass
class Restored:
    """What a start found in the data dir."""

    tables: int = 0
    items: int = 0
    objects: int = 0
    #: outbox items not shipped before the snapshot: their stream records were written again
    unshipped: int = 0
    #: requests replayed from a recording of an earlier version (then removed)
    migrated_requests: int = 0
    taken_at: float | None = None

    def describe(self, data_dir: Path) -> str:
        if self.migrated_requests:
            return (
                f"migrated {counted(self.migrated_requests, 'recorded request')} from "
                f"{data_dir / LEGACY_RECORDING} into {data_dir / SNAPSHOT_FILE} (the recording was removed)"
            )
        age = f", taken {max(0, round(time.time() - self.taken_at))} s ago" if self.taken_at else ""
        return (
            f"restored {counted(self.tables, 'table')} ({counted(self.items, 'item')}) and "
            f"{counted(self.objects, 'object')} from {data_dir / SNAPSHOT_FILE}{age}; "
            f"{counted(self.unshipped, 'state-log event')} still to ship"
        )


def _create_request(description: dict[str, Any]) -> dict[str, Any]:
    """A CreateTable request that makes a table like ``description`` (DescribeTable's shape)."""
    billing = description.get("BillingModeSummary", {}).get("BillingMode", "PAY_PER_REQUEST")
    request: dict[str, Any] = {
        "TableName": description["TableName"],
        "AttributeDefinitions": description["AttributeDefinitions"],
        "KeySchema": description["KeySchema"],
        "BillingMode": billing,
    }
    throughput = description.get("ProvisionedThroughput", {})
    if billing == "PROVISIONED":
        request["ProvisionedThroughput"] = {
            "ReadCapacityUnits": throughput.get("ReadCapacityUnits") or 1,
            "WriteCapacityUnits": throughput.get("WriteCapacityUnits") or 1,
        }
    for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
        indexes = [
            {key: index[key] for key in ("IndexName", "KeySchema", "Projection") if key in index}
            for index in description.get(kind) or []
        ]
        if kind == "GlobalSecondaryIndexes" and billing == "PROVISIONED":
            for index in indexes:
                index["ProvisionedThroughput"] = request["ProvisionedThroughput"]
        if indexes:
            request[kind] = indexes
    stream = description.get("StreamSpecification") or {}
    if stream.get("StreamEnabled"):
        request["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    return request


def _header(headers: dict[str, str], name: str) -> str:
    return next((value for key, value in headers.items() if key.lower() == name.lower()), "")


def changes_state(entry: dict[str, Any]) -> bool:
    """Whether a recorded request could have changed the emulator's state (stream reads, the
    stream poller's requests and every other read could not, and cannot be replayed cleanly)."""
    headers = entry.get("headers") or {}
    if POLLER_USER_AGENT in _header(headers, "User-Agent"):
        return False
    target = _header(headers, "X-Amz-Target")
    if target:
        return target.rsplit(".", 1)[-1] not in READ_OPERATIONS
    return entry.get("method") in ("PUT", "POST", "DELETE")


class Persistence:
    """Snapshots of ``emulator`` in ``data_dir``, and their restore (see the module's text)."""

    def __init__(
        self,
        data_dir: Path,
        emulator: Emulator,
        *,
        outbox: Outbox | None = None,
        region: str = REGION,
    ) -> None:
        self.data_dir = data_dir
        self.emulator = emulator
        self.outbox = outbox
        self.region = region
        self.snapshots_written = 0
        self._restored = False
        self._saved_generation: int | None = None
        #: (bucket, key, version id, etag) -> SHA-256 of the body: bodies are read and hashed once
        self._digests: dict[tuple[str, str, str, str], str] = {}
        self._take_lock = threading.Lock()
        self._periodic: Periodic | None = None

    @property
    def snapshot_path(self) -> Path:
        return self.data_dir / SNAPSHOT_FILE

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / OBJECTS_DIR

    @property
    def recording_path(self) -> Path:
        return self.data_dir / LEGACY_RECORDING

    # --- restore --------------------------------------------------------------------------

    def restore(self) -> Restored | None:
        """Bring the emulator (started, empty) to the saved state; None when nothing was saved.
        ``SnapshotError`` (one line saying what to do) when the saved state cannot be restored."""
        import requests
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if self.snapshot_path.exists():
                report: Restored | None = self._restore_snapshot(self._read_snapshot())
            elif self.recording_path.is_file() and self.recording_path.stat().st_size > 0:
                report = self._migrate_recording()
            else:
                report = None
        except (
            BotoCoreError,
            ClientError,
            requests.RequestException,
            KeyError,
            TypeError,
            ValueError,
            OSError,
        ) as error:
            first_line = str(error).splitlines()[0] if str(error) else ""
            raise SnapshotError(
                f"cannot restore {self.data_dir} ({type(error).__name__}: {first_line}): "
                "move the data dir aside to start afresh"
            ) from None
        self._restored = True
        return report

    def _read_snapshot(self) -> dict[str, Any]:
        try:
            snapshot = json.loads(self.snapshot_path.read_bytes())
        except (OSError, ValueError) as error:
            raise SnapshotError(
                f"cannot read {self.snapshot_path} ({type(error).__name__}): move the data dir aside to start afresh"
            ) from None
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(
                f"{self.snapshot_path} is not a snapshot this version reads (format {SNAPSHOT_FORMAT}): "
                "move the data dir aside to start afresh"
            )
        return snapshot

    def _clients(self) -> tuple[Any, Any]:
        import boto3

        options = {
            "endpoint_url": self.emulator.endpoint_url,
            "region_name": self.region,
            # the emulator accepts any credentials; these are not secrets
            "aws_access_key_id": "local",
            "aws_secret_access_key": "local",
        }
        return boto3.client("dynamodb", **options), boto3.client("s3", **options)

    def _restore_snapshot(self, snapshot: dict[str, Any]) -> Restored:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends
        from moto.s3.models import s3_backends

        tables, buckets = snapshot.get("tables", []), snapshot.get("buckets", [])
        self._create_containers(tables, buckets)
        report = Restored(tables=len(tables), taken_at=snapshot.get("taken_at"))
        with self.emulator.exclusive():
            present = self._restore_objects(s3_backends[DEFAULT_ACCOUNT_ID]["aws"], buckets, report)
            backend = dynamodb_backends[DEFAULT_ACCOUNT_ID][self.region]
            for table in tables:
                self._restore_items(backend.tables[table["name"]], table, present, report)
        self._saved_generation = self.emulator.generation  # what is on disk is what is served
        return report

    def _create_containers(self, tables: list[dict[str, Any]], buckets: list[dict[str, Any]]) -> None:
        """The snapshot's tables (with their TTL) and buckets (with their versioning), through the API."""
        dynamodb, s3 = self._clients()
        existing_tables = set(dynamodb.list_tables()["TableNames"])
        for table in tables:
            if table["name"] not in existing_tables:
                dynamodb.create_table(**table["create"])
            if table.get("ttl"):
                dynamodb.update_time_to_live(TableName=table["name"], TimeToLiveSpecification=table["ttl"])
        existing_buckets = {bucket["Name"] for bucket in s3.list_buckets().get("Buckets", [])}
        for bucket in buckets:
            if bucket["name"] not in existing_buckets:
                s3.create_bucket(Bucket=bucket["name"])
            if bucket.get("versioning"):
                s3.put_bucket_versioning(
                    Bucket=bucket["name"], VersioningConfiguration={"Status": bucket["versioning"]}
                )

    def _restore_objects(self, s3_backend: Any, buckets: list[dict[str, Any]], report: Restored) -> dict[str, set[str]]:
        """Every object of the snapshot, into moto's S3 backend; the keys present, by bucket."""
        present: dict[str, set[str]] = {}
        for bucket in buckets:
            for entry in bucket["objects"]:
                body = self._body(entry["sha256"])
                stored = s3_backend.put_object(bucket["name"], entry["key"], body)
                stored.set_metadata(dict(entry.get("metadata") or {}))
                self._digests[(bucket["name"], entry["key"], stored.version_id, stored.etag)] = entry["sha256"]
                present.setdefault(bucket["name"], set()).add(entry["key"])
                report.objects += 1
        return present

    def _restore_items(self, model: Any, table: dict[str, Any], present: dict[str, set[str]], report: Restored) -> None:
        """One table's items, into moto's table: silently, but for outbox items whose object was
        never shipped, which are written with their INSERT records so the stream poller ships them."""
        unshipped = []
        shard, model.stream_shard = model.stream_shard, None  # restored items are not news
        try:
            for item in table["items"]:
                if self._unshipped(table["name"], item, present):
                    unshipped.append(item)
                else:
                    model.put_item(item, overwrite=True)
        finally:
            model.stream_shard = shard
        for item in unshipped:  # with their INSERT records: the stream poller ships them
            model.put_item(item, overwrite=True)
        report.items += len(table["items"])
        report.unshipped += len(unshipped)

    def _body(self, digest: str) -> bytes:
        path = self.objects_dir / digest
        try:
            body = path.read_bytes()
        except OSError as error:
            raise SnapshotError(
                f"the snapshot names {path}, which cannot be read ({error.strerror}):"
                " move the data dir aside to start afresh"
            ) from None
        if hashlib.sha256(body).hexdigest() != digest:
            raise SnapshotError(f"{path} does not match its SHA-256: move the data dir aside to start afresh")
        return body

    def _unshipped(self, table: str, item: dict[str, Any], present: dict[str, set[str]]) -> bool:
        outbox = self.outbox
        if outbox is None or table != outbox.table:
            return False
        key = outbox.object_key(item)
        return key is not None and key not in present.get(outbox.bucket, set())

    def _migrate_recording(self) -> Restored:
        import requests

        count = 0
        base = self.emulator.endpoint_url
        with requests.Session() as session, open(self.recording_path, encoding="utf-8", errors="replace") as recording:
            for line in recording:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if not isinstance(entry, dict) or not changes_state(entry):
                    continue
                headers = {k: v for k, v in (entry.get("headers") or {}).items() if k.lower() != "transfer-encoding"}
                body: Any = entry.get("body") or b""
                if entry.get("body_encoded"):
                    body = base64.b64decode(body)
                path = "/" + str(entry.get("url", "")).split("://", 1)[-1].partition("/")[2]
                session.request(entry.get("method", "POST"), base + path, headers=headers, data=body, timeout=60)
                count += 1
        self._saved_generation = None
        self.take()
        self.recording_path.unlink()
        return Restored(migrated_requests=count)

    # --- snapshots ------------------------------------------------------------------------

    def take(self) -> bool:
        """Write a snapshot when anything changed since the last one; True when one was written.
        Never before ``restore``: that would save an empty emulator over the saved state."""
        if not self._restored:
            return False
        with self._take_lock:
            with self.emulator.exclusive():
                generation = self.emulator.generation
                if generation == self._saved_generation:
                    return False
                tables = self._capture_tables()
                buckets, bodies = self._capture_buckets()
            self._write(tables, buckets, bodies)
            self._saved_generation = generation
            self.snapshots_written += 1
            return True

    def _capture_tables(self) -> list[dict[str, Any]]:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        tables = []
        for name, model in sorted(dynamodb_backends[DEFAULT_ACCOUNT_ID][self.region].tables.items()):
            ttl = model.ttl
            tables.append(
                {
                    "name": name,
                    "create": _create_request(model.describe()["TableDescription"]),
                    "ttl": (
                        {"Enabled": True, "AttributeName": ttl["AttributeName"]}
                        if ttl.get("TimeToLiveStatus") == "ENABLED" and ttl.get("AttributeName")
                        else None
                    ),
                    # to_json builds new containers: safe to serialise after the lock is let go
                    "items": [item.to_json()["Attributes"] for item in model.all_items()],
                }
            )
        return tables

    def _capture_buckets(self) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import FakeDeleteMarker, s3_backends

        buckets, bodies = [], {}
        digests: dict[tuple[str, str, str, str], str] = {}
        for name, bucket in sorted(s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets.items()):
            objects = []
            for key, stored in sorted(bucket.keys.items()):
                if isinstance(stored, FakeDeleteMarker):
                    continue
                identity = (name, key, stored.version_id, stored.etag)
                digest = self._digests.get(identity)
                if digest is None:
                    body = stored.value
                    digest = hashlib.sha256(body).hexdigest()
                    bodies[digest] = body
                digests[identity] = digest
                objects.append({"key": key, "sha256": digest, "metadata": dict(stored.metadata)})
            buckets.append({"name": name, "versioning": bucket.versioning_status, "objects": objects})
        self._digests = digests  # only what exists now: the cache does not grow with uptime
        return buckets, bodies

    def _write(self, tables: list[dict[str, Any]], buckets: list[dict[str, Any]], bodies: dict[str, bytes]) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.objects_dir.mkdir(exist_ok=True, mode=0o700)
        for digest, body in bodies.items():
            if not (self.objects_dir / digest).exists():
                files.atomic_write(self.objects_dir / digest, body, sync_directory=False)
        files.fsync_directory(self.objects_dir)
        snapshot = {"format": SNAPSHOT_FORMAT, "taken_at": round(time.time(), 3), "tables": tables, "buckets": buckets}
        files.atomic_write(
            self.snapshot_path,
            json.dumps(snapshot, separators=(",", ":"), default=_bytes_as_base64).encode(),
            sync_directory=False,
        )
        files.fsync_directory(self.data_dir)
        named = {entry["sha256"] for bucket in buckets for entry in bucket["objects"]}
        for path in self._object_files():
            if path.name not in named:
                path.unlink(missing_ok=True)

    def _object_files(self) -> Iterator[Path]:
        for path in self.objects_dir.iterdir():
            if path.is_file() and not path.name.startswith("."):
                yield path

    # --- the periodic snapshot ------------------------------------------------------------

    def start_periodic(self, interval_seconds: float = DEFAULT_SNAPSHOT_INTERVAL_SECONDS) -> None:
        self._periodic = Periodic(
            "snapshots",
            interval_seconds,
            self.take,
            log=log,
            failure="snapshot of the data dir failed; retrying",
            failure_event="snapshot_failed",
        )
        self._periodic.start()

    def stop(self) -> None:
        """Stop the periodic snapshots and take the last one (raises when it cannot be written)."""
        if self._periodic is not None:
            self._periodic.stop()
            self._periodic = None
        self.take()


def _bytes_as_base64(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
