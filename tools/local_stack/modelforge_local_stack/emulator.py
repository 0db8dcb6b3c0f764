"""The local AWS emulator: moto in server mode on 127.0.0.1, atomic per request.

moto's conditional writes check and write in separate steps, so two concurrent requests can
both pass a condition that real DynamoDB lets only one pass. Real DynamoDB is atomic per
item; here one lock around each request gives the same guarantee for every item at once.
``serialize=False`` exists only so a test can show that the race tests catch the difference.
"""

from __future__ import annotations

import collections
import copy
import errno
import io
import json
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server

from . import attribute_serializer, key_index, raw_uploads, service_folders

#: Marks requests of the local stream poller, which stands in for Lambda's event source mapping.
POLLER_USER_AGENT = "modelforge-local-stream-poller"

WsgiApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]

#: AWS operations that change no state, as the middleware names them (DynamoDB's and DynamoDB
#: Streams' X-Amz-Target operation, ``S3:<method>``); every other operation may write.
READ_OPERATIONS = frozenset(
    {
        "BatchGetItem",
        "DescribeContinuousBackups",
        "DescribeEndpoints",
        "DescribeLimits",
        "DescribeStream",
        "DescribeTable",
        "DescribeTimeToLive",
        "GetItem",
        "GetRecords",
        "GetShardIterator",
        "ListStreams",
        "ListTables",
        "ListTagsOfResource",
        "Query",
        "Scan",
        "TransactGetItems",
        "S3:GET",
        "S3:HEAD",
    }
)

#: The moto internals this module reaches into (moto is pinned exactly in pyproject.toml);
#: tests/unit/test_emulator_canary.py checks that each still exists and behaves as assumed.
MOTO_INTERNALS = (
    "moto.dynamodb.models.DynamoDBBackend.transact_write_items",
    "moto.dynamodb.models.copy",
    "moto.dynamodb.models.dynamo_type.DynamoType",
    "moto.dynamodb.models.table.Table",
    "moto.dynamodb.models.table.StreamShard",
    "moto.moto_server.werkzeug_app.DomainDispatcherApplication",
    "moto.moto_server.werkzeug_app.MotoRequestHandler",
    "moto.moto_server.werkzeug_app.create_backend_app",
    "moto.core.DEFAULT_ACCOUNT_ID",
    "moto.dynamodb.models.dynamodb_backends",
    "moto.dynamodb.models.table.Table.all_items",
    "moto.dynamodb.models.table.Table.put_item",
    "moto.dynamodb.models.table.Table.describe",
    "moto.dynamodb.models.dynamo_type.Item.to_json",
    "moto.s3.models.s3_backends",
    "moto.s3.models.S3Backend.put_object",
    "moto.s3.models.FakeKey.metadata",
    "moto.s3.models.FakeKey.set_metadata",
    "moto.s3.models.FakeDeleteMarker",
    *key_index.MOTO_INTERNALS,
    *attribute_serializer.MOTO_INTERNALS,
    *service_folders.MOTO_INTERNALS,
    *raw_uploads.MOTO_INTERNALS,
)


class FairLock:
    """A lock that its waiters take in the order they asked for it.

    A ``threading.Lock`` lets whichever waiter the scheduler wakes first take it, so under load
    (a hundred claimers, each request waiting behind the others) a request can be passed over
    again and again. Here ownership passes straight from the releaser to the longest waiter, so a
    request waits one round of the line at most. (Its effect was not measured apart from the
    emulator's other changes of the same commit.)
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiters: collections.deque[threading.Lock] = collections.deque()

    def acquire(self) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        turn.acquire()  # released by the holder that hands the lock over: we hold it now
        return True

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of a FairLock that is not held")
            if self._waiters:
                self._waiters.popleft().release()  # still held: by that waiter now
            else:
                self._held = False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class ObservedRequest:
    """One app request to the emulator, handed to an observer (``SerializingMiddleware.observe``)
    while no other request runs: the observer may read the state, must call ``forward()`` once to
    handle the request, and may read the state again."""

    def __init__(self, operation: str, environ: dict, start_response: Callable[..., Any], app: WsgiApp) -> None:
        #: the AWS operation as the counters name it: ``UpdateItem``, ``S3:PUT``
        self.operation = operation
        self.path = environ.get("PATH_INFO", "")
        self._environ, self._start_response, self._app = environ, start_response, app
        #: the request's JSON body, for DynamoDB requests (S3 bodies are not read)
        self.body = b""
        if environ.get("HTTP_X_AMZ_TARGET"):
            length = int(environ.get("CONTENT_LENGTH") or 0)
            self.body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(self.body)

    def forward(self) -> bytes:
        """Handle the request itself; its response body."""
        return b"".join(self._app(self._environ, self._start_response))

    def read(self, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A DynamoDB read (``GetItem``, ``Query``) of the state as it is now, sent to the same
        backend as this request: not counted, not observed. Only for a DynamoDB request."""
        target = self._environ.get("HTTP_X_AMZ_TARGET", "")
        if not target:
            raise ValueError(f"{self.operation} is not a DynamoDB request")
        body = json.dumps(payload).encode()
        environ = {key: value for key, value in self._environ.items() if not key.startswith("werkzeug.")}
        environ.update(
            {
                "wsgi.input": io.BytesIO(body),
                "CONTENT_LENGTH": str(len(body)),
                "HTTP_X_AMZ_TARGET": f"{target.rsplit('.', 1)[0]}.{operation}",
            }
        )
        status: list[str] = []

        def start_response(line: str, headers: Any, exc_info: Any = None) -> Callable[[bytes], None]:
            status.append(line)
            return lambda data: None

        answer = b"".join(self._app(environ, start_response))
        if not status or not status[0].startswith("200"):
            raise RuntimeError(f"{operation} answered {status[:1]}: {answer[:300]!r}")
        result: dict[str, Any] = json.loads(answer)
        return result


#: Handles an observed request instead of the middleware: calls ``forward()`` and returns its body.
Observer = Callable[[ObservedRequest], bytes]


class SerializingMiddleware:
    """Handle one request at a time, and count them by AWS operation.

    ``generation`` counts the requests handled that were not the local stream poller's: a
    snapshot taken at one generation is still current while the generation has not moved.
    ``changes`` counts the app's writes that the emulator accepted (a write operation answered
    2xx): DynamoDB and S3 change nothing on a refused write (a failed condition, a cancelled
    transaction), so while ``changes`` has not moved, no app request has changed the state.
    """

    def __init__(self, app: WsgiApp, serialize: bool = True) -> None:
        self._app = app
        self._serialize = serialize
        self._lock = FairLock()
        self._count_lock = threading.Lock()
        self._observer: Observer | None = None
        self.operations: collections.Counter[str] = collections.Counter()
        self.generation = 0
        self.changes = 0

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        operation, by_poller = self._count(environ)
        if operation == "S3:PUT":
            raw_uploads.mark(environ)  # stored as sent, as S3 does, whatever its Content-Type
        if operation is not None and not by_poller and operation not in READ_OPERATIONS:
            start_response = self._counting_accepted_writes(start_response)
        if not self._serialize:
            try:
                return self._app(environ, start_response)
            finally:
                self._moved(by_poller)
        with self._lock:
            observer = self._observer
            if observer is not None and operation is not None and not by_poller:
                body = [observer(ObservedRequest(operation, environ, start_response, self._app))]
            else:
                # consume the whole response inside the lock: moto may build it lazily
                body = [b"".join(self._app(environ, start_response))]
            self._moved(by_poller)
            return body

    def observe(self, observer: Observer | None) -> None:
        """Hand each app request (not the stream poller's) to ``observer``, inside the lock, so that
        it can read the state before and after the request (benchmarks price writes this way);
        None stops it. Only a serializing middleware observes."""
        self._observer = observer

    def exclusive(self) -> FairLock:
        """Hold this to see (or change) moto's state between requests: no request runs meanwhile
        (with ``serialize=False``, only other holders are kept out)."""
        return self._lock

    def _counting_accepted_writes(self, start_response: Callable[..., Any]) -> Callable[..., Any]:
        def counted(status: str, *args: Any, **kwargs: Any) -> Any:
            if status.startswith("2"):
                with self._count_lock:
                    self.changes += 1
            return start_response(status, *args, **kwargs)

        return counted

    def _moved(self, by_poller: bool) -> None:
        if not by_poller:
            with self._count_lock:
                self.generation += 1

    def _count(self, environ: dict) -> tuple[str | None, bool]:
        """Count the request's operation: (the operation, None for moto's own API; whether it is
        the local stream poller's)."""
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        # the local stream poller stands in for Lambda's event source mapping: not app traffic
        by_poller = POLLER_USER_AGENT in environ.get("HTTP_USER_AGENT", "")
        caller = "poller:" if by_poller else ""
        if target:
            operation = target.rsplit(".", 1)[-1]  # DynamoDB_20120810.UpdateItem -> UpdateItem
        elif environ.get("PATH_INFO", "").startswith("/moto-api"):
            return None, by_poller
        else:
            operation = f"S3:{environ.get('REQUEST_METHOD', '?')}"
        with self._count_lock:
            self.operations[caller + operation] += 1
        return operation, by_poller

    def snapshot(self) -> dict[str, int]:
        with self._count_lock:
            return dict(self.operations)


def make_cancelled_transactions_leave_no_trace() -> None:
    """Fix two moto gaps in TransactWriteItems: fidelity and cost.

    moto applies a transaction's items one by one and, when a condition fails, swaps in deep
    copies of the whole tables taken before the transaction. Two problems follow: stream
    iterators keep the old table's shard, which holds records of the rolled-back writes and never
    sees later ones (phantom state-log events); and every transaction copies every table it
    touches, so the emulator slows down as tables grow. DynamoDB writes and streams nothing for a
    cancelled transaction. Here the whole-table copy is skipped, and a cancelled transaction is
    undone item by item from pre-images taken just before it, with the stream records it added
    removed. Safe only because the emulator handles one request at a time.
    """
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    original = DynamoDBBackend.transact_write_items
    if getattr(original, "_modelforge_patched", False):
        return

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        try:
            images = [image for image in map(lambda entry: _pre_image(self, entry), transact_items) if image]
        except Exception:  # malformed request: let moto produce its validation error
            images = []
        shards = {id(t): (t.stream_shard, len(t.stream_shard.items)) for t, *_ in images if t.stream_shard}
        try:
            return original(self, transact_items)
        except Exception:
            for table, hash_value, range_value, previous in reversed(images):
                _put_back(table, hash_value, range_value, previous)
            for shard, length in shards.values():
                del shard.items[length:]
            raise

    dynamodb_models.copy = _NoTableCopies(Table)  # type: ignore[assignment]
    transact_write_items._modelforge_patched = True  # type: ignore[attr-defined]
    transact_write_items.__wrapped__ = original  # type: ignore[attr-defined]  # moto's own, for the canary test
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


class _NoTableCopies:
    """moto's ``copy`` module, except that tables (instances of ``table_type``) are not deep-copied."""

    def __init__(self, table_type: type) -> None:
        self._table_type = table_type

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        return value if isinstance(value, self._table_type) else copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def _pre_image(backend: Any, entry: dict[str, Any]) -> tuple[Any, Any, Any, Any] | None:
    """The item a transaction entry is about to write, as it is now: (table, hash key, range key,
    a deep copy of the item or None), or None where the entry names no known table and key."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    _, operation = next(iter(entry.items()))
    table = backend.tables.get(operation.get("TableName"))
    key = operation.get("Key") or operation.get("Item")
    if table is None or not key or table.hash_key_attr not in key:
        return None
    hash_value = DynamoType(key[table.hash_key_attr])
    range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr in key else None
    return table, hash_value, range_value, copy.deepcopy(table.get_item(hash_value, range_value))


def _put_back(table: Any, hash_value: Any, range_value: Any, previous: Any) -> None:
    """Restore one pre-image: the previous item, or no item where there was none."""
    if range_value is not None:
        if previous is None:
            table.items[hash_value].pop(range_value, None)
        else:
            table.items[hash_value][range_value] = previous
    elif previous is None:
        table.items.pop(hash_value, None)
    else:
        table.items[hash_value] = previous
    key_index.touched(table, hash_value, range_value)


class PortInUse(OSError):
    """A port this process must listen on is taken: which one, and the option that changes it."""

    def __init__(self, host: str, port: int, option: str) -> None:
        self.host, self.port, self.option = host, port, option
        super().__init__(
            f"port {port} on {host} is already in use (another modelforge local up?): stop what listens there, "
            f"or choose another port with {option} PORT ({option} 0 picks a free one)"
        )

    def __reduce__(self) -> tuple[type[PortInUse], tuple[str, int, str]]:
        """Pickled by its arguments (it crosses the pipe from the emulator's own process)."""
        return PortInUse, (self.host, self.port, self.option)


def listen_error(error: OSError, host: str, port: int, option: str) -> OSError:
    """``error`` from binding ``host:port``, as a message naming the port and ``option``."""
    if error.errno == errno.EADDRINUSE:
        return PortInUse(host, port, option)
    reason = error.strerror or str(error)
    return OSError(
        error.errno, f"cannot listen on {host}:{port} ({reason}); choose another address or port with {option}"
    )


class Emulator:
    """A moto server on a thread: ``bind()`` takes the port, ``start()`` serves (binding first if
    needed). State lives in this process only; ``persistence`` keeps it across restarts."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, serialize: bool = True) -> None:
        self.host = host
        self.port = port
        self.serialize = serialize
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.middleware: SerializingMiddleware | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bind(self) -> None:
        """Listen on the port (``PortInUse`` names ``--emulator-port`` when it is taken)."""
        if self._server is not None:
            return
        # imported late: moto is heavy, and reads its settings at import
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                """The emulator's per-request lines would drown the control plane's log."""

        make_cancelled_transactions_leave_no_trace()
        key_index.make_queries_read_only_their_key()
        attribute_serializer.make_attribute_values_serialize_in_one_step()
        service_folders.make_service_list_read_once()
        raw_uploads.make_put_bodies_raw()
        self.middleware = SerializingMiddleware(
            DomainDispatcherApplication(create_backend_app), serialize=self.serialize
        )
        # bound here, not by werkzeug, which prints its own message and exits on a port in use
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(128)
        except OSError as error:
            listener.close()
            raise listen_error(error, self.host, self.port, "--emulator-port") from None
        try:
            self._server = make_server(
                self.host, self.port, self.middleware, threaded=True, request_handler=QuietHandler, fd=listener.fileno()
            )
        finally:
            listener.close()  # the server holds its own duplicate of the socket
        self.port = self._server.server_address[1]

    def start(self) -> None:
        self.bind()
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever, name="aws-emulator", daemon=True)
        self._thread.start()

    @property
    def generation(self) -> int:
        """How many requests (other than the stream poller's) the emulator has handled."""
        assert self.middleware is not None
        return self.middleware.generation

    @property
    def changes(self) -> int:
        """How many app writes the emulator has accepted (see ``SerializingMiddleware``)."""
        assert self.middleware is not None
        return self.middleware.changes

    def exclusive(self) -> FairLock:
        """A lock that keeps every request out while held (see ``SerializingMiddleware``)."""
        assert self.middleware is not None
        return self.middleware.exclusive()

    def stop(self) -> None:
        if self._server is not None:
            if self._thread is not None:
                self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def operations_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Operations counted between two snapshots (for tests and benchmarks)."""
    return {
        name: after.get(name, 0) - before.get(name, 0) for name in after if after.get(name, 0) != before.get(name, 0)
    }
