"""The heartbeat answer's GPU part (schemas.HEARTBEAT_ANSWER): kept apart from ``views`` so that the
heartbeat route imports only what it uses."""

from __future__ import annotations

from typing import Any

from chalicelib.services.gpu_health import GpuAnswer


def gpu_answer(answer: GpuAnswer | None) -> dict[str, Any]:
    """A heartbeat answer's GPU part: only for a node that something blocks (schemas.HEARTBEAT_ANSWER)."""
    if answer is None:
        return {}
    shaped: dict[str, Any] = {"drained": answer.drained, "blocked_gpus": answer.blocked}
    if answer.recheck:
        shaped["recheck_gpus"] = answer.recheck
    return shaped
