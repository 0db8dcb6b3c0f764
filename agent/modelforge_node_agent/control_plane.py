"""Calls to the control plane, and how their answers are classified.

Every call runs under one whole-request deadline (``MODELFORGE_AGENT_REQUEST_TIMEOUT_SECONDS``),
never follows a redirect, reads at most ``MAX_ANSWER_BYTES`` and validates the answer against the
shared answer schemas before the agent sees it:

- 3xx: ``RedirectRefused`` (exit 2); the redirect is not followed, its Location never shown.
- no connection, TLS, timeouts, the deadline, 429, 5xx, and malformed answers (label
  ``InvalidAnswer (HTTP n)``): ``TransientFailure``, retried with backoff by the caller; a 429
  carries its Retry-After.
- other 4xx: ``Refused``, carrying only the status and the error code of the answer.

The failures themselves, and what each means to a caller (``classify``), are in ``failures``.

A response body can echo what the agent sent, so it is never logged or put in a message.
"""

from __future__ import annotations

import contextlib
from typing import Any

import requests
from modelforge_protocol import capped_read
from modelforge_protocol.credentials import NODE_ID_HEADER
from modelforge_protocol.schemas import MAX_ANSWER_BYTES, MAX_RETRY_AFTER_SECONDS, MIN_RETRY_AFTER_SECONDS

from . import answers
from .answers import MalformedAnswer
from .deadline import Deadline
from .failures import RedirectRefused, Refused, TransientFailure
from .identity import Identity
from .transport import DEADLINE_EXCEEDED, NETWORK_ERRORS, network_label, read_capped

ENROLL = "/api/v1/agent/enroll"
HEARTBEAT = "/api/v1/agent/heartbeat"
INVENTORY = "/api/v1/agent/inventory"
WORK_CLAIM = "/api/v1/agent/work/claim"
#: The lease holder's calls on one work item: ``work_path(work_id, RENEW)``.
RENEW, COMPLETE, FAIL = "renew", "complete", "fail"

_ANSWERS = {ENROLL: answers.ENROLL_ANSWER, HEARTBEAT: answers.HEARTBEAT_ANSWER, INVENTORY: answers.INVENTORY_ANSWER}


def work_path(work_id: str, action: str) -> str:
    """``/api/v1/agent/work/{work_id}/{action}`` (the claim answer's schema checked the id's format)."""
    return f"/api/v1/agent/work/{work_id}/{action}"


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as delay-seconds, clamped to 1..3600; None when absent or not a plain number."""
    text = (value or "").strip()
    if not text or len(text) > 10 or not (text.isascii() and text.isdigit()):
        return None
    return answers.clamp(int(text), MIN_RETRY_AFTER_SECONDS, MAX_RETRY_AFTER_SECONDS)


def _invalid(status: int, path: str, malformed: MalformedAnswer) -> TransientFailure:
    return TransientFailure(f"InvalidAnswer (HTTP {status})", "POST", path, malformed.reason, status=status)


def _read_answer(response: requests.Response) -> bytes:
    """The whole body, or MalformedAnswer as soon as it is known to exceed the cap."""
    try:
        return read_capped(response, MAX_ANSWER_BYTES)
    except capped_read.Compressed:
        raise MalformedAnswer("answer is compressed; the agent asks for and reads only uncompressed answers") from None
    except capped_read.TooLarge:
        raise MalformedAnswer(f"answer larger than {MAX_ANSWER_BYTES} bytes") from None


class ControlPlaneClient:
    def __init__(self, session: requests.Session, base_url: str, timeout_seconds: float) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout_seconds

    def post(self, path: str, body: dict[str, Any], identity: Identity | None = None) -> dict[str, Any]:
        """The validated answer, or RedirectRefused, TransientFailure or Refused."""
        answer = self._post(path, body, identity, _ANSWERS[path], no_content=False)
        assert answer is not None
        return answer

    def claim(self, identity: Identity) -> dict[str, Any] | None:
        """A work item leased to this node (the validated claim answer), or None (204: nothing
        claimable); else RedirectRefused, TransientFailure or Refused (409 ``node_not_online``)."""
        return self._post(WORK_CLAIM, {}, identity, answers.CLAIM_ANSWER, no_content=True)

    def lease(self, work_id: str, action: str, body: dict[str, Any], identity: Identity) -> dict[str, Any]:
        """Renew, complete or fail a held lease; 409 ``lease_lost``, ``work_cancelled``, ... are Refused."""
        answer = self._post(work_path(work_id, action), body, identity, answers.LEASE_ANSWER, no_content=False)
        assert answer is not None
        return answer

    def _post(
        self, path: str, body: dict[str, Any], identity: Identity | None, validator: Any, *, no_content: bool
    ) -> dict[str, Any] | None:
        with Deadline(self._timeout) as deadline:
            try:
                status, raw = self._exchange(path, body, self._headers(identity))
            except NETWORK_ERRORS as error:
                label, detail = (DEADLINE_EXCEEDED, "") if deadline.expired else network_label(error)
                raise TransientFailure(label, "POST", path, detail) from None
        if deadline.expired:  # the body may have looked complete when its socket was shut down
            raise TransientFailure(DEADLINE_EXCEEDED, "POST", path)
        if no_content and status == 204:
            return None
        return self._classify(path, status, raw, validator)

    @staticmethod
    def _headers(identity: Identity | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if identity is not None and identity.node_id is not None:
            headers["Authorization"] = f"Bearer {identity.credential}"
            headers[NODE_ID_HEADER] = identity.node_id
        return headers

    def _exchange(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
        response = self._session.post(
            self._base_url + path, json=body, headers=headers, timeout=self._timeout, stream=True, allow_redirects=False
        )
        with contextlib.closing(response):  # a body not read to its end closes the connection
            status = response.status_code
            if 300 <= status < 400:
                raise RedirectRefused(status, "POST", path)
            if status == 429 or status >= 500:
                retry_after = retry_after_seconds(response.headers.get("Retry-After")) if status == 429 else None
                raise TransientFailure(f"HTTP {status}", "POST", path, status=status, retry_after=retry_after)
            try:
                return status, _read_answer(response)
            except MalformedAnswer as malformed:
                raise _invalid(status, path, malformed) from None

    @staticmethod
    def _classify(path: str, status: int, raw: bytes, validator: Any) -> dict[str, Any]:
        try:
            if 200 <= status < 300:
                return answers.validated(validator, raw)
            if not 400 <= status < 500:
                raise MalformedAnswer("unexpected HTTP status")
            error = answers.validated(answers.ERROR_ANSWER, raw)["error"]
        except MalformedAnswer as malformed:
            raise _invalid(status, path, malformed) from None
        raise Refused(status, error["code"], "POST", path, error.get("verdict"), error.get("next_step"))
