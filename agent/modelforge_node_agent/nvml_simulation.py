"""A scripted NVML (``GpuHealthProbe``) read from a scenario file: for tests and the agent's
simulation mode (``MODELFORGE_AGENT_NVML_SIMULATION=<scenario.json>``; wiring it into the agent's
configuration is not this module's job, and it must stay opt-in: the seed forbids fabricated telemetry
on a real node).

The scenario (validated strictly by ``load_scenario``: unknown keys refused, UUIDs must match
``GPU_UUID_PATTERN``, at most ``MAX_SCENARIO_BYTES``)::

    {"driver_version": "570.124.06", "cuda_version": "12.8",
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85520809984,
               "telemetry": {"utilization_percent": 0, "memory_used_bytes": 0,
                             "temperature_celsius": 31, "power_watts": 71.5},
               "fields": {"ecc_uncorrected_volatile": 0, "remap_pending": false,
                          "remap_failure": false, "recovery_action": 0},
               "clock_reasons": ["hw_slowdown"], "nvlink": [true, true], "mig": false, "lost": false}],
     "xid_events": [{"uuid": "GPU-...", "xid": 48}],
     "xid_wait_fails": false}

Any field value, ``clock_reasons`` and ``nvlink`` may be ``"not_supported"``. Omitted GPU keys
default to a healthy GPU without NVLink. The file is re-read when its modification time or size
changes, so a test or a demo edits it to inject a fault: each ``xid_events`` entry is delivered
once, by position (entries present at start included); changed fields apply on the next read;
``"lost": true`` makes every call on that GPU raise ``GpuLost``; a GPU removed from the list
vanishes (its index answers nothing, and the others keep theirs, as NVML's do while the driver
stays loaded; a GPU added later takes the next index); ``"xid_wait_fails":
true`` makes ``wait_xid`` raise ``XidEventsFailed``. An edit that does not validate is logged and
ignored (the last valid scenario stays), so a half-written file never breaks the agent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jsonschema
from modelforge_protocol.schemas import GPU_UUID_PATTERN, MAX_GPUS

from .gpu import (
    UNSUPPORTED,
    ClockEvents,
    GpuInfo,
    GpuLost,
    GpuTelemetry,
    HealthFields,
    NotRead,
    NvmlUnavailable,
    TelemetryUnavailable,
    XidEvent,
    XidEventsFailed,
    XidRegistration,
)

log = logging.getLogger("modelforge.agent")

MAX_SCENARIO_BYTES: Final = 256 * 1024
#: How often ``wait_xid`` looks at the file while it waits.
POLL_SECONDS: Final = 0.05
NOT_SUPPORTED_TEXT: Final = "not_supported"
CLOCK_REASONS: Final = ("hw_slowdown", "hw_thermal", "sw_thermal")

_NS = {"const": NOT_SUPPORTED_TEXT}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}


def _closed(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


SCENARIO_SCHEMA: Final = _closed(
    {
        "driver_version": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[0-9A-Za-z.+_-]+\Z"},
        "cuda_version": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[0-9]+\.[0-9]+\Z"},
        "xid_wait_fails": {"type": "boolean"},
        "xid_events": {
            "type": "array",
            "maxItems": 4096,
            "items": _closed(
                {
                    "uuid": {"type": "string", "pattern": GPU_UUID_PATTERN},
                    "xid": {"type": "integer", "minimum": 0, "maximum": 65535},
                },
                ["uuid", "xid"],
            ),
        },
        "gpus": {
            "type": "array",
            "maxItems": MAX_GPUS,
            "items": _closed(
                {
                    "uuid": {"type": "string", "pattern": GPU_UUID_PATTERN},
                    "name": {"type": "string", "minLength": 1, "maxLength": 128},
                    "memory_total_bytes": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                    "telemetry": _closed(
                        {
                            "utilization_percent": {"type": "number", "minimum": 0, "maximum": 100},
                            "memory_used_bytes": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                            "temperature_celsius": {"type": "number", "minimum": -50, "maximum": 150},
                            "power_watts": {"type": "number", "minimum": 0, "maximum": 10000},
                        },
                        ["utilization_percent", "memory_used_bytes", "temperature_celsius", "power_watts"],
                    ),
                    "fields": _closed(
                        {
                            "ecc_uncorrected_volatile": {"oneOf": [_COUNT, _NS]},
                            "remap_pending": {"oneOf": [{"type": "boolean"}, _NS]},
                            "remap_failure": {"oneOf": [{"type": "boolean"}, _NS]},
                            "recovery_action": {"oneOf": [_COUNT, _NS]},
                        },
                        [],
                    ),
                    "clock_reasons": {
                        "oneOf": [
                            {"type": "array", "items": {"enum": list(CLOCK_REASONS)}, "uniqueItems": True},
                            _NS,
                        ]
                    },
                    "nvlink": {"oneOf": [{"type": "array", "items": {"type": "boolean"}, "maxItems": 36}, _NS]},
                    "mig": {"type": "boolean"},
                    "lost": {"type": "boolean"},
                },
                ["uuid", "name", "memory_total_bytes", "telemetry"],
            ),
        },
    },
    ["driver_version", "cuda_version", "gpus"],
)


class ScenarioError(ValueError):
    """The scenario file is missing, too big, not JSON, or not a valid scenario; the message says which."""


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: the parsed document, read through the accessors below."""

    document: dict[str, Any]

    @property
    def gpus(self) -> list[dict[str, Any]]:
        gpus: list[dict[str, Any]] = self.document["gpus"]
        return gpus

    @property
    def xid_events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.document.get("xid_events", [])
        return events

    @property
    def xid_wait_fails(self) -> bool:
        return bool(self.document.get("xid_wait_fails", False))


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate a scenario file; raises ``ScenarioError`` naming the file and the problem."""
    where = Path(path)
    try:
        with where.open("rb") as handle:
            raw = handle.read(MAX_SCENARIO_BYTES + 1)
    except OSError as error:
        raise ScenarioError(f"cannot read the NVML simulation scenario {where}: {error.strerror or error}") from error
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"the NVML simulation scenario {where} is larger than {MAX_SCENARIO_BYTES} bytes")
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ScenarioError(f"the NVML simulation scenario {where} is not JSON: {error}") from error
    invalid = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCENARIO_SCHEMA).iter_errors(document))
    if invalid is not None:
        at = "/".join(str(part) for part in invalid.absolute_path) or "(top level)"
        raise ScenarioError(f"the NVML simulation scenario {where} is invalid at {at}: {invalid.message}")
    uuids = [gpu["uuid"] for gpu in document["gpus"]]
    if len(set(uuids)) != len(uuids):
        raise ScenarioError(f"the NVML simulation scenario {where} lists a GPU UUID twice")
    return Scenario(document)


def _read(value: Any) -> Any:
    return UNSUPPORTED if value == NOT_SUPPORTED_TEXT else value


class ScriptedProbe:
    """``GpuHealthProbe`` on a scenario file (see the module's docstring)."""

    def __init__(self, scenario_path: str | os.PathLike[str]) -> None:
        self._path = Path(scenario_path)
        self._lock = threading.Lock()
        self._scenario: Scenario | None = None
        self._stamp: tuple[int, int] | None = None
        self._delivered = 0
        self._registered = False
        #: index -> UUID, fixed when a GPU is first seen
        self._order: list[str] = []

    # --- the file ---

    def _current(self) -> Scenario:
        with self._lock:
            if self._scenario is None:
                raise NvmlUnavailable("simulated NVML is not initialised (init() was not called or failed)")
            try:
                stat = self._path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                return self._scenario  # the file is being replaced; keep the last valid scenario
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._scenario = load_scenario(self._path)
                except ScenarioError as error:
                    log.warning(
                        "simulation scenario ignored", extra={"event": "nvml_simulation_invalid", "error": str(error)}
                    )
            return self._scenario

    def _indexed(self, scenario: Scenario) -> dict[str, dict[str, Any]]:
        """The scenario's GPUs by UUID; a UUID seen for the first time takes the next index."""
        by_uuid = {gpu["uuid"]: gpu for gpu in scenario.gpus}
        with self._lock:
            self._order += [uuid for uuid in by_uuid if uuid not in self._order]
        return by_uuid

    def _gpu(self, index: int) -> dict[str, Any]:
        by_uuid = self._indexed(self._current())
        gpu = by_uuid.get(self._order[index]) if 0 <= index < len(self._order) else None
        if gpu is None:
            raise TelemetryUnavailable(f"simulated GPU {index} does not exist")
        if gpu.get("lost", False):
            raise GpuLost(f"simulated GPU {index} is lost", index)
        return gpu

    # --- GpuProbe ---

    def init(self) -> None:
        try:
            scenario = load_scenario(self._path)
            stat = self._path.stat()
        except (ScenarioError, OSError) as error:
            raise NvmlUnavailable(str(error)) from error
        with self._lock:
            self._scenario, self._stamp = scenario, (stat.st_mtime_ns, stat.st_size)
        self._indexed(scenario)

    def devices(self) -> list[GpuInfo]:
        scenario = self._current()
        by_uuid = self._indexed(scenario)
        # a lost GPU is left out, as PynvmlProbe leaves out one whose inventory answers GpuIsLost
        return [
            self._info(scenario, index, by_uuid[uuid])
            for index, uuid in enumerate(list(self._order))
            if uuid in by_uuid and not by_uuid[uuid].get("lost", False)
        ]

    @staticmethod
    def _info(scenario: Scenario, index: int, gpu: dict[str, Any]) -> GpuInfo:
        return GpuInfo(
            index=index,
            uuid=gpu["uuid"],
            name=gpu["name"],
            memory_total_bytes=gpu["memory_total_bytes"],
            driver_version=scenario.document["driver_version"],
            cuda_version=scenario.document["cuda_version"],
        )

    def telemetry(self, index: int) -> GpuTelemetry:
        gpu = self._gpu(index)
        reading = gpu["telemetry"]
        return GpuTelemetry(
            index=index,
            utilization_percent=float(reading["utilization_percent"]),
            memory_used_bytes=int(reading["memory_used_bytes"]),
            memory_total_bytes=int(gpu["memory_total_bytes"]),
            temperature_celsius=float(reading["temperature_celsius"]),
            power_watts=float(reading["power_watts"]),
        )

    def shutdown(self) -> None:
        with self._lock:
            self._scenario, self._registered = None, False

    # --- GpuHealthProbe ---

    def device_uuids(self) -> list[str]:
        return [gpu["uuid"] for gpu in self._current().gpus if not gpu.get("lost", False)]

    def health_fields(self, index: int) -> HealthFields:
        fields = self._gpu(index).get("fields", {})
        return HealthFields(
            ecc_uncorrected_volatile=_read(fields.get("ecc_uncorrected_volatile", 0)),
            remap_pending=_read(fields.get("remap_pending", False)),
            remap_failure=_read(fields.get("remap_failure", False)),
            recovery_action=_read(fields.get("recovery_action", 0)),
        )

    def clock_events(self, index: int) -> ClockEvents | NotRead:
        reasons = self._gpu(index).get("clock_reasons", [])
        if reasons == NOT_SUPPORTED_TEXT:
            return UNSUPPORTED
        return ClockEvents("hw_slowdown" in reasons, "hw_thermal" in reasons, "sw_thermal" in reasons)

    def nvlink_states(self, index: int) -> tuple[bool, ...] | NotRead:
        links = self._gpu(index).get("nvlink", NOT_SUPPORTED_TEXT)
        return UNSUPPORTED if links == NOT_SUPPORTED_TEXT or not links else tuple(links)

    def mig_enabled(self, index: int) -> bool | NotRead:
        return bool(self._gpu(index).get("mig", False))

    def register_xid_events(self) -> XidRegistration:
        gpus = self._current().gpus
        with self._lock:
            self._registered = True
        return XidRegistration(
            registered=tuple(gpu["uuid"] for gpu in gpus if not gpu.get("lost", False)),
            lost=tuple(gpu["uuid"] for gpu in gpus if gpu.get("lost", False)),
        )

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        """The next undelivered ``xid_events`` entry, looking at the file every ``POLL_SECONDS``
        until ``timeout_ms`` passed (then None, as NVML's timeout)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            scenario = self._current()
            with self._lock:
                if not self._registered:
                    raise XidEventsFailed("no simulated event set: register_xid_events() was not called")
                if scenario.xid_wait_fails:
                    raise XidEventsFailed("simulated nvmlEventSetWait failure (xid_wait_fails)")
                if self._delivered < len(scenario.xid_events):
                    entry = scenario.xid_events[self._delivered]
                    self._delivered += 1
                    return XidEvent(uuid=entry["uuid"], xid=entry["xid"])
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(POLL_SECONDS, left))
