"""NVML behind one small interface, so the rest of the agent never touches ``pynvml``.

The agent must fail closed on a GPU host (DESIGN.md, decision 9): every NVML failure becomes one
of two errors that say what went wrong, and nothing here ever invents a value. ``pynvml`` is
imported on first use, not at import, so a CPU-only node runs without it.

Health signals (issue 20): the reads behind per-GPU health (``GpuHealthProbe``). "Not supported"
is an explicit value (``UNSUPPORTED``), never an unhealthy one; ``NVML_ERROR_GPU_IS_LOST`` from any
call surfaces as ``GpuLost``, so the GPU is graded failed (reboot) and never confused with the rest.

Time bounds are not this module's job: ``preflight.py`` calls a probe from a daemon thread, because
a wedged driver can block any NVML call indefinitely.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from types import ModuleType
from typing import Any, Final, Protocol, runtime_checkable

_LIBRARY_HINT = (
    "libnvidia-ml.so.1 could not be loaded; on a container host, run with the NVIDIA Container "
    "Toolkit (--gpus all) so the host driver's library and /dev/nvidia* are injected"
)


class GpuError(Exception):
    """Base of every error a GPU probe raises; its message is safe to log (no secrets)."""


class NvmlUnavailable(GpuError):
    """NVML cannot be used at all: library missing, driver not loaded, or inventory unreadable."""


class TelemetryUnavailable(GpuError):
    """One GPU's telemetry could not be read; the message names the GPU index."""


class GpuLost(NvmlUnavailable, TelemetryUnavailable):
    """NVML answered ``NVML_ERROR_GPU_IS_LOST``: the GPU fell off the bus (failed, reboot). It
    subclasses both older errors, so callers written before health keep their behaviour."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class XidEventsFailed(GpuError):
    """Creating, registering or waiting on the NVML event set failed (a timeout is not a failure)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the inventory reports it (wire shape: ``schemas.GPU_INVENTORY``)."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    driver_version: str
    cuda_version: str

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuTelemetry:
    """One GPU's readings at one moment (wire shape: ``schemas.GPU_TELEMETRY``)."""

    index: int
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_celsius: float
    power_watts: float

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


class GpuProbe(Protocol):
    """What the agent needs from NVML. Implementations raise only ``GpuError`` subclasses."""

    def init(self) -> None:
        """Load and initialise NVML; raises ``NvmlUnavailable``."""

    def devices(self) -> list[GpuInfo]:
        """Every GPU NVML sees (possibly none); raises ``NvmlUnavailable``."""

    def telemetry(self, index: int) -> GpuTelemetry:
        """Current readings of GPU ``index``; raises ``TelemetryUnavailable``."""

    def shutdown(self) -> None:
        """Release NVML; callers treat it as best effort."""


# --- health signals (issue 20) ---------------------------------------------------------------------

#: nvmlReturn_t values (nvml.h; a stable ABI, so they are named here rather than read from pynvml).
NVML_SUCCESS: Final = 0
NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_GPU_IS_LOST: Final = 15

#: Field ids for ``nvmlDeviceGetFieldValues`` (nvml.h ``NVML_FI_DEV_*``).
FI_ECC_UNCORRECTED: Final = 4  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL: double-bit (uncorrected), volatile
FI_REMAPPED_PENDING: Final = 144  # NVML_FI_DEV_REMAPPED_PENDING
FI_REMAPPED_FAILURE: Final = 145  # NVML_FI_DEV_REMAPPED_FAILURE
#: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION. Older pynvml releases do not name it, so the number is
#: written here. Source: nvidia-ml-py 13.615.71 ``pynvml.py`` (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
#: = 230``, the field that replaces the deprecated 226/227 reset fields), matching NVIDIA's
#: k8s-test-infra mock NVML (``pkg/gpu/mocknvml``: ``healthGPURecoveryActionField = 230``).
FI_GPU_RECOVERY_ACTION: Final = 230
HEALTH_FIELD_IDS: Final = (FI_ECC_UNCORRECTED, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE, FI_GPU_RECOVERY_ACTION)

#: nvmlClocksEventReason* bits (the same bits as the older nvmlClocksThrottleReason*).
CLOCK_HW_SLOWDOWN: Final = 0x08
CLOCK_SW_THERMAL: Final = 0x20
CLOCK_HW_THERMAL: Final = 0x40
#: nvmlEventTypeXidCriticalError
EVENT_XID_CRITICAL: Final = 0x08
#: NVML_NVLINK_MAX_LINKS in current headers; the link loop also stops at the first refused link.
NVLINK_MAX_LINKS: Final = 36


class NotRead(Enum):
    """Why a health signal has no value; neither is unhealthy. ``UNSUPPORTED``: NOT_SUPPORTED,
    FunctionNotFound or a pynvml without the wrapper (consumer GPUs); ``FAILED``: any other error."""

    UNSUPPORTED = "not_supported"
    FAILED = "read_failed"


UNSUPPORTED: Final = NotRead.UNSUPPORTED
READ_FAILED: Final = NotRead.FAILED


@dataclass(frozen=True)
class HealthFields:
    """The field values read in one ``nvmlDeviceGetFieldValues`` batch, each decided by its own nvmlReturn."""

    ecc_uncorrected_volatile: int | NotRead
    remap_pending: bool | NotRead
    remap_failure: bool | NotRead
    recovery_action: int | NotRead

    @classmethod
    def every(cls, value: NotRead) -> HealthFields:
        return cls(value, value, value, value)


@dataclass(frozen=True)
class ClockEvents:
    """The clock-event reasons health cares about, from one reading of the reason bit mask."""

    hw_slowdown: bool
    hw_thermal: bool
    sw_thermal: bool

    @classmethod
    def from_mask(cls, mask: int) -> ClockEvents:
        return cls(bool(mask & CLOCK_HW_SLOWDOWN), bool(mask & CLOCK_HW_THERMAL), bool(mask & CLOCK_SW_THERMAL))


@dataclass(frozen=True)
class HealthSignals:
    """One GPU's health signals at one heartbeat. ``nvlink``: one entry per link, True when active."""

    fields: HealthFields
    clocks: ClockEvents | NotRead
    nvlink: tuple[bool, ...] | NotRead
    mig_enabled: bool | NotRead

    @classmethod
    def every(cls, value: NotRead) -> HealthSignals:
        return cls(HealthFields.every(value), value, value, value)


@dataclass(frozen=True)
class XidEvent:
    """One critical Xid NVML reported for one GPU."""

    uuid: str
    xid: int


@dataclass(frozen=True)
class XidRegistration:
    """What ``register_xid_events`` did per GPU (no event support is noted, not fatal); ``lost_indexes``
    answered GpuIsLost before their UUID could be read."""

    registered: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    lost_indexes: tuple[int, ...] = ()


@runtime_checkable
class GpuHealthProbe(GpuProbe, Protocol):
    """``GpuProbe`` plus the health reads. Each read returns ``NotRead`` for a signal it cannot
    give; only ``GpuLost`` (and ``TelemetryUnavailable`` when the GPU has no handle at all) raise.
    """

    def device_uuids(self) -> list[str]:
        """UUIDs of the GPUs NVML enumerates now, skipping those that answer GpuIsLost."""

    def health_fields(self, index: int) -> HealthFields: ...

    def clock_events(self, index: int) -> ClockEvents | NotRead: ...

    def nvlink_states(self, index: int) -> tuple[bool, ...] | NotRead: ...

    def mig_enabled(self, index: int) -> bool | NotRead: ...

    def register_xid_events(self) -> XidRegistration:
        """(Re)create the event set and register every GPU for critical Xids; raises ``XidEventsFailed``."""

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        """The next Xid, or None after ``timeout_ms``; raises ``XidEventsFailed`` on any other error."""


def read_health_signals(probe: GpuHealthProbe, index: int) -> HealthSignals:
    """Every health signal of GPU ``index``; raises ``GpuLost``, or ``TelemetryUnavailable``."""
    return HealthSignals(
        fields=probe.health_fields(index),
        clocks=probe.clock_events(index),
        nvlink=probe.nvlink_states(index),
        mig_enabled=probe.mig_enabled(index),
    )


def read_all_health_signals(probe: GpuHealthProbe, gpus: Sequence[GpuInfo]) -> dict[str, HealthSignals | GpuLost]:
    """Signals of each GPU by UUID: a lost GPU maps to its ``GpuLost``, a GPU without a handle to
    signals all ``READ_FAILED`` (graded unknown: never healthy, never failed)."""
    result: dict[str, HealthSignals | GpuLost] = {}
    for gpu in gpus:
        try:
            result[gpu.uuid] = read_health_signals(probe, gpu.index)
        except GpuLost as lost:
            result[gpu.uuid] = lost
        except GpuError:
            result[gpu.uuid] = HealthSignals.every(READ_FAILED)
    return result


def present_health_signals(
    probe: GpuHealthProbe, inventory: Sequence[GpuInfo]
) -> tuple[list[str], dict[str, HealthSignals | GpuLost]]:
    """One heartbeat's read: the UUIDs NVML enumerates now, and the signals of each inventory GPU
    present or lost (one absent from both is left out: graded missing). Raises ``NvmlUnavailable``."""
    present = probe.device_uuids()
    reads = read_all_health_signals(probe, inventory)
    kept = {uuid: read for uuid, read in reads.items() if uuid in present or isinstance(read, GpuLost)}
    return present, kept


def format_cuda_version(value: int) -> str:
    """NVML encodes the CUDA driver version as major*1000 + minor*10 (12080 -> "12.8")."""
    if value <= 0:
        raise ValueError(f"CUDA driver version {value} is not a valid NVML encoding")
    return f"{value // 1000}.{(value % 1000) // 10}"


def _text(value: str | bytes) -> str:
    """Older pynvml releases return ``bytes`` where newer ones return ``str``."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.strip()


def _describe(error: BaseException) -> str:
    """An NVML error's own text, falling back to its class name when the text is empty."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _error_code(error: BaseException) -> int | None:
    """An NVMLError's nvmlReturn_t value (None for anything that is not an NVML error)."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _raise_if_lost(error: BaseException, index: int | None, what: str) -> None:
    """Turn NVML_ERROR_GPU_IS_LOST, from any call, into ``GpuLost``."""
    if _error_code(error) == NVML_ERROR_GPU_IS_LOST:
        where = "a GPU" if index is None else f"GPU {index}"
        raise GpuLost(f"{where} is lost ({what}): {_describe(error)}", index) from error


def _not_read(error: BaseException, index: int, what: str) -> NotRead:
    """A failed health read: lost raises, unsupported (AttributeError: no pynvml wrapper) or other."""
    _raise_if_lost(error, index, what)
    if isinstance(error, AttributeError) or _error_code(error) in (
        NVML_ERROR_NOT_SUPPORTED,
        NVML_ERROR_FUNCTION_NOT_FOUND,
    ):
        return UNSUPPORTED
    return READ_FAILED


def _field_number(entry: Any) -> int | float:
    """A ``c_nvmlFieldValue_t``'s value, read by its ``valueType`` (nvmlValueType_t)."""
    member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[int(entry.valueType)]
    number: int | float = getattr(entry.value, member)
    return number


def _as_int(value: int | float | NotRead) -> int | NotRead:
    return value if isinstance(value, NotRead) else int(value)


def _handle_key(handle: Any) -> Any:
    """A hashable identity for an NVML device handle (a ctypes pointer, compared by address)."""
    if isinstance(handle, int | str):
        return handle
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class PynvmlProbe:
    """``GpuProbe`` on ``pynvml`` (the nvidia-ml-py package) and the host's libnvidia-ml."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._event_set: Any = None
        self._uuid_by_handle: dict[Any, str] = {}

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as error:
            raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {error}") from error
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as error:
            raise NvmlUnavailable(f"{_describe(error)}; {_LIBRARY_HINT}") from error
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(self._init_cause(pynvml, error)) from error
        except Exception as error:  # e.g. OSError from ctypes on a broken library
            raise NvmlUnavailable(f"nvmlInit failed: {_describe(error)}") from error
        self._nvml = pynvml

    @staticmethod
    def _init_cause(pynvml: ModuleType, error: Any) -> str:
        if getattr(error, "value", None) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            return f"{_describe(error)}; the NVIDIA kernel driver is not loaded on this host"
        return f"nvmlInit failed: {_describe(error)}"

    def _module(self) -> Any:
        if self._nvml is None:
            raise NvmlUnavailable("NVML is not initialised (init() was not called or failed)")
        return self._nvml

    def devices(self) -> list[GpuInfo]:
        nvml = self._module()
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = format_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as error:
            _raise_if_lost(error, None, "driver and device count")
            raise NvmlUnavailable(f"cannot read the NVIDIA driver and device count: {_describe(error)}") from error
        found = []
        for index in range(count):
            try:
                found.append(self._device(nvml, index, driver, cuda))
            except GpuLost:  # fell off the bus: not in the inventory (the control plane says missing)
                continue
        return found

    @staticmethod
    def _device(nvml: Any, index: int, driver: str, cuda: str) -> GpuInfo:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            return GpuInfo(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                driver_version=driver,
                cuda_version=cuda,
            )
        except Exception as error:
            _raise_if_lost(error, index, "inventory")
            raise NvmlUnavailable(f"cannot read the inventory of GPU {index}: {_describe(error)}") from error

    def telemetry(self, index: int) -> GpuTelemetry:
        try:
            nvml = self._module()
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            return GpuTelemetry(
                index=index,
                utilization_percent=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
                temperature_celsius=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                power_watts=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # NVML reports milliwatts
            )
        except Exception as error:
            _raise_if_lost(error, index, "telemetry")
            raise TelemetryUnavailable(f"cannot read telemetry of GPU {index}: {_describe(error)}") from error

    # --- health reads ---------------------------------------------------------------------------

    def _handle(self, index: int) -> Any:
        nvml = self._module()
        try:
            return nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as error:
            _raise_if_lost(error, index, "device handle")
            raise TelemetryUnavailable(f"cannot get a handle for GPU {index}: {_describe(error)}") from error

    def device_uuids(self) -> list[str]:
        nvml = self._module()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as error:
            raise NvmlUnavailable(f"cannot read the device count: {_describe(error)}") from error
        uuids = []
        for index in range(count):
            try:
                uuids.append(_text(nvml.nvmlDeviceGetUUID(self._handle(index))))
            except Exception as error:
                if isinstance(error, GpuLost) or _error_code(error) == NVML_ERROR_GPU_IS_LOST:
                    continue  # reported through its own health read
                raise NvmlUnavailable(f"cannot read the UUID of GPU {index}: {_describe(error)}") from error
        return uuids

    def health_fields(self, index: int) -> HealthFields:
        """One ``nvmlDeviceGetFieldValues`` batch; each value's own nvmlReturn decides it. Without the
        batch call (FunctionNotFound), single reads for ECC and row remapping; no recovery action."""
        nvml, handle = self._module(), self._handle(index)
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, list(HEALTH_FIELD_IDS))
        except Exception as error:
            if _not_read(error, index, "field values") is READ_FAILED:
                return HealthFields.every(READ_FAILED)
            return self._fields_one_by_one(nvml, handle, index)
        read = {field: self._field(values[position], index) for position, field in enumerate(HEALTH_FIELD_IDS)}
        pending, failure = read[FI_REMAPPED_PENDING], read[FI_REMAPPED_FAILURE]
        return HealthFields(
            ecc_uncorrected_volatile=_as_int(read[FI_ECC_UNCORRECTED]),
            remap_pending=pending if isinstance(pending, NotRead) else bool(pending),
            remap_failure=failure if isinstance(failure, NotRead) else bool(failure),
            recovery_action=_as_int(read[FI_GPU_RECOVERY_ACTION]),
        )

    @staticmethod
    def _field(entry: Any, index: int) -> int | float | NotRead:
        code = int(entry.nvmlReturn)
        if code == NVML_SUCCESS:
            return _field_number(entry)
        if code == NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"GPU {index} is lost (field {int(entry.fieldId)})", index)
        return UNSUPPORTED if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND) else READ_FAILED

    @staticmethod
    def _fields_one_by_one(nvml: Any, handle: Any, index: int) -> HealthFields:
        ecc: int | NotRead
        pending: bool | NotRead
        failure: bool | NotRead
        try:
            ecc = int(nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0))  # UNCORRECTED, VOLATILE_ECC
        except Exception as error:
            ecc = _not_read(error, index, "ECC errors")
        try:
            rows = nvml.nvmlDeviceGetRemappedRows(handle)  # (correctable, uncorrectable, pending, failure)
            pending, failure = bool(rows[2]), bool(rows[3])
        except Exception as error:
            pending = failure = _not_read(error, index, "remapped rows")
        return HealthFields(ecc, pending, failure, UNSUPPORTED)

    def clock_events(self, index: int) -> ClockEvents | NotRead:
        nvml, handle = self._module(), self._handle(index)
        try:
            return ClockEvents.from_mask(int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)))
        except Exception as error:
            if _not_read(error, index, "clock event reasons") is READ_FAILED:
                return READ_FAILED
        try:  # drivers before 535 name it throttle reasons
            return ClockEvents.from_mask(int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
        except Exception as error:
            return _not_read(error, index, "clock throttle reasons")

    def nvlink_states(self, index: int) -> tuple[bool, ...] | NotRead:
        """Each link's state in link order, until the first link NVML refuses (NOT_SUPPORTED or
        INVALID_ARGUMENT: past the last link). No link at all is ``UNSUPPORTED`` (a PCIe GPU)."""
        nvml, handle = self._module(), self._handle(index)
        states: list[bool] = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                states.append(int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == 1)  # NVML_FEATURE_ENABLED
            except Exception as error:
                if (
                    _error_code(error) == NVML_ERROR_INVALID_ARGUMENT
                    or _not_read(error, index, "NVLink") is UNSUPPORTED
                ):
                    break
                return READ_FAILED
        return tuple(states) if states else UNSUPPORTED

    def mig_enabled(self, index: int) -> bool | NotRead:
        nvml, handle = self._module(), self._handle(index)
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except Exception as error:
            return _not_read(error, index, "MIG mode")
        return int(current) == 1  # NVML_DEVICE_MIG_ENABLE

    # --- Xid events -------------------------------------------------------------------------------

    def register_xid_events(self) -> XidRegistration:
        nvml = self._module()
        self._free_event_set()
        try:
            self._event_set = nvml.nvmlEventSetCreate()
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as error:
            raise XidEventsFailed(f"cannot create the NVML event set: {_describe(error)}") from error
        outcome: dict[str, list[str]] = {"registered": [], "unsupported": [], "failed": [], "lost": []}
        lost_indexes: list[int] = []
        for index in range(count):
            try:
                handle = self._handle(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception as error:
                if isinstance(error, GpuLost) or _error_code(error) == NVML_ERROR_GPU_IS_LOST:
                    lost_indexes.append(index)
                    continue
                raise XidEventsFailed(f"cannot read GPU {index} to register events: {_describe(error)}") from error
            self._uuid_by_handle[_handle_key(handle)] = uuid
            outcome[self._register_one(nvml, handle, index)].append(uuid)
        return XidRegistration(
            registered=tuple(outcome["registered"]),
            unsupported=tuple(outcome["unsupported"]),
            failed=tuple(outcome["failed"]),
            lost=tuple(outcome["lost"]),
            lost_indexes=tuple(lost_indexes),
        )

    def _register_one(self, nvml: Any, handle: Any, index: int) -> str:
        try:
            nvml.nvmlDeviceRegisterEvents(handle, EVENT_XID_CRITICAL, self._event_set)
        except Exception as error:
            if _error_code(error) == NVML_ERROR_GPU_IS_LOST:
                return "lost"
            return "unsupported" if _not_read(error, index, "event registration") is UNSUPPORTED else "failed"
        return "registered"

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        nvml = self._module()
        if self._event_set is None:
            raise XidEventsFailed("no NVML event set: register_xid_events() was not called or failed")
        try:
            data = nvml.nvmlEventSetWait(self._event_set, timeout_ms)
        except Exception as error:
            if _error_code(error) == NVML_ERROR_TIMEOUT:
                return None
            raise XidEventsFailed(f"waiting for NVML events failed: {_describe(error)}") from error
        if not int(data.eventType) & EVENT_XID_CRITICAL:
            return None
        uuid = self._uuid_by_handle.get(_handle_key(data.device))
        if uuid is None:
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except Exception as error:
                raise XidEventsFailed(
                    f"an Xid event names a GPU whose UUID is unreadable: {_describe(error)}"
                ) from error
        return XidEvent(uuid=uuid, xid=int(data.eventData))

    def _free_event_set(self) -> None:
        event_set, self._event_set = self._event_set, None
        self._uuid_by_handle.clear()
        if event_set is None or self._nvml is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except Exception:  # best effort: the set is being replaced or NVML is shutting down
            return

    def shutdown(self) -> None:
        self._free_event_set()
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        try:
            nvml.nvmlShutdown()
        except Exception as error:
            raise NvmlUnavailable(f"nvmlShutdown failed: {_describe(error)}") from error
