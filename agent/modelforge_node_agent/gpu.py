"""NVML behind one small interface, so the rest of the agent never touches ``pynvml``.

The agent must fail closed on a GPU host (DESIGN.md, decision 9): every NVML failure becomes one
of two errors that say what went wrong, and nothing here ever invents a value. ``pynvml`` is
imported on first use, not at import, so a CPU-only node runs without it.

Time bounds are not this module's job: ``preflight.py`` calls a probe from a daemon thread, because
a wedged driver can block any NVML call indefinitely.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, Protocol

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


class PynvmlProbe:
    """``GpuProbe`` on ``pynvml`` (the nvidia-ml-py package) and the host's libnvidia-ml."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None

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
            raise NvmlUnavailable(f"cannot read the NVIDIA driver and device count: {_describe(error)}") from error
        return [self._device(nvml, index, driver, cuda) for index in range(count)]

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
            raise TelemetryUnavailable(f"cannot read telemetry of GPU {index}: {_describe(error)}") from error

    def shutdown(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        try:
            nvml.nvmlShutdown()
        except Exception as error:
            raise NvmlUnavailable(f"nvmlShutdown failed: {_describe(error)}") from error
