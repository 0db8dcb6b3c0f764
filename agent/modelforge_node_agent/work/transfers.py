"""Presigned transfers: the work's input fetched with a presigned GET, its result uploaded with a
presigned PUT. Presigned URLs are bearer secrets: never logged, never followed when they redirect,
and https only (plain http only for loopback addresses). The session carries no credential of
the node's; one whole-transfer deadline bounds each, and answers are read up to a cap."""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import requests
from modelforge_protocol import capped_read
from modelforge_protocol.addresses import is_loopback_host

from ..deadline import Deadline
from ..transport import DEADLINE_EXCEEDED, NETWORK_ERRORS, network_label, read_capped

#: Whole-transfer deadline of one presigned GET (input, at most 5 MiB) or PUT (result, 16 MiB).
TRANSFER_TIMEOUT_SECONDS = 120.0
#: What is read of a PUT's answer.
MAX_PUT_ANSWER_BYTES = 64 * 1024


class TransferFailed(Exception):
    """A presigned GET or PUT did not succeed; ``reason`` names the status or error class, never
    the URL (a bearer secret)."""

    def __init__(self, reason: str, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason, self.retryable = reason, retryable


def check_presigned_url(url: str) -> None:
    """https, or plain http to a loopback address (the local stack); no user information."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:  # e.g. an unclosed IPv6 bracket
        raise TransferFailed("presigned URL refused: not a URL") from None
    if not host or parts.username is not None or parts.password is not None:
        raise TransferFailed("presigned URL refused: not an absolute URL with a host")
    if parts.scheme == "https" or (parts.scheme == "http" and is_loopback_host(host)):
        return
    raise TransferFailed("presigned URL refused: https is required (plain http only for loopback addresses)")


class PresignedObjects:
    """GET and PUT on presigned URLs: no redirect followed, one whole-transfer deadline, answers
    read up to a cap."""

    def __init__(
        self,
        session: requests.Session,
        request_timeout_seconds: float,
        transfer_timeout_seconds: float = TRANSFER_TIMEOUT_SECONDS,
    ) -> None:
        self._session = session
        self._timeout = request_timeout_seconds
        self._transfer_timeout = transfer_timeout_seconds

    def get(self, url: str, what: str, max_bytes: int) -> bytes:
        return self._exchange("GET", url, what, None, max_bytes)

    def put(self, url: str, what: str, data: bytes) -> None:
        self._exchange("PUT", url, what, data, MAX_PUT_ANSWER_BYTES)

    def _exchange(self, method: str, url: str, what: str, data: bytes | None, max_bytes: int) -> bytes:
        check_presigned_url(url)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        with Deadline(self._transfer_timeout) as deadline:
            try:
                response = self._session.request(
                    method, url, data=data, headers=headers, timeout=self._timeout, stream=True, allow_redirects=False
                )
                with contextlib.closing(response):
                    status = response.status_code
                    if 300 <= status < 400:
                        raise TransferFailed(f"HTTP {status} redirect on {method} {what} (not followed)")
                    if not 200 <= status < 300:
                        raise TransferFailed(f"HTTP {status} on {method} {what}")
                    body = _read(response, method, what, max_bytes)
            except NETWORK_ERRORS as error:
                label = DEADLINE_EXCEEDED if deadline.expired else network_label(error)[0]
                raise TransferFailed(f"{label} on {method} {what}") from None
        if deadline.expired:
            raise TransferFailed(f"{DEADLINE_EXCEEDED} on {method} {what}")
        return body


def _read(response: requests.Response, method: str, what: str, max_bytes: int) -> bytes:
    try:
        return read_capped(response, max_bytes)
    except capped_read.Compressed:
        raise TransferFailed(f"{method} {what}: the answer is compressed") from None
    except capped_read.TooLarge:
        raise TransferFailed(f"{what} larger than {max_bytes} bytes", retryable=False) from None
