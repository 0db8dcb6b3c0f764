"""Simulated nodes: an agent running against a scripted NVML fake says ``"simulated": true`` in its
inventory. The seed forbids fabricated telemetry, so a control plane accepts such a node only when
``MODELFORGE_ALLOW_SIMULATED_NODES`` is true (a development control plane: ``modelforge local up
--allow-simulated-nodes``); otherwise enroll and inventory refuse it before anything is written."""

from __future__ import annotations

from typing import Any

from chalicelib.config.settings import ALLOW_SIMULATED_NODES_VAR, Settings
from chalicelib.domain.errors import Forbidden

CODE = "simulated_node_refused"
MESSAGE = "the control plane does not accept simulated nodes"
NEXT_STEP = (
    f"set {ALLOW_SIMULATED_NODES_VAR}=true on a development control plane, "
    "or run the agent without MODELFORGE_AGENT_NVML_SIMULATION"
)


def is_simulated(inventory: dict[str, Any]) -> bool:
    """Whether the inventory says its GPUs come from an NVML simulation (the protocol allows only true)."""
    return inventory.get("simulated") is True


def require_allowed(settings: Settings, inventory: dict[str, Any]) -> None:
    """Refuse a simulated inventory (403 ``simulated_node_refused``) unless the settings allow it."""
    if is_simulated(inventory) and not settings.allow_simulated_nodes:
        raise Forbidden(CODE, MESSAGE, next_step=NEXT_STEP)
