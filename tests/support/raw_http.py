"""Hostile HTTP clients on raw sockets, and what tests need to judge the server's answer.

Everything here talks to 127.0.0.1 only, and every loop is bounded in count and in time.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.port is not None, url
    return parts.hostname, parts.port


def connect(url: str, timeout: float = 10) -> socket.socket:
    return socket.create_connection(address(url), timeout=timeout)


def read_until_closed(sock: socket.socket, within: float = 10, limit: int = 1 << 20) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + within
    while sum(map(len, chunks)) < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the server kept the connection open for {within}s; got {b''.join(chunks)[:200]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def split_answers(raw: bytes, head_only: tuple[bool, ...] = ()) -> list[Answer]:
    """Parse consecutive HTTP/1.1 answers framed by Content-Length (the i-th one has no body
    when ``head_only[i]``, as an answer to HEAD must not)."""
    answers: list[Answer] = []
    for index in range(100):
        if not raw:
            break
        head, separator, raw = raw.partition(b"\r\n\r\n")
        assert separator, f"truncated answer head: {head[:200]!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if index < len(head_only) and head_only[index] else int(headers.get("content-length", "0"))
        answers.append(Answer(int(status_line.split()[1]), headers, raw[:length]))
        raw = raw[length:]
    return answers


def exchange(url: str, request: bytes, within: float = 10) -> list[Answer]:
    """Send raw bytes on a fresh connection and parse every answer until the server closes."""
    with connect(url) as sock:
        sock.sendall(request)
        return split_answers(read_until_closed(sock, within))


def closed_within(sock: socket.socket, within: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closed ``sock`` (None if it was still open after ``within``).

    With ``trickle``, one byte of it is sent every 0.1 s meanwhile: a client that is never idle
    for long but never finishes its request either.
    """
    started = time.monotonic()
    for index in range(int(within / 0.1) + 2):
        if trickle:
            try:
                sock.send(trickle[index % len(trickle) : index % len(trickle) + 1])
            except OSError:
                return time.monotonic() - started
        sock.settimeout(0.1)
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - started
        if time.monotonic() - started > within:
            return None
    return None


def reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a TCP reset, not an orderly close."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def tls_client(cafile: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cafile))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
