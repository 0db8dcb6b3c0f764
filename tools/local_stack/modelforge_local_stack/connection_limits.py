"""The local API server's connection limits by default, in a module light enough for ``local up``'s
argument parsing (the server itself imports Chalice and the control plane)."""

from __future__ import annotations

#: Idle, slow or unfinished connections are closed after this long (longer than the agents'
#: 15 s heartbeat interval, so a keep-alive agent keeps its connection).
DEFAULT_CONNECTION_TIMEOUT_SECONDS = 30.0
#: Connections served at once; more are answered 503 server_busy.
DEFAULT_MAX_CONNECTIONS = 256
