"""Refuse any caller whose protocol version is not accepted, saying which verdict applies."""

from __future__ import annotations

from typing import Any

from modelforge_protocol.versions import Component, Verdict, next_step, verdict

from chalicelib.domain.errors import Invalid


def require_compatible(component: Component, body: dict[str, Any]) -> int:
    judged = verdict(component, body.get("protocol_version"))
    if judged is not Verdict.COMPATIBLE:
        raise Invalid(
            "protocol_incompatible",
            f"{component.value} protocol version is not accepted by this control plane",
            verdict=judged.value,
            next_step=next_step(component, judged),
        )
    return int(body["protocol_version"])
