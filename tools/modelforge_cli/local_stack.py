"""The whole control plane on one machine: emulator, tables, API server, scheduler, stream.

Everything here runs the deployed code: the Chalice app from functions/app.py, its scheduled
sweep and its state-log stream handler, against moto on 127.0.0.1, with the tables and bucket
created from infra/resources.json.
"""

from __future__ import annotations

import os
import secrets
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Self

from . import provision
from .emulator import Emulator
from .http_server import (
    DEFAULT_CONNECTION_TIMEOUT_SECONDS,
    DEFAULT_MAX_CONNECTIONS,
    ApiServer,
    ServerThread,
    load_app,
    tls_context,
)
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
    sweep_interval_seconds: float = 60.0
    stream_interval_seconds: float = 0.2
    resource_prefix: str = "modelforge"
    serialize_emulator: bool = True
    #: use this AWS endpoint (e.g. LocalStack) instead of starting the embedded emulator
    aws_endpoint_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    #: idle, slow or unfinished API connections are closed after this long
    connection_timeout_seconds: float = DEFAULT_CONNECTION_TIMEOUT_SECONDS
    #: API connections served at once; more are answered 503 server_busy
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class LocalStack:
    """Start with ``start()``; ``api_url`` is then served until ``stop()``."""

    def __init__(self, options: LocalOptions) -> None:
        self.options = options
        self.emulator: Emulator | None = None
        if options.aws_endpoint_url is None:
            self.emulator = Emulator(
                "127.0.0.1", options.emulator_port, serialize=options.serialize_emulator, data_dir=options.data_dir
            )
        self.names = provision.resource_names(options.resource_prefix)
        self.app_module: ModuleType | None = None
        self.generated_admin_token: str | None = None
        self._server: ServerThread | None = None
        self._poller: StreamPoller | None = None
        self._scheduler: Scheduler | None = None
        self.replayed_requests = 0

    @property
    def api_url(self) -> str:
        scheme = "https" if self.options.tls_cert else "http"
        assert self._server is not None
        address: Any = self._server.server.server_address
        host, port = address[:2]
        return f"{scheme}://{host}:{port}"

    @property
    def aws_endpoint_url(self) -> str:
        if self.emulator is not None:
            return self.emulator.endpoint_url
        assert self.options.aws_endpoint_url is not None
        return self.options.aws_endpoint_url

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
        if not os.environ.get("MODELFORGE_ADMIN_TOKEN") and not os.environ.get("MODELFORGE_ADMIN_TOKEN_SHA256"):
            self.generated_admin_token = secrets.token_urlsafe(32)
            env["MODELFORGE_ADMIN_TOKEN"] = self.generated_admin_token
        return env

    def start(self) -> None:
        os.environ.update(self._environment())
        tls: ssl.SSLContext | None = None
        if self.options.tls_cert and self.options.tls_key:
            tls = tls_context(self.options.tls_cert, self.options.tls_key)
        self.app_module = load_app()
        from chalicelib import instance

        instance.reset()
        instance.get()  # validates settings before serving: exits non-zero on a bad configuration
        if self.emulator is not None:
            self.emulator.start()
            if self.emulator.has_recording():
                self.replayed_requests = self.emulator.replay_recording()
        os.environ["AWS_ENDPOINT_URL"] = self.aws_endpoint_url
        instance.reset()
        instance.get()
        provision.provision(self.aws_endpoint_url, self.names, REGION)
        app = self.app_module.app
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
        server = ApiServer(
            self.options.host,
            self.options.port,
            app,
            tls,
            connection_timeout_seconds=self.options.connection_timeout_seconds,
            max_connections=self.options.max_connections,
        )
        self._server = ServerThread(server)
        self._server.start()

    def drain_state_log(self) -> int:
        """Ship every outbox event written so far (tests call this instead of waiting)."""
        assert self._poller is not None
        return self._poller.poll_once()

    def aws_operations(self) -> dict[str, int]:
        if self.emulator is None or self.emulator.middleware is None:
            raise RuntimeError("AWS operations are counted only by the embedded emulator")
        return self.emulator.middleware.snapshot()

    def stop(self) -> None:
        for part in (self._server, self._scheduler, self._poller):
            if part is not None:
                part.stop()
        if self.emulator is not None:
            self.emulator.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
