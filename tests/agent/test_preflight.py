"""The NVIDIA preflight: each failure code, the three modes, the time bound, the wire shapes, and
the real NVML library path on a machine without a GPU."""

from __future__ import annotations

import json
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from modelforge_node_agent.bounded_call import close_probe
from modelforge_node_agent.gpu import (
    GpuInfo,
    GpuTelemetry,
    NvmlUnavailable,
    PynvmlProbe,
    TelemetryUnavailable,
    format_cuda_version,
)
from modelforge_node_agent.gpu_source import read_telemetry
from modelforge_node_agent.preflight import (
    DEVICE_NOT_FOUND,
    NVML_UNAVAILABLE,
    PREFLIGHT_CODES,
    TELEMETRY_UNAVAILABLE,
    PreflightFailed,
    PreflightResult,
    nvidia_observed,
    open_probe,
    run_preflight,
)
from modelforge_protocol.schemas import GPU_INVENTORY, GPU_TELEMETRY

from tests.support.polling import wait_until

GIB = 1024**3
#: How long a hanging fake blocks at most, so a forgotten release cannot keep a thread forever.
HANG_LIMIT_SECONDS = 30.0
NO_GPU_ENV: dict[str, str] = {}


def gpu_info(index: int) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08d}-1234-5678-9abc-def012345678",
        name="NVIDIA H200",
        memory_total_bytes=141 * GIB,
        driver_version="570.124.06",
        cuda_version="12.8",
    )


def gpu_reading(index: int) -> GpuTelemetry:
    return GpuTelemetry(
        index=index,
        utilization_percent=37.0,
        memory_used_bytes=3 * GIB,
        memory_total_bytes=141 * GIB,
        temperature_celsius=41.0,
        power_watts=118.5,
    )


class FakeProbe:
    """A GpuProbe whose failures and hangs are chosen by the test; it records what was called."""

    def __init__(
        self,
        *,
        gpu_count: int = 2,
        init_error: Exception | None = None,
        telemetry_fails_for: tuple[int, ...] = (),
        hang_in: str | None = None,
    ) -> None:
        self.gpu_count = gpu_count
        self.init_error = init_error
        self.telemetry_fails_for = telemetry_fails_for
        self.hang_in = hang_in
        self.release = threading.Event()
        self.calls: list[str] = []
        self.shut_down = threading.Event()

    def _maybe_hang(self, step: str) -> None:
        self.calls.append(step)
        if self.hang_in == step:
            self.release.wait(HANG_LIMIT_SECONDS)

    def init(self) -> None:
        self._maybe_hang("init")
        if self.init_error is not None:
            raise self.init_error

    def devices(self) -> list[GpuInfo]:
        self._maybe_hang("devices")
        return [gpu_info(index) for index in range(self.gpu_count)]

    def telemetry(self, index: int) -> GpuTelemetry:
        self._maybe_hang("telemetry")
        if index in self.telemetry_fails_for:
            raise TelemetryUnavailable(f"cannot read telemetry of GPU {index}: NVMLError_Unknown: Unknown Error")
        return gpu_reading(index)

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.shut_down.set()


@pytest.fixture()
def hanging_probes() -> Iterator[list[FakeProbe]]:
    """Probes registered here are released at the end of the test, so no thread outlives it long."""
    probes: list[FakeProbe] = []
    yield probes
    for probe in probes:
        probe.release.set()


def nvidia(probe: FakeProbe, **kwargs: Any) -> PreflightResult:
    return run_preflight("nvidia", lambda: probe, environ=NO_GPU_ENV, **kwargs)


def failure_of(call: Any) -> PreflightFailed:
    with pytest.raises(PreflightFailed) as caught:
        call()
    return caught.value


# --- nvidia mode ---------------------------------------------------------------------------------


def test_run_preflight_nvidia_with_gpus_returns_inventory_and_telemetry_for_each() -> None:
    probe = FakeProbe(gpu_count=2)
    result = nvidia(probe)
    assert result.mode == "nvidia" and result.nvml_used
    assert [gpu.index for gpu in result.gpus] == [0, 1]
    assert [reading.index for reading in result.telemetry] == [0, 1]


def test_run_preflight_nvidia_success_shuts_probe_down() -> None:
    probe = FakeProbe()
    nvidia(probe)
    assert probe.calls[0] == "init" and probe.calls[-1] == "shutdown"


def test_run_preflight_nvidia_init_fails_raises_nvml_unavailable_with_cause() -> None:
    probe = FakeProbe(init_error=NvmlUnavailable("NVMLError_LibraryNotFound: NVML Shared Library Not Found"))
    failure = failure_of(lambda: nvidia(probe))
    assert failure.code == NVML_UNAVAILABLE
    assert "LibraryNotFound" in failure.cause
    assert str(failure) == f"{NVML_UNAVAILABLE}: {failure.cause}"
    assert "shutdown" not in probe.calls  # init never succeeded


def test_run_preflight_nvidia_factory_fails_raises_nvml_unavailable() -> None:
    def factory() -> FakeProbe:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    failure = failure_of(lambda: run_preflight("nvidia", factory, environ=NO_GPU_ENV))
    assert failure.code == NVML_UNAVAILABLE and "libnvidia-ml.so.1" in failure.cause


def test_run_preflight_nvidia_zero_devices_raises_device_not_found_and_shuts_down() -> None:
    probe = FakeProbe(gpu_count=0)
    failure = failure_of(lambda: nvidia(probe))
    assert failure.code == DEVICE_NOT_FOUND
    assert probe.shut_down.is_set()


def test_run_preflight_nvidia_one_gpu_without_telemetry_raises_telemetry_unavailable_naming_it() -> None:
    probe = FakeProbe(gpu_count=3, telemetry_fails_for=(1,))
    failure = failure_of(lambda: nvidia(probe))
    assert failure.code == TELEMETRY_UNAVAILABLE
    assert "GPU 1" in failure.cause
    assert probe.shut_down.is_set()


def test_run_preflight_nvidia_unexpected_device_error_raises_nvml_unavailable() -> None:
    probe = FakeProbe()
    probe.devices = lambda: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
    failure = failure_of(lambda: nvidia(probe))
    assert failure.code == NVML_UNAVAILABLE and "RuntimeError" in failure.cause


def test_run_preflight_nvidia_mislabelled_telemetry_raises_telemetry_unavailable() -> None:
    probe = FakeProbe(gpu_count=2)
    probe.telemetry = lambda index: gpu_reading(0)  # type: ignore[method-assign]
    failure = failure_of(lambda: nvidia(probe))
    assert failure.code == TELEMETRY_UNAVAILABLE and "GPU 1" in failure.cause


# --- the time bound ------------------------------------------------------------------------------


def test_run_preflight_init_hangs_fails_with_nvml_unavailable_within_timeout(hanging_probes: list[FakeProbe]) -> None:
    probe = FakeProbe(hang_in="init")
    hanging_probes.append(probe)
    started = time.monotonic()
    failure = failure_of(lambda: nvidia(probe, timeout_seconds=0.2))
    assert time.monotonic() - started < 5
    assert failure.code == NVML_UNAVAILABLE
    assert "did not answer within 0.2 s" in failure.cause


def test_run_preflight_abandoned_probe_answering_late_is_shut_down(hanging_probes: list[FakeProbe]) -> None:
    probe = FakeProbe(hang_in="init")
    hanging_probes.append(probe)
    failure_of(lambda: nvidia(probe, timeout_seconds=0.2))
    assert not probe.shut_down.is_set()
    probe.release.set()  # the driver answers after all
    assert probe.shut_down.wait(timeout=5), "a late-initialised probe must still be shut down"


def test_run_preflight_telemetry_hangs_fails_with_telemetry_unavailable(hanging_probes: list[FakeProbe]) -> None:
    probe = FakeProbe(hang_in="telemetry")
    hanging_probes.append(probe)
    started = time.monotonic()
    failure = failure_of(lambda: nvidia(probe, timeout_seconds=0.2))
    assert time.monotonic() - started < 5
    assert failure.code == TELEMETRY_UNAVAILABLE and "GPU 0" in failure.cause


def test_run_preflight_nonpositive_timeout_is_refused() -> None:
    with pytest.raises(ValueError):
        nvidia(FakeProbe(), timeout_seconds=0)


# --- cpu and auto --------------------------------------------------------------------------------


def never_called() -> FakeProbe:
    raise AssertionError("the probe factory must not be called")


def test_run_preflight_cpu_never_calls_probe_factory_even_with_gpus_present(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").touch()
    result = run_preflight("cpu", never_called, environ={"NVIDIA_VISIBLE_DEVICES": "all"}, dev_dir=tmp_path)
    assert result == PreflightResult(mode="cpu", nvml_used=False, gpus=[], telemetry=[])


def test_run_preflight_auto_with_device_node_requires_nvml(tmp_path: Path) -> None:
    (tmp_path / "nvidia0").touch()
    failing = FakeProbe(init_error=NvmlUnavailable("NVMLError_DriverNotLoaded: Driver Not Loaded"))
    failure = failure_of(lambda: run_preflight("auto", lambda: failing, environ=NO_GPU_ENV, dev_dir=tmp_path))
    assert failure.code == NVML_UNAVAILABLE
    result = run_preflight("auto", lambda: FakeProbe(gpu_count=1), environ=NO_GPU_ENV, dev_dir=tmp_path)
    assert result.nvml_used and len(result.gpus) == 1


def test_run_preflight_auto_with_visible_devices_and_no_gpus_raises_device_not_found(tmp_path: Path) -> None:
    probe = FakeProbe(gpu_count=0)
    failure = failure_of(
        lambda: run_preflight("auto", lambda: probe, environ={"NVIDIA_VISIBLE_DEVICES": "all"}, dev_dir=tmp_path)
    )
    assert failure.code == DEVICE_NOT_FOUND


def test_run_preflight_auto_without_nvidia_signs_behaves_like_cpu(tmp_path: Path) -> None:
    (tmp_path / "nvidia-uvm").touch()  # a driver helper node without a GPU is no GPU
    result = run_preflight("auto", never_called, environ={"NVIDIA_VISIBLE_DEVICES": "void"}, dev_dir=tmp_path)
    assert result.mode == "auto" and not result.nvml_used and result.gpus == []


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, False),
        ("", False),
        ("void", False),
        ("none", False),
        (" NONE ", False),
        ("all", True),
        ("0", True),
        ("0,1", True),
        ("GPU-8f3c2f4e-1111-2222-3333-444455556666", True),
    ],
)
def test_nvidia_observed_visible_devices_variants_decide(tmp_path: Path, visible: str | None, expected: bool) -> None:
    environ = {} if visible is None else {"NVIDIA_VISIBLE_DEVICES": visible}
    assert nvidia_observed(environ, tmp_path) is expected


@pytest.mark.parametrize(
    ("device", "expected"),
    [("nvidia0", True), ("nvidia12", True), ("nvidiactl", True), ("nvidia-modeset", False), ("nvidia-caps", False)],
)
def test_nvidia_observed_device_nodes_decide(tmp_path: Path, device: str, expected: bool) -> None:
    (tmp_path / device).touch()
    assert nvidia_observed({}, tmp_path) is expected


def test_nvidia_observed_missing_dev_dir_is_false(tmp_path: Path) -> None:
    assert nvidia_observed({}, tmp_path / "absent") is False


def test_run_preflight_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        run_preflight("gpu", never_called, environ=NO_GPU_ENV)


# --- an open probe for the agent's lifetime ------------------------------------------------------


def test_open_probe_success_leaves_probe_initialised_until_closed() -> None:
    fake = FakeProbe(gpu_count=2)
    probe, result = open_probe("nvidia", lambda: fake, environ=NO_GPU_ENV)
    assert probe is fake and not fake.shut_down.is_set()
    assert read_telemetry(fake, result.gpus, timeout_seconds=5) == [gpu_reading(0), gpu_reading(1)]
    close_probe(probe)
    assert fake.shut_down.is_set()


def test_open_probe_cpu_returns_no_probe() -> None:
    probe, result = open_probe("cpu", never_called, environ=NO_GPU_ENV)
    assert probe is None and not result.nvml_used
    close_probe(probe)  # closing "no probe" is harmless


def test_read_telemetry_one_gpu_failing_raises_telemetry_unavailable_naming_it() -> None:
    fake = FakeProbe(telemetry_fails_for=(1,))
    failure = failure_of(lambda: read_telemetry(fake, [gpu_info(0), gpu_info(1)], timeout_seconds=5))
    assert failure.code == TELEMETRY_UNAVAILABLE and "GPU 1" in failure.cause


def test_read_telemetry_hang_fails_within_timeout_and_next_call_fails_at_once(hanging_probes: list[FakeProbe]) -> None:
    fake = FakeProbe(hang_in="telemetry")
    hanging_probes.append(fake)
    started = time.monotonic()
    failure = failure_of(lambda: read_telemetry(fake, [gpu_info(0)], timeout_seconds=0.2))
    assert time.monotonic() - started < 5
    assert failure.code == TELEMETRY_UNAVAILABLE and "0.2 s" in failure.cause
    again = failure_of(lambda: read_telemetry(fake, [gpu_info(0)], timeout_seconds=0.2))
    assert "still not returned" in again.cause


def test_read_telemetry_after_stuck_call_returns_reads_again(hanging_probes: list[FakeProbe]) -> None:
    fake = FakeProbe(hang_in="telemetry")
    hanging_probes.append(fake)
    failure_of(lambda: read_telemetry(fake, [gpu_info(0)], timeout_seconds=0.2))
    fake.hang_in = None
    fake.release.set()

    def reads_again() -> bool:
        try:
            return read_telemetry(fake, [gpu_info(0)], timeout_seconds=1) == [gpu_reading(0)]
        except PreflightFailed:
            return False  # the stuck call has not drained yet

    wait_until(reads_again, 5, "the drained probe to read again", interval=0.01)


def test_read_telemetry_no_gpus_returns_empty_without_calling_probe() -> None:
    fake = FakeProbe()
    assert read_telemetry(fake, [], timeout_seconds=1) == []
    assert fake.calls == []


# --- wire shapes and text ------------------------------------------------------------------------


def test_gpu_info_to_wire_matches_gpu_inventory_schema() -> None:
    wire = gpu_info(3).to_wire()
    jsonschema.validate(wire, GPU_INVENTORY)
    assert set(wire) == set(GPU_INVENTORY["properties"])


def test_gpu_telemetry_to_wire_matches_gpu_telemetry_schema() -> None:
    wire = gpu_reading(3).to_wire()
    jsonschema.validate(wire, GPU_TELEMETRY)
    assert set(wire) == set(GPU_TELEMETRY["properties"])


def test_preflight_result_to_wire_is_json_with_valid_gpus() -> None:
    wire = json.loads(json.dumps(nvidia(FakeProbe(gpu_count=2)).to_wire()))
    assert wire["mode"] == "nvidia" and wire["nvml_used"] is True
    for gpu in wire["gpus"]:
        jsonschema.validate(gpu, GPU_INVENTORY)
    for reading in wire["telemetry"]:
        jsonschema.validate(reading, GPU_TELEMETRY)


def test_preflight_result_as_text_nvidia_lists_every_column() -> None:
    text = nvidia(FakeProbe(gpu_count=1)).as_text()
    for expected in (
        gpu_info(0).uuid,
        "NVIDIA H200",
        "141.0 GiB",
        "570.124.06",
        "12.8",
        "37%",
        "3.0 GiB",
        "41 C",
        "118.5 W",
    ):
        assert expected in text


def test_preflight_result_as_text_cpu_says_no_gpus_used() -> None:
    text = run_preflight("cpu", never_called, environ=NO_GPU_ENV).as_text()
    assert "no NVIDIA GPUs are required or used" in text


def test_preflight_failed_unknown_code_is_refused() -> None:
    assert PREFLIGHT_CODES == (NVML_UNAVAILABLE, DEVICE_NOT_FOUND, TELEMETRY_UNAVAILABLE)
    with pytest.raises(ValueError):
        PreflightFailed("NVIDIA_SOMETHING_ELSE", "x")


# --- PynvmlProbe on a stand-in pynvml module -----------------------------------------------------


class FakeNvmlError(Exception):
    def __init__(self, value: int, text: str = "Unknown Error") -> None:
        super().__init__(text)
        self.value = value


class FakeLibraryNotFound(FakeNvmlError):
    pass


def fake_pynvml(
    *, init_error: Exception | None = None, byte_strings: bool = True, power_fails_for: int | None = None
) -> types.ModuleType:
    """Just enough of pynvml's surface, returning bytes like releases before 11.5 did."""

    def text(value: str) -> str | bytes:
        return value.encode() if byte_strings else value

    def power(handle: int) -> int:
        if handle == power_fails_for:
            raise FakeNvmlError(3, "Not Supported")
        return 118_500

    def init() -> None:
        if init_error is not None:
            raise init_error

    module = types.ModuleType("pynvml")
    module.__dict__.update(
        NVMLError=FakeNvmlError,
        NVMLError_LibraryNotFound=FakeLibraryNotFound,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: text("570.124.06"),
        nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetUUID=lambda handle: text(gpu_info(handle).uuid),
        nvmlDeviceGetName=lambda handle: text("NVIDIA H200"),
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=141 * GIB, used=3 * GIB, free=138 * GIB),
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=37, memory=5),
        nvmlDeviceGetTemperature=lambda handle, sensor: 41,
        nvmlDeviceGetPowerUsage=power,
    )
    return module


@pytest.mark.parametrize("byte_strings", [True, False])
def test_pynvml_probe_bytes_or_str_returns_give_same_inventory(
    monkeypatch: pytest.MonkeyPatch, byte_strings: bool
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(byte_strings=byte_strings))
    probe = PynvmlProbe()
    probe.init()
    assert probe.devices() == [gpu_info(0), gpu_info(1)]
    assert probe.telemetry(1) == gpu_reading(1)  # 118500 mW -> 118.5 W
    probe.shutdown()


def test_pynvml_probe_power_unsupported_raises_telemetry_unavailable_naming_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(power_fails_for=1))
    probe = PynvmlProbe()
    probe.init()
    with pytest.raises(TelemetryUnavailable, match="GPU 1.*Not Supported"):
        probe.telemetry(1)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FakeLibraryNotFound(12, "NVML Shared Library Not Found"), "--gpus all"),
        (FakeNvmlError(9, "Driver Not Loaded"), "kernel driver is not loaded"),
        (FakeNvmlError(4, "Insufficient Permissions"), "nvmlInit failed"),
    ],
)
def test_pynvml_probe_init_errors_raise_nvml_unavailable_with_cause(
    monkeypatch: pytest.MonkeyPatch, error: Exception, expected: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=error))
    with pytest.raises(NvmlUnavailable, match=expected):
        PynvmlProbe().init()


def test_pynvml_probe_devices_before_init_raises_nvml_unavailable() -> None:
    with pytest.raises(NvmlUnavailable):
        PynvmlProbe().devices()


@pytest.mark.parametrize(("encoded", "text"), [(12080, "12.8"), (12020, "12.2"), (11040, "11.4"), (13000, "13.0")])
def test_format_cuda_version_nvml_encoding_gives_major_minor(encoded: int, text: str) -> None:
    assert format_cuda_version(encoded) == text


# --- the real library on this machine ------------------------------------------------------------


def real_gpu_present() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_run_preflight_real_nvml_without_gpu_raises_nvml_unavailable() -> None:
    if real_gpu_present():
        pytest.skip("a real NVIDIA GPU answers here; this test covers hosts without one")
    failure = failure_of(lambda: run_preflight("nvidia"))
    assert failure.code == NVML_UNAVAILABLE
    assert failure.cause  # says why, e.g. the library was not found
