"""Calls to the control plane, and how their failures are classified.

Transient failures (no connection, TLS, timeouts, 429, 5xx) are retried with backoff by the
caller. Refusals (other 4xx) carry only the status and the error code of the answer: a response
body can echo what the agent sent, so it is never logged.
"""

from __future__ import annotations

from typing import Any

import requests
from modelforge_protocol.credentials import NODE_ID_HEADER

from .identity import Identity

ENROLL = "/api/v1/agent/enroll"
HEARTBEAT = "/api/v1/agent/heartbeat"
INVENTORY = "/api/v1/agent/inventory"


class TransientFailure(Exception):
    """Worth retrying: ``label`` names the error class or HTTP status (never a body)."""

    def __init__(self, label: str, method: str, path: str, detail: str = "") -> None:
        super().__init__(f"{label} on {method} {path}")
        self.label, self.method, self.path, self.detail = label, method, path, detail


class Refused(Exception):
    """The control plane answered 4xx: do not retry blindly."""

    def __init__(self, status: int, code: str, method: str, path: str, verdict: str | None, next_step: str | None) -> None:
        super().__init__(f"HTTP {status} {code} on {method} {path}")
        self.status, self.code, self.method, self.path = status, code, method, path
        self.verdict, self.next_step = verdict, next_step


def _label(error: requests.RequestException) -> tuple[str, str]:
    if isinstance(error, requests.exceptions.SSLError):
        reason = str(error)
        hint = "certificate verify failed" if "CERTIFICATE_VERIFY_FAILED" in reason else "TLS handshake failed"
        if "match" in reason and "hostname" in reason.lower():
            hint = "certificate does not match the host name"
        return "TLSError", hint
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return "ConnectTimeout", ""
    if isinstance(error, requests.exceptions.ConnectionError):
        return "ConnectError", ""
    if isinstance(error, requests.exceptions.Timeout):
        return "ReadTimeout", ""
    return type(error).__name__, ""


class ControlPlaneClient:
    def __init__(self, session: requests.Session, base_url: str, timeout_seconds: float) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout_seconds

    def post(self, path: str, body: dict[str, Any], identity: Identity | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if identity is not None and identity.node_id is not None:
            headers["Authorization"] = f"Bearer {identity.credential}"
            headers[NODE_ID_HEADER] = identity.node_id
        try:
            response = self._session.post(self._base_url + path, json=body, headers=headers, timeout=self._timeout)
        except requests.RequestException as error:
            label, detail = _label(error)
            raise TransientFailure(label, "POST", path, detail) from None
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientFailure(f"HTTP {response.status_code}", "POST", path)
        try:
            answer = response.json()
        except ValueError:
            raise TransientFailure(f"HTTP {response.status_code} (not JSON)", "POST", path) from None
        if response.status_code >= 400:
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            raise Refused(
                response.status_code,
                str(error.get("code", "unknown")),
                "POST",
                path,
                error.get("verdict"),
                error.get("next_step"),
            )
        return answer if isinstance(answer, dict) else {}
