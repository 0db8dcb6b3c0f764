"""The control-plane HTTP client the tests share lives in the tooling package (bench uses it too)."""

from modelforge_cli.api_client import (
    AgentIdentity,
    ControlPlane,
    cpu_inventory,
    enroll_body,
    gpu_inventory,
    gpu_telemetry,
    heartbeat_body,
)

__all__ = [
    "AgentIdentity",
    "ControlPlane",
    "cpu_inventory",
    "enroll_body",
    "gpu_inventory",
    "gpu_telemetry",
    "heartbeat_body",
]
