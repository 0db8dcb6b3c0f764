"""A minimal client of the worker's HTTP API, over a unix socket or loopback TCP (standard
library only). For tests, benchmarks and operators' scripts; the agent has its own."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the parsed JSON, or None when the body was not JSON
    raw: bytes

    @property
    def error_code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            code = self.body["error"].get("code")
            return code if isinstance(code, str) else None
        return None


class WorkerClient:
    """``address``: ``unix:///path/worker.sock`` or ``http://127.0.0.1:PORT``. One connection per
    request unless ``keep_alive``."""

    def __init__(self, address: str, timeout: float = 30.0, *, keep_alive: bool = False) -> None:
        self.address = address
        self.timeout = timeout
        self.keep_alive = keep_alive
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.address)
        if parts.scheme == "unix":
            return _UnixConnection(parts.path, self.timeout)
        if parts.scheme == "http" and parts.hostname:
            return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=self.timeout)
        raise ValueError(f"not a worker address: {self.address}")

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        connection = self._connection or self._connect()
        self._connection = None
        try:
            sent = dict(headers or {})
            if body is not None:
                sent.setdefault("Content-Type", "application/json")
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            raw = response.read()
            reusable = self.keep_alive and not response.will_close
        except BaseException:
            connection.close()
            raise
        if reusable:
            self._connection = connection
        else:
            connection.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return Answer(response.status, parsed, raw)

    def status(self) -> Answer:
        return self.request("GET", "/v1/status")

    def run(self, capability: str, payload: Any, job_id: str | None = None, gpu_uuid: str | None = None) -> Answer:
        request = {"capability": capability, "input": payload}
        if job_id is not None:
            request["job_id"] = job_id
        if gpu_uuid is not None:
            request["gpu_uuid"] = gpu_uuid
        return self.request("POST", "/v1/run", json.dumps(request).encode())

    def cancel(self, job_id: str) -> Answer:
        return self.request("POST", "/v1/cancel", json.dumps({"job_id": job_id}).encode())

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
