"""The NVIDIA preflight: decide whether this node needs NVML, and prove NVML works before enrolling.

The startup contract (seed NODE_AGENT.md, "NVIDIA startup contract"; DESIGN.md decision 9):
``nvidia`` requires NVML, at least one GPU and telemetry for every GPU; ``cpu`` never touches NVML;
``auto`` behaves like ``nvidia`` when NVIDIA devices or ``NVIDIA_VISIBLE_DEVICES`` are observed and
like ``cpu`` otherwise. A failure is a ``PreflightFailed`` with one of three stable codes (the
caller exits 3); nothing here sends an empty inventory or invents a reading.

This is the startup check only. Every batch of NVML calls is time-bounded (``bounded_call.py``);
the GPUs it finds become the agent's GPU source (``gpu_source.py``), which reads telemetry for
each heartbeat through the same probe.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelforge_protocol.schemas import ACCELERATOR_MODES

from .bounded_call import (
    DEFAULT_TIMEOUT_SECONDS,
    BoundedCall,
    NoAnswer,
    check_timeout,
    close_probe,
    no_answer_cause,
    shutdown_quietly,
)
from .gpu import GpuError, GpuInfo, GpuLost, GpuProbe, GpuTelemetry, PynvmlProbe

NVML_UNAVAILABLE = "NVIDIA_NVML_UNAVAILABLE"
DEVICE_NOT_FOUND = "NVIDIA_DEVICE_NOT_FOUND"
TELEMETRY_UNAVAILABLE = "NVIDIA_TELEMETRY_UNAVAILABLE"
PREFLIGHT_CODES = (NVML_UNAVAILABLE, DEVICE_NOT_FOUND, TELEMETRY_UNAVAILABLE)
#: NVIDIA_VISIBLE_DEVICES values that mean "no GPUs" to the NVIDIA Container Toolkit.
_NO_VISIBLE_DEVICES = frozenset({"", "void", "none"})


class PreflightFailed(Exception):
    """The node cannot serve as configured; ``code`` is stable, ``cause`` says why (no secrets)."""

    def __init__(self, code: str, cause: str) -> None:
        if code not in PREFLIGHT_CODES:
            raise ValueError(f"unknown preflight code {code!r}")
        super().__init__(f"{code}: {cause}")
        self.code = code
        self.cause = cause


@dataclass(frozen=True)
class PreflightResult:
    """What the preflight found. ``mode`` is the configured mode; ``nvml_used`` says whether NVML
    was required (nvidia, or auto with NVIDIA devices observed)."""

    mode: str
    nvml_used: bool
    gpus: list[GpuInfo] = field(default_factory=list)
    telemetry: list[GpuTelemetry] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "nvml_used": self.nvml_used,
            "gpus": [gpu.to_wire() for gpu in self.gpus],
            "telemetry": [reading.to_wire() for reading in self.telemetry],
        }

    def as_text(self) -> str:
        if not self.nvml_used:
            reason = "" if self.mode == "cpu" else " (no NVIDIA devices or NVIDIA_VISIBLE_DEVICES observed)"
            return f"preflight passed: mode {self.mode}{reason}; no NVIDIA GPUs are required or used"
        lines = [f"preflight passed: mode {self.mode}, NVML answered, {len(self.gpus)} GPU(s)"]
        lines += _table(self.gpus, {reading.index: reading for reading in self.telemetry})
        return "\n".join(lines)


_COLUMNS = ("index", "uuid", "name", "memory", "driver", "cuda", "util", "mem used", "temp", "power")


def _table(gpus: list[GpuInfo], readings: Mapping[int, GpuTelemetry]) -> list[str]:
    """A plain fixed-width table, one row per GPU, readable in a terminal and in a log."""
    rows = [_COLUMNS] + [_row(gpu, readings.get(gpu.index)) for gpu in gpus]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _row(gpu: GpuInfo, reading: GpuTelemetry | None) -> tuple[str, ...]:
    gib = 1024**3
    identity = (str(gpu.index), gpu.uuid, gpu.name, f"{gpu.memory_total_bytes / gib:.1f} GiB")
    versions = (gpu.driver_version, gpu.cuda_version)
    if reading is None:
        return identity + versions + ("-", "-", "-", "-")
    return (
        identity
        + versions
        + (
            f"{reading.utilization_percent:.0f}%",
            f"{reading.memory_used_bytes / gib:.1f} GiB",
            f"{reading.temperature_celsius:.0f} C",
            f"{reading.power_watts:.1f} W",
        )
    )


def nvidia_observed(environ: Mapping[str, str], dev_dir: Path = Path("/dev")) -> bool:
    """Whether this host or container shows signs of NVIDIA GPUs, which makes ``auto`` strict."""
    visible = environ.get("NVIDIA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() not in _NO_VISIBLE_DEVICES:
        return True
    try:
        if (dev_dir / "nvidiactl").exists():
            return True
        return any(path.name[len("nvidia") :].isdigit() for path in dev_dir.glob("nvidia[0-9]*"))
    except OSError:  # an unreadable /dev is no evidence of GPUs
        return False


def requires_nvml(mode: str, environ: Mapping[str, str], dev_dir: Path) -> bool:
    """Resolve the configured mode to "does this node need NVML"."""
    if mode not in ACCELERATOR_MODES:
        raise ValueError(f"accelerator mode must be one of {', '.join(ACCELERATOR_MODES)}")
    return mode == "nvidia" or (mode == "auto" and nvidia_observed(environ, dev_dir))


# --- opening a probe -----------------------------------------------------------------------------


@dataclass
class _Progress:
    """How far the opening thread got, so a timeout can say where NVML stopped answering."""

    doing: str = "initialising NVML"


def read_all_telemetry(probe: GpuProbe, gpus: list[GpuInfo], progress: _Progress | None = None) -> list[GpuTelemetry]:
    """Telemetry for every GPU, in inventory order; any failure is TELEMETRY_UNAVAILABLE, but for a
    GPU lost from the bus (``GpuLost``): it is left out (its health says failed, reboot) and the
    others serve, unless no GPU yields telemetry."""
    readings = []
    lost: list[GpuLost] = []
    for gpu in gpus:
        if progress is not None:
            progress.doing = f"reading telemetry of GPU {gpu.index}"
        try:
            reading = probe.telemetry(gpu.index)
        except GpuLost as error:
            lost.append(error)
            continue
        except Exception as error:
            raise PreflightFailed(TELEMETRY_UNAVAILABLE, _cause(error, f"GPU {gpu.index}")) from error
        if reading.index != gpu.index:
            raise PreflightFailed(
                TELEMETRY_UNAVAILABLE, f"telemetry asked of GPU {gpu.index} came back for GPU {reading.index}"
            )
        readings.append(reading)
    if lost and not readings:
        raise PreflightFailed(TELEMETRY_UNAVAILABLE, f"no GPU yields telemetry: {lost[0]}") from lost[0]
    return readings


def _cause(error: Exception, subject: str) -> str:
    """The probe's message, which names what failed; other exceptions get their type and subject."""
    if isinstance(error, GpuError):
        return str(error)
    return f"{subject}: unexpected {type(error).__name__}: {error}"


def _inventory(probe: GpuProbe, progress: _Progress) -> list[GpuInfo]:
    progress.doing = "listing GPUs"
    try:
        gpus = probe.devices()
    except Exception as error:
        raise PreflightFailed(NVML_UNAVAILABLE, _cause(error, "listing GPUs")) from error
    if not gpus:
        raise PreflightFailed(DEVICE_NOT_FOUND, "NVML answered but reports no NVIDIA GPUs on this node")
    return gpus


def _open(
    probe_factory: Callable[[], GpuProbe], progress: _Progress
) -> tuple[GpuProbe, list[GpuInfo], list[GpuTelemetry]]:
    """Runs on the bounded call's thread: init, inventory, telemetry; shuts the probe down on any failure."""
    try:
        probe = probe_factory()
        probe.init()
    except Exception as error:
        raise PreflightFailed(NVML_UNAVAILABLE, _cause(error, "initialising NVML")) from error
    try:
        gpus = _inventory(probe, progress)
        return probe, gpus, read_all_telemetry(probe, gpus, progress)
    except BaseException:
        shutdown_quietly(probe)
        raise


def open_probe(
    mode: str,
    probe_factory: Callable[[], GpuProbe] = PynvmlProbe,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    environ: Mapping[str, str] = os.environ,
    dev_dir: Path = Path("/dev"),
) -> tuple[GpuProbe | None, PreflightResult]:
    """Run the preflight and keep the probe initialised for the agent's heartbeats.

    Returns ``(None, result)`` when the node does not need NVML (the factory is never called).
    Otherwise the caller owns the returned probe and must ``bounded_call.close_probe`` it.
    """
    check_timeout(timeout_seconds)
    if not requires_nvml(mode, environ, dev_dir):
        return None, PreflightResult(mode=mode, nvml_used=False)
    progress = _Progress()
    call = BoundedCall(lambda: _open(probe_factory, progress), discard=lambda opened: shutdown_quietly(opened[0]))
    try:
        probe, gpus, readings = call.start("nvml-preflight").result(timeout_seconds)
    except NoAnswer:
        code = TELEMETRY_UNAVAILABLE if progress.doing.startswith("reading telemetry") else NVML_UNAVAILABLE
        raise PreflightFailed(code, no_answer_cause(timeout_seconds, progress.doing)) from None
    return probe, PreflightResult(mode=mode, nvml_used=True, gpus=gpus, telemetry=readings)


def run_preflight(
    mode: str,
    probe_factory: Callable[[], GpuProbe] = PynvmlProbe,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    environ: Mapping[str, str] = os.environ,
    dev_dir: Path = Path("/dev"),
) -> PreflightResult:
    """The one-shot check (``--preflight``): open the probe, report, and shut NVML down again."""
    probe, result = open_probe(mode, probe_factory, timeout_seconds=timeout_seconds, environ=environ, dev_dir=dev_dir)
    close_probe(probe, timeout_seconds)
    return result
