"""What the node reports about itself: GPUs (from the preflight), CPU, memory, capabilities."""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelforge_protocol.schemas import MAX_CAPABILITIES

from .gpu import GpuInfo


@functools.lru_cache(maxsize=4)
def _cpu_model(cpuinfo: Path) -> str:
    """Read once per process: /proc/cpuinfo is hundreds of KB on a large GPU host."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()[:128] or "unknown"
    except OSError:
        pass
    return (platform.processor() or platform.machine() or "unknown")[:128]


def _memory_total_bytes(meminfo: Path) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def capabilities(gpus: Sequence[GpuInfo], worker: Sequence[str] = ()) -> list[str]:
    """The accelerator ("cuda" or "cpu"), then what the runtime worker reports available."""
    names = ["cuda"] if gpus else ["cpu"]
    names += sorted(set(worker) - set(names))
    return names[:MAX_CAPABILITIES]


def host_inventory(
    gpus: Sequence[GpuInfo],
    *,
    worker_capabilities: Sequence[str] = (),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    meminfo: Path = Path("/proc/meminfo"),
) -> dict[str, Any]:
    return {
        "gpus": [gpu.to_wire() for gpu in sorted(gpus, key=lambda gpu: gpu.index)],
        "capabilities": capabilities(gpus, worker_capabilities),
        "cpu": {"model": _cpu_model(cpuinfo), "logical_cores": os.cpu_count() or 1},
        "memory_total_bytes": _memory_total_bytes(meminfo),
    }
