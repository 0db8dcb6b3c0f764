"""The local AWS emulator: moto in server mode on 127.0.0.1, atomic per request.

moto's conditional writes check and write in separate steps, so two concurrent requests can
both pass a condition that real DynamoDB lets only one pass. Real DynamoDB is atomic per
item; here one lock around each request gives the same guarantee for every item at once.
``serialize=False`` exists only so a test can show that the race tests catch the difference.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

from werkzeug.serving import BaseWSGIServer, make_server

#: Marks requests of the local stream poller, which stands in for Lambda's event source mapping.
POLLER_USER_AGENT = "modelforge-local-stream-poller"

WsgiApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]


class SerializingMiddleware:
    """Handle one request at a time, and count them by AWS operation."""

    def __init__(self, app: WsgiApp, serialize: bool = True) -> None:
        self._app = app
        self._serialize = serialize
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.operations: collections.Counter[str] = collections.Counter()

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        self._count(environ)
        if not self._serialize:
            return self._app(environ, start_response)
        with self._lock:
            # consume the whole response inside the lock: moto may build it lazily
            return [b"".join(self._app(environ, start_response))]

    def _count(self, environ: dict) -> None:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        # the local stream poller stands in for Lambda's event source mapping: not app traffic
        caller = "poller:" if POLLER_USER_AGENT in environ.get("HTTP_USER_AGENT", "") else ""
        if target:
            operation = target.rsplit(".", 1)[-1]  # DynamoDB_20120810.UpdateItem -> UpdateItem
        elif environ.get("PATH_INFO", "").startswith("/moto-api"):
            return
        else:
            operation = f"S3:{environ.get('REQUEST_METHOD', '?')}"
        with self._count_lock:
            self.operations[caller + operation] += 1

    def snapshot(self) -> dict[str, int]:
        with self._count_lock:
            return dict(self.operations)


def make_cancelled_transactions_leave_no_stream_records() -> None:
    """Fix a moto fidelity gap: a cancelled TransactWriteItems must leave no trace.

    moto applies a transaction's items one by one and, when a condition fails, swaps in deep
    copies of the tables taken before the transaction. Stream iterators still hold the old
    table's stream shard, which received records of the writes that were rolled back, and never
    see the records written afterwards. DynamoDB writes nothing and streams nothing for a
    cancelled transaction. Here the pre-transaction state is copied back *into* the objects the
    iterators hold. Safe only because the emulator handles one request at a time.
    """
    from moto.dynamodb.models import DynamoDBBackend

    original = DynamoDBBackend.transact_write_items
    if getattr(original, "_modelforge_patched", False):
        return

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        live_tables = dict(self.tables)
        try:
            return original(self, transact_items)
        except Exception:
            for name, live in live_tables.items():
                restored = self.tables.get(name)
                if restored is None or restored is live:
                    continue
                live_shard, restored_shard = getattr(live, "stream_shard", None), getattr(restored, "stream_shard", None)
                live.__dict__.update(restored.__dict__)
                if live_shard is not None and restored_shard is not None:
                    live_shard.__dict__.update(restored_shard.__dict__)
                    live_shard.table = live
                    live.stream_shard = live_shard
                self.tables[name] = live
            raise

    transact_write_items._modelforge_patched = True  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


class Emulator:
    """A moto server on a thread. ``data_dir`` keeps state across restarts via moto's recorder."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        serialize: bool = True,
        data_dir: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.serialize = serialize
        self.data_dir = data_dir
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.middleware: SerializingMiddleware | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.environ["MOTO_ENABLE_RECORDING"] = "True"
            os.environ["MOTO_RECORDER_FILEPATH"] = str(self.recording_path)
        # imported late: moto reads the recorder settings at import
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                """The emulator's per-request lines would drown the control plane's log."""

        make_cancelled_transactions_leave_no_stream_records()
        self.middleware = SerializingMiddleware(
            DomainDispatcherApplication(create_backend_app), serialize=self.serialize
        )
        self._server = make_server(
            self.host, self.port, self.middleware, threaded=True, request_handler=QuietHandler
        )
        self._server.socket.listen(128)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="aws-emulator", daemon=True)
        self._thread.start()

    @property
    def recording_path(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "aws-requests.jsonl"

    def has_recording(self) -> bool:
        return self.data_dir is not None and self.recording_path.exists() and self.recording_path.stat().st_size > 0

    def replay_recording(self) -> int:
        """Re-apply every recorded request, so the emulator holds the state it had."""
        from moto.moto_api import recorder

        with open(self.recording_path) as recording:
            count = sum(1 for line in recording if line.strip())
        recorder.replay_recording(target_host=self.endpoint_url)
        return count

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def operations_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Operations counted between two snapshots (for tests and benchmarks)."""
    return {name: after.get(name, 0) - before.get(name, 0) for name in after if after.get(name, 0) != before.get(name, 0)}

