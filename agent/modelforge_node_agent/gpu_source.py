"""The GPUs the agent reports: inventory for enrollment and inventory calls, telemetry for each
heartbeat.

``open_gpus`` runs the preflight (``preflight.py``) and keeps its probe open for the agent's
life: ``NvidiaGpus`` reports the GPUs the preflight found and reads fresh telemetry through the
same NVML session, time-bounded (``bounded_call.py``); ``NoGpus`` is a CPU node, with nothing
invented. A telemetry failure is ``PreflightFailed(NVIDIA_TELEMETRY_UNAVAILABLE)``, which stops
the agent (exit 3) instead of sending a heartbeat without telemetry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from .bounded_call import BoundedCall, NoAnswer, check_timeout, close_probe, no_answer_cause
from .gpu import GpuInfo, GpuProbe, GpuTelemetry
from .preflight import TELEMETRY_UNAVAILABLE, PreflightFailed, open_probe, read_all_telemetry

log = logging.getLogger("modelforge.agent")


class GpuSource(Protocol):
    """What the agent's life cycle reads: the inventory's GPUs and one reading per GPU."""

    def devices(self) -> list[GpuInfo]: ...

    def telemetry(self) -> list[GpuTelemetry]: ...


class NvidiaGpus:
    """GPUs found by the preflight; telemetry read from the same NVML session, time-bounded."""

    def __init__(self, probe: GpuProbe, gpus: list[GpuInfo], timeout_seconds: float) -> None:
        self._probe, self._gpus, self._timeout = probe, gpus, timeout_seconds

    def devices(self) -> list[GpuInfo]:
        return list(self._gpus)

    def telemetry(self) -> list[GpuTelemetry]:
        return read_telemetry(self._probe, self._gpus, self._timeout)

    def close(self) -> None:
        close_probe(self._probe, self._timeout)

    @property
    def probe(self) -> GpuProbe:
        """The preflight's NVML session (per-GPU health reads through it too)."""
        return self._probe


class NoGpus:
    """A CPU node: no NVML, no GPUs, no GPU telemetry (none invented)."""

    def devices(self) -> list[GpuInfo]:
        return []

    def telemetry(self) -> list[GpuTelemetry]:
        return []

    def close(self) -> None:
        """Nothing to release."""


def open_gpus(mode: str, probe_factory: Callable[[], GpuProbe], timeout_seconds: float) -> NvidiaGpus | NoGpus:
    """Run the preflight for ``mode``; raises ``PreflightFailed`` (exit 3)."""
    probe, result = open_probe(mode, probe_factory, timeout_seconds=timeout_seconds)
    log.info(
        "preflight passed",
        extra={"event": "preflight_passed", "mode": mode, "nvml": result.nvml_used, "gpus": len(result.gpus)},
    )
    if probe is None:
        return NoGpus()
    return NvidiaGpus(probe, list(result.gpus), timeout_seconds)


#: The latest telemetry call for each probe, by ``id``: a stuck call's thread keeps its probe alive,
#: so its id cannot be reused while the call is running. A wedged call is not joined by another.
_in_flight: dict[int, threading.Event] = {}
_in_flight_lock = threading.Lock()


def read_telemetry(probe: GpuProbe, gpus: list[GpuInfo], timeout_seconds: float) -> list[GpuTelemetry]:
    """Fresh readings of every GPU for one heartbeat, or ``PreflightFailed(TELEMETRY_UNAVAILABLE)``.

    While an earlier call on the same probe is still stuck in NVML, this fails at once instead of
    starting another thread that would block behind it.
    """
    check_timeout(timeout_seconds)
    if not gpus:
        return []
    call = BoundedCall(lambda: read_all_telemetry(probe, gpus))
    with _in_flight_lock:
        earlier = _in_flight.get(id(probe))
        if earlier is not None and not earlier.is_set():
            raise PreflightFailed(TELEMETRY_UNAVAILABLE, "an earlier NVML telemetry call has still not returned")
        _in_flight[id(probe)] = call.done
    try:
        return call.start("nvml-telemetry").result(timeout_seconds)
    except NoAnswer:
        raise PreflightFailed(TELEMETRY_UNAVAILABLE, no_answer_cause(timeout_seconds, "reading telemetry")) from None
