"""The whole control plane on one machine: emulator, tables, API server, scheduler, stream.

Everything here runs the deployed code: the Chalice app from functions/app.py, its scheduled
sweep and its state-log stream handler, against moto on 127.0.0.1, with the tables and bucket
created from infra/resources.json.
"""

from __future__ import annotations

import os
import secrets
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Self

from modelforge_protocol import files

from . import provision
from .channel_events import NoChannelHandlers, handlers_of
from .channel_server import ChannelLimits, ChannelServer
from .connection_limits import DEFAULT_CONNECTION_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS
from .emulator import listen_error
from .emulator_host import InProcess, Keep, OwnProcess
from .http_server import (
    ApiServer,
    ServerThread,
    load_app,
    tls_context,
)
from .invocation_gate import DEFAULT_MAX_INVOCATIONS
from .persistence import DEFAULT_SNAPSHOT_INTERVAL_SECONDS, DataDirLock, Outbox, Restored
from .scheduler import Scheduler
from .stream_poller import StreamPoller

REGION = "us-east-1"


@dataclass
class LocalOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    emulator_port: int = 0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    data_dir: Path | None = None
    #: with ``data_dir``: how often a snapshot is written while anything changed (and on stop)
    snapshot_interval_seconds: float = DEFAULT_SNAPSHOT_INTERVAL_SECONDS
    sweep_interval_seconds: float = 60.0
    stream_interval_seconds: float = 0.2
    resource_prefix: str = "modelforge"
    serialize_emulator: bool = True
    #: run the embedded emulator in a process of its own (``emulator_host.OwnProcess``; local up
    #: does), so that the API and moto each get a core; in this process, a benchmark can observe
    #: moto's state (``emulator_host.InProcess``)
    emulator_process: bool = False
    #: use this AWS endpoint (e.g. LocalStack) instead of starting the embedded emulator
    aws_endpoint_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    #: idle, slow or unfinished API connections are closed after this long
    connection_timeout_seconds: float = DEFAULT_CONNECTION_TIMEOUT_SECONDS
    #: API connections served at once; more are answered 503 server_busy
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: app invocations at once; other requests wait their turn in arrival order
    max_invocations: int = DEFAULT_MAX_INVOCATIONS
    #: keep the admin token here across restarts (read it, or write a generated one, mode 0600);
    #: MODELFORGE_ADMIN_TOKEN (or its SHA-256) wins over it
    admin_token_file: Path | None = None
    #: the push channel's port (127.0.0.1): None: the API port + 1000 (0 when that is 0); 0: any free one
    channel_port: int | None = None
    #: the channel's limits (API Gateway's by default; tests shorten them)
    channel_limits: ChannelLimits = field(default_factory=ChannelLimits)


#: How far above the API port the channel listens by default (8000 -> 9000).
CHANNEL_PORT_OFFSET = 1000
#: The variables local up sets for its control plane (the channel's URLs).
CHANNEL_URL_VAR, CHANNEL_MANAGEMENT_URL_VAR = "MODELFORGE_CHANNEL_URL", "MODELFORGE_CHANNEL_MANAGEMENT_URL"


def channel_port(options: LocalOptions) -> int:
    """The channel's port: ``--channel-port``, else the API port + 1000 (a free one when the API's
    port is chosen freely too)."""
    if options.channel_port is not None:
        return options.channel_port
    return options.port + CHANNEL_PORT_OFFSET if options.port else 0


class AdminTokenFileError(Exception):
    """The admin token file cannot be used; the message says why and what to do."""


def read_admin_token_file(path: Path) -> str:
    """The token in ``path``: a regular file (not a link) that only its owner can read, like an
    ssh key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        raise AdminTokenFileError(f"cannot read the admin token file {path} ({error.strerror})") from None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as file:
        mode = os.fstat(file.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise AdminTokenFileError(f"the admin token file {path} is not a regular file")
        if mode & 0o077:
            raise AdminTokenFileError(
                f"the admin token file {path} can be read by others (mode {stat.S_IMODE(mode):04o}): "
                f"run chmod 600 {path} (or delete it, and a new token is generated)"
            )
        token = file.read().strip()
    if not token:
        raise AdminTokenFileError(f"the admin token file {path} is empty: delete it, and a new token is generated")
    return token


def write_admin_token_file(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a folder made for it: its owner's only
    with files.create_new(path, mode=0o600) as file:
        file.write(f"{token}\n".encode())


def state_log_object_key(item: dict[str, Any]) -> str | None:
    """The state-log object an outbox item is shipped as (``persistence.Outbox.object_key``; a
    module's function, so that it reaches the emulator's own process by name)."""
    from chalicelib.stores.state_log import state_log_key

    event_id = item.get("event_id", {}).get("S")
    return state_log_key(event_id) if isinstance(event_id, str) else None


class LocalStack:
    """Start with ``start()``; ``api_url`` is then served until ``stop()``.

    ``start()`` checks before it changes anything: the configuration (``SettingsError``), the API
    and emulator ports (``PortInUse``, naming the option that changes them) and the data dir's
    lock (``DataDirInUse``, naming the lock file and the process holding it). Only then does it
    write the admin token file, start the emulator, restore the data dir and serve.
    """

    def __init__(self, options: LocalOptions) -> None:
        self.options = options
        self.emulator: InProcess | OwnProcess | None = None
        if options.aws_endpoint_url is None:
            host = OwnProcess if options.emulator_process else InProcess
            self.emulator = host("127.0.0.1", options.emulator_port, serialize=options.serialize_emulator)
        self.names = provision.resource_names(options.resource_prefix)
        self.app_module: ModuleType | None = None
        self.generated_admin_token: str | None = None
        #: where the admin token came from: "environment", "file" or "generated"
        self.admin_token_source: str | None = None
        #: what the data dir held at start (None: nothing, or no data dir)
        self.restored: Restored | None = None
        #: the final snapshot failed (the data dir keeps the previous one)
        self.save_error: Exception | None = None
        self._lock: DataDirLock | None = None
        self._api_server: ApiServer | None = None
        self._server: ServerThread | None = None
        self._poller: StreamPoller | None = None
        self._scheduler: Scheduler | None = None
        self._channel: ChannelServer | None = None

    @property
    def api_url(self) -> str:
        scheme = "https" if self.options.tls_cert else "http"
        assert self._api_server is not None
        address: Any = self._api_server.server_address
        host, port = address[:2]
        return f"{scheme}://{host}:{port}"

    @property
    def channel(self) -> ChannelServer | None:
        """The push channel's server (None: the app has no WebSocket handlers)."""
        return self._channel

    @property
    def allow_simulated_nodes(self) -> bool:
        """Whether this control plane accepts simulated nodes (``--allow-simulated-nodes``, or
        MODELFORGE_ALLOW_SIMULATED_NODES in the environment); read once started."""
        from chalicelib import instance

        return instance.settings().allow_simulated_nodes

    @property
    def aws_endpoint_url(self) -> str:
        if self.emulator is not None:
            return self.emulator.endpoint_url
        assert self.options.aws_endpoint_url is not None
        return self.options.aws_endpoint_url

    @property
    def admin_token(self) -> str | None:
        """The admin token the API accepts (None when only its SHA-256 was given)."""
        return os.environ.get("MODELFORGE_ADMIN_TOKEN") or None

    def _environment(self) -> dict[str, str]:
        env = {
            "AWS_ENDPOINT_URL": self.options.aws_endpoint_url or "http://127.0.0.1:0",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            # the emulator accepts any credentials; these are not secrets
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            **self.names,
            **self.options.extra_env,
        }
        token_file = self.options.admin_token_file
        if os.environ.get("MODELFORGE_ADMIN_TOKEN") or os.environ.get("MODELFORGE_ADMIN_TOKEN_SHA256"):
            self.admin_token_source = "environment"
        elif token_file is not None and os.path.lexists(token_file):
            env["MODELFORGE_ADMIN_TOKEN"] = read_admin_token_file(token_file)
            self.admin_token_source = "file"
        else:
            self.generated_admin_token = secrets.token_urlsafe(32)
            env["MODELFORGE_ADMIN_TOKEN"] = self.generated_admin_token
            self.admin_token_source = "generated"
        return env

    def start(self) -> None:
        environment = self._environment()
        tls: ssl.SSLContext | None = None
        if self.options.tls_cert and self.options.tls_key:
            tls = tls_context(self.options.tls_cert, self.options.tls_key)
        os.environ.update(environment)
        self.app_module = load_app()
        from chalicelib import instance

        instance.reset()
        instance.get()  # validates settings before serving: exits non-zero on a bad configuration
        self._claim(tls)
        if self._channel is not None:
            for name, value in ((CHANNEL_URL_VAR, self._channel.channel_url),
                                (CHANNEL_MANAGEMENT_URL_VAR, self._channel.management_url)):  # fmt: skip
                os.environ[name] = self.options.extra_env.get(name, value)
        if self.generated_admin_token and self.options.admin_token_file is not None:
            write_admin_token_file(self.options.admin_token_file, self.generated_admin_token)
        if self.emulator is not None:
            self.restored = self.emulator.start(self._keep())
        os.environ["AWS_ENDPOINT_URL"] = self.aws_endpoint_url
        instance.reset()
        instance.get()
        provision.provision(self.aws_endpoint_url, self.names, REGION)
        self._poller = StreamPoller(
            self.aws_endpoint_url,
            self.names["MODELFORGE_OUTBOX_TABLE"],
            self.app_module.state_log,
            region=REGION,
            interval_seconds=self.options.stream_interval_seconds,
        )
        self._poller.start()
        self._scheduler = Scheduler(self.app_module.liveness_sweep, self.options.sweep_interval_seconds)
        self._scheduler.start()
        assert self._api_server is not None
        self._server = ServerThread(self._api_server)
        self._server.start()
        if self._channel is not None:
            self._channel.start()
        if self._lock is not None:
            self._lock.describe(api_url=self.api_url, emulator_url=self.aws_endpoint_url)

    def _claim(self, tls: ssl.SSLContext | None) -> None:
        """Take the data dir's lock (when its folder exists) and both ports, then the lock for
        good: nothing is created, started or written before all of them are ours."""
        assert self.app_module is not None
        if self.options.data_dir is not None and self.emulator is not None:
            self._lock = DataDirLock(self.options.data_dir)
            self._lock.acquire_existing()
        try:
            try:
                self._api_server = ApiServer(
                    self.options.host,
                    self.options.port,
                    self.app_module.app,
                    tls,
                    connection_timeout_seconds=self.options.connection_timeout_seconds,
                    max_connections=self.options.max_connections,
                    max_invocations=self.options.max_invocations,
                )
            except OSError as error:
                raise listen_error(error, self.options.host, self.options.port, "--port") from None
            self._channel = self._channel_server()
            if self.emulator is not None:
                self.emulator.bind()
            if self._lock is not None:
                self._lock.acquire()
        except BaseException:
            self.stop()
            raise

    def _channel_server(self) -> ChannelServer | None:
        assert self.app_module is not None
        try:
            handlers = handlers_of(self.app_module)
        except NoChannelHandlers:
            return None
        port = channel_port(self.options)
        try:
            return ChannelServer("127.0.0.1", port, handlers, self.options.channel_limits)
        except OSError as error:
            raise listen_error(error, "127.0.0.1", port, "--channel-port") from None

    def _keep(self) -> Keep | None:
        """What the data dir keeps (None without one): the snapshots, and the state log as their
        restore must know it (``persistence.Outbox``)."""
        if self._lock is None:
            return None
        outbox = Outbox(
            self.names["MODELFORGE_OUTBOX_TABLE"], self.names["MODELFORGE_STATE_LOG_BUCKET"], state_log_object_key
        )
        return Keep(self._lock.data_dir, outbox, REGION, self.options.snapshot_interval_seconds)

    def drain_state_log(self) -> int:
        """Ship every outbox event written so far (tests call this instead of waiting)."""
        assert self._poller is not None
        return self._poller.poll_once()

    def aws_changes(self) -> int:
        """How many app writes the embedded emulator has accepted (``SerializingMiddleware.changes``)."""
        if self.emulator is None:
            raise RuntimeError("AWS writes are counted only by the embedded emulator")
        return self.emulator.changes()

    def aws_operations(self) -> dict[str, int]:
        """The embedded emulator's requests so far, by operation (``SerializingMiddleware``)."""
        if self.emulator is None:
            raise RuntimeError("AWS operations are counted only by the embedded emulator")
        return self.emulator.operations()

    def emulator_exit_code(self) -> int | None:
        """The exit code of the emulator's own process once it has exited by itself (None while it
        runs, and for an emulator in this process or none)."""
        return self.emulator.exit_code() if isinstance(self.emulator, OwnProcess) else None

    def stop(self) -> None:
        """Stop serving, write the data dir's last snapshot, stop the emulator, release the lock
        (safe on a stack that started only in part)."""
        if self._channel is not None:  # first: each connection's $disconnect still reaches the tables
            self._channel.stop()
        for part in (self._server, self._scheduler, self._poller):
            if part is not None:
                part.stop()
        if self._server is None and self._api_server is not None:
            self._api_server.server_close()
        if self.emulator is not None:  # its last snapshot: an error is reported by the caller
            self.save_error = self.emulator.stop()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
