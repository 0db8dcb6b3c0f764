"""Every per-GPU health signal, as NVML answers it now, with the latency of each NVML call: the
diagnostic ``scripts/gpu-check.sh`` prints on a real GPU.

``python3 -m modelforge_node_agent.gpu_report [--json]`` reads the host's NVML only (never the
simulation), never enrolls and uses no network. Each row is one GPU: its telemetry, the field-values
batch (volatile uncorrected ECC, remapped rows pending and failed, the recovery action), the
clock-event reasons, NVLink states and MIG mode, each with how long its call took, and the grade
``gpu_health`` gives them. Xid registration is tried once and a 100 ms wait is timed. Exit 0 when
NVML answered, 3 when it did not (as the preflight).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from .gpu import GpuError, GpuHealthProbe, GpuInfo, PynvmlProbe, read_all_health_signals
from .gpu_health import HealthTracker

#: How long the timed Xid wait lasts.
XID_WAIT_MS = 100


def _plain(value: Any) -> Any:
    """JSON-ready: data classes as dicts, ``NotRead`` and other enums by name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(part) for name, part in dataclasses.asdict(value).items()}
    if isinstance(value, Enum):
        return value.name.lower()
    if isinstance(value, (list, tuple)):
        return [_plain(part) for part in value]
    if isinstance(value, dict):
        return {key: _plain(part) for key, part in value.items()}
    return value


def timed(call: Callable[[], Any]) -> dict[str, Any]:
    """``{"value" | "error", "ms"}`` of one NVML call."""
    started = time.perf_counter()
    try:
        value: dict[str, Any] = {"value": _plain(call())}
    except GpuError as error:
        value = {"error": f"{type(error).__name__}: {error}"}
    value["ms"] = round((time.perf_counter() - started) * 1000, 3)
    return value


def report(probe: GpuHealthProbe, gpus: Sequence[GpuInfo], now: datetime) -> dict[str, Any]:
    """Each GPU's signals and grade, and the Xid event set's registration and one timed wait."""
    rows = []
    for gpu in gpus:
        reads: dict[str, Callable[[int], Any]] = {
            "telemetry": probe.telemetry,
            "health_fields": probe.health_fields,
            "clock_events": probe.clock_events,
            "nvlink_states": probe.nvlink_states,
            "mig_enabled": probe.mig_enabled,
        }
        calls = {name: timed(functools.partial(read, gpu.index)) for name, read in reads.items()}
        (graded,) = HealthTracker().grade([gpu], read_all_health_signals(probe, [gpu]), now)  # this GPU alone
        rows.append({"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "calls": calls, "grade": graded.to_wire()})
    events = {
        "register_xid_events": timed(probe.register_xid_events),
        f"wait_xid_{XID_WAIT_MS}ms": timed(lambda: probe.wait_xid(XID_WAIT_MS)),
    }
    return {"gpus": rows, "xid_events": events}


def as_text(found: dict[str, Any]) -> str:
    lines = []
    for gpu in found["gpus"]:
        grade = gpu["grade"]
        reasons = ", ".join(f"{reason['code']} ({reason['action']})" for reason in grade["reasons"]) or "no reasons"
        lines.append(f"GPU {gpu['index']} {gpu['uuid']} {gpu['name']}: {grade['state']}, {reasons}")
        for name, call in gpu["calls"].items():
            shown = call.get("value", call.get("error"))
            lines.append(f"  {name:<14} {call['ms']:>9.3f} ms  {json.dumps(shown)}")
    for name, call in found["xid_events"].items():
        lines.append(f"{name:<22} {call['ms']:>9.3f} ms  {json.dumps(call.get('value', call.get('error')))}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_report", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    probe = PynvmlProbe()
    try:
        probe.init()
        gpus = probe.devices()
        found = report(probe, gpus, datetime.now(UTC))
    except GpuError as error:
        print(f"NVIDIA_NVML_UNAVAILABLE: {error}", file=sys.stderr)
        return 3
    finally:
        with contextlib.suppress(GpuError):
            probe.shutdown()
    print(json.dumps(found, indent=2) if args.json else as_text(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
