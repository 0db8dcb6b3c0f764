"""``PynvmlProbe``'s health reads on a stand-in ``pynvml`` module: scripted answers and return codes.

The stand-in raises the real library's error classes and returns its real ctypes structures
(``c_nvmlFieldValue_t``), so the mapping is tested against what nvidia-ml-py gives on a host:
NOT_SUPPORTED and FunctionNotFound are unsupported, GpuIsLost from any call is ``GpuLost``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pynvml
import pytest
from modelforge_node_agent.gpu import (
    READ_FAILED,
    UNSUPPORTED,
    ClockEvents,
    GpuInfo,
    GpuLost,
    HealthFields,
    HealthSignals,
    PynvmlProbe,
    TelemetryUnavailable,
    XidEvent,
    XidEventsFailed,
    read_all_health_signals,
)

UUIDS = ["GPU-5e1a0000-0000-4000-8000-000000000001", "GPU-5e1a0000-0000-4000-8000-000000000002"]
LOST = pynvml.NVMLError_GpuIsLost
NOT_SUPPORTED = pynvml.NVMLError_NotSupported
FUNCTION_NOT_FOUND = pynvml.NVMLError_FunctionNotFound


def field_values(*entries: tuple[int, int, int]) -> Any:
    """A real ``c_nvmlFieldValue_t`` array: each entry is (nvmlReturn, valueType, value)."""
    array = (pynvml.c_nvmlFieldValue_t * len(entries))()
    members = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    for slot, (code, value_type, value) in zip(array, entries, strict=True):
        slot.nvmlReturn, slot.valueType = code, value_type
        setattr(slot.value, members[value_type], value)
    return array


def raising(error: Exception) -> Callable[..., Any]:
    def call(*_args: Any) -> Any:
        raise error

    return call


def stand_in(**overrides: Any) -> types.ModuleType:
    """Two healthy GPUs (handles 0 and 1); ``overrides`` replace any function by name."""
    module = types.ModuleType("pynvml")
    module.__dict__.update(
        NVMLError=pynvml.NVMLError,
        NVMLError_LibraryNotFound=pynvml.NVMLError_LibraryNotFound,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "570.124.06",
        nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetUUID=lambda handle: UUIDS[handle],
        nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=80, used=1, free=79),
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=5, memory=1),
        nvmlDeviceGetTemperature=lambda handle, sensor: 40,
        nvmlDeviceGetPowerUsage=lambda handle: 100_000,
        nvmlDeviceGetFieldValues=lambda handle, ids: field_values((0, 3, 0), (0, 1, 0), (0, 1, 0), (0, 1, 0)),
        nvmlDeviceGetCurrentClocksEventReasons=lambda handle: 0x1,  # idle
        nvmlDeviceGetNvLinkState=lambda handle, link: 1 if link < 4 else raising(pynvml.NVMLError(2))(),
        nvmlDeviceGetMigMode=lambda handle: [0, 0],
        nvmlEventSetCreate=lambda: "event-set",
        nvmlEventSetFree=lambda event_set: None,
        nvmlDeviceRegisterEvents=lambda handle, types_, event_set: None,
        nvmlEventSetWait=raising(pynvml.NVMLError_Timeout()),
    )
    module.__dict__.update(overrides)
    return module


def probe_on(monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> PynvmlProbe:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in(**overrides))
    probe = PynvmlProbe()
    probe.init()
    return probe


# --- field values --------------------------------------------------------------------------------


def test_health_fields_batch_decodes_each_value_by_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = field_values((0, 3, 2), (0, 1, 1), (0, 1, 0), (0, 1, 4))  # ECC 2 (ull), pending, no failure, action 4
    probe = probe_on(monkeypatch, nvmlDeviceGetFieldValues=lambda handle, ids: batch)
    assert probe.health_fields(0) == HealthFields(2, True, False, 4)


def test_health_fields_asks_for_the_four_field_ids_including_recovery_action_230(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[int]] = []

    def values(handle: int, ids: list[int]) -> Any:
        asked.append(ids)
        return field_values(*[(0, 1, 0)] * len(ids))

    probe_on(monkeypatch, nvmlDeviceGetFieldValues=values).health_fields(1)
    assert asked == [[4, 144, 145, 230]]


def test_health_fields_per_value_not_supported_is_unsupported_and_other_codes_read_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = field_values((3, 3, 0), (13, 1, 0), (4, 1, 0), (3, 1, 0))  # NOT_SUPPORTED, FNF, NO_PERMISSION, NS
    probe = probe_on(monkeypatch, nvmlDeviceGetFieldValues=lambda handle, ids: batch)
    assert probe.health_fields(0) == HealthFields(UNSUPPORTED, UNSUPPORTED, READ_FAILED, UNSUPPORTED)


def test_health_fields_per_value_gpu_is_lost_raises_gpu_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = field_values((0, 3, 0), (15, 1, 0), (0, 1, 0), (0, 1, 0))
    probe = probe_on(monkeypatch, nvmlDeviceGetFieldValues=lambda handle, ids: batch)
    with pytest.raises(GpuLost) as lost:
        probe.health_fields(1)
    assert lost.value.index == 1


def test_health_fields_without_batch_call_falls_back_to_single_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(
        monkeypatch,
        nvmlDeviceGetFieldValues=raising(FUNCTION_NOT_FOUND()),
        nvmlDeviceGetTotalEccErrors=lambda handle, kind, counter: 3 if (kind, counter) == (1, 0) else -1,
        nvmlDeviceGetRemappedRows=lambda handle: (0, 1, 1, 0),
    )
    assert probe.health_fields(0) == HealthFields(3, True, False, UNSUPPORTED)


def test_health_fields_old_pynvml_without_any_wrapper_is_all_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    module = stand_in()
    del module.__dict__["nvmlDeviceGetFieldValues"]  # AttributeError: a pynvml release without the wrapper
    monkeypatch.setitem(sys.modules, "pynvml", module)
    probe = PynvmlProbe()
    probe.init()
    assert probe.health_fields(0) == HealthFields.every(UNSUPPORTED)


def test_health_fields_batch_unknown_error_is_read_failed_not_invented(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(monkeypatch, nvmlDeviceGetFieldValues=raising(pynvml.NVMLError_Unknown()))
    assert probe.health_fields(0) == HealthFields.every(READ_FAILED)


def test_health_fields_batch_gpu_is_lost_raises_gpu_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(monkeypatch, nvmlDeviceGetFieldValues=raising(LOST()))
    with pytest.raises(GpuLost):
        probe.health_fields(0)


# --- clocks, NVLink, MIG ---------------------------------------------------------------------------


def test_clock_events_reads_hw_slowdown_and_thermal_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(monkeypatch, nvmlDeviceGetCurrentClocksEventReasons=lambda handle: 0x08 | 0x40 | 0x04)
    assert probe.clock_events(0) == ClockEvents(hw_slowdown=True, hw_thermal=True, sw_thermal=False)


def test_clock_events_old_driver_falls_back_to_throttle_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(
        monkeypatch,
        nvmlDeviceGetCurrentClocksEventReasons=raising(FUNCTION_NOT_FOUND()),
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda handle: 0x20,
    )
    assert probe.clock_events(0) == ClockEvents(hw_slowdown=False, hw_thermal=False, sw_thermal=True)


@pytest.mark.parametrize(
    ("error", "expected"), [(NOT_SUPPORTED(), UNSUPPORTED), (pynvml.NVMLError_NoPermission(), READ_FAILED)]
)
def test_clock_events_refused_is_unsupported_or_read_failed(
    monkeypatch: pytest.MonkeyPatch, error: Exception, expected: object
) -> None:
    probe = probe_on(
        monkeypatch,
        nvmlDeviceGetCurrentClocksEventReasons=raising(error),
        nvmlDeviceGetCurrentClocksThrottleReasons=raising(error),
    )
    assert probe.clock_events(0) is expected


def test_nvlink_states_reads_links_until_invalid_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    states = {0: 1, 1: 0, 2: 1}

    def link_state(handle: int, link: int) -> int:
        if link in states:
            return states[link]
        raise pynvml.NVMLError_InvalidArgument()

    assert probe_on(monkeypatch, nvmlDeviceGetNvLinkState=link_state).nvlink_states(0) == (True, False, True)


def test_nvlink_states_pcie_gpu_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(monkeypatch, nvmlDeviceGetNvLinkState=raising(NOT_SUPPORTED()))
    assert probe.nvlink_states(0) is UNSUPPORTED


def test_nvlink_states_unknown_error_is_read_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(monkeypatch, nvmlDeviceGetNvLinkState=raising(pynvml.NVMLError_Unknown()))
    assert probe.nvlink_states(0) is READ_FAILED


@pytest.mark.parametrize(
    ("answer", "expected"), [([1, 1], True), ([0, 1], False), (NOT_SUPPORTED(), UNSUPPORTED)], ids=["on", "off", "ns"]
)
def test_mig_enabled_is_current_mode(monkeypatch: pytest.MonkeyPatch, answer: Any, expected: object) -> None:
    call = raising(answer) if isinstance(answer, Exception) else (lambda handle: answer)
    assert probe_on(monkeypatch, nvmlDeviceGetMigMode=call).mig_enabled(0) == expected


@pytest.mark.parametrize(
    "name",
    [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetHandleByIndex",
    ],
)
def test_any_health_read_gpu_is_lost_raises_gpu_lost(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    probe = probe_on(monkeypatch, **{name: raising(LOST())})
    read = {
        "nvmlDeviceGetCurrentClocksEventReasons": probe.clock_events,
        "nvmlDeviceGetNvLinkState": probe.nvlink_states,
        "nvmlDeviceGetMigMode": probe.mig_enabled,
        "nvmlDeviceGetHandleByIndex": probe.health_fields,
    }[name]
    with pytest.raises(GpuLost):
        read(0)


def test_telemetry_and_inventory_gpu_is_lost_raise_gpu_lost_that_old_callers_still_catch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = probe_on(monkeypatch, nvmlDeviceGetPowerUsage=raising(LOST()), nvmlDeviceGetName=raising(LOST()))
    with pytest.raises(GpuLost) as telemetry_lost:
        probe.telemetry(1)
    assert isinstance(telemetry_lost.value, TelemetryUnavailable)
    # a GPU whose inventory answers GpuIsLost is left out of it (the control plane says missing),
    # and the others are listed
    assert probe.devices() == []


def test_inventory_leaves_out_only_the_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    names = iter(["NVIDIA H200", LOST(), "NVIDIA H200"])

    def name(handle: object) -> str:
        value = next(names)
        if isinstance(value, Exception):
            raise value
        return value

    uuids = [*UUIDS, UUIDS[0].replace("0", "9")]
    probe = probe_on(
        monkeypatch,
        nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetName=name,
        nvmlDeviceGetUUID=lambda handle: uuids[handle],
    )
    assert [gpu.index for gpu in probe.devices()] == [0, 2]


def test_device_uuids_skips_a_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def uuid(handle: int) -> str:
        if handle == 0:
            raise LOST()
        return UUIDS[handle]

    assert probe_on(monkeypatch, nvmlDeviceGetUUID=uuid).device_uuids() == [UUIDS[1]]


def test_read_all_health_signals_maps_lost_and_handleless_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    def handle(index: int) -> int:
        if index == 0:
            raise LOST()
        if index == 2:
            raise pynvml.NVMLError_Unknown()
        return index

    probe = probe_on(monkeypatch, nvmlDeviceGetHandleByIndex=handle)
    gpus = [GpuInfo(i, f"GPU-5e1a0000-0000-4000-8000-00000000000{i}", "H100", 80, "570", "12.8") for i in range(3)]
    signals = read_all_health_signals(probe, gpus)
    assert isinstance(signals[gpus[0].uuid], GpuLost)
    assert signals[gpus[1].uuid] == HealthSignals(
        HealthFields(0, False, False, 0), ClockEvents(False, False, False), (True,) * 4, False
    )
    assert signals[gpus[2].uuid] == HealthSignals.every(READ_FAILED)


# --- Xid events ------------------------------------------------------------------------------------


def event(handle: int, xid: int, event_type: int = 0x08) -> Any:
    return types.SimpleNamespace(device=handle, eventType=event_type, eventData=xid)


def test_register_xid_events_notes_unsupported_and_lost_gpus_without_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def register(handle: int, event_types: int, event_set: Any) -> None:
        assert event_types == 0x08  # nvmlEventTypeXidCriticalError
        if handle == 1:
            raise NOT_SUPPORTED()
        if handle == 2:
            raise LOST()

    def uuid(handle: int) -> str:
        if handle == 3:
            raise LOST()
        return f"GPU-5e1a0000-0000-4000-8000-00000000000{handle}"

    probe = probe_on(
        monkeypatch, nvmlDeviceGetCount=lambda: 4, nvmlDeviceRegisterEvents=register, nvmlDeviceGetUUID=uuid
    )
    registration = probe.register_xid_events()
    assert registration.registered == ("GPU-5e1a0000-0000-4000-8000-000000000000",)
    assert registration.unsupported == ("GPU-5e1a0000-0000-4000-8000-000000000001",)
    assert registration.lost == ("GPU-5e1a0000-0000-4000-8000-000000000002",)
    assert registration.lost_indexes == (3,)


def test_wait_xid_returns_event_named_by_uuid_and_none_on_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [event(1, 48), pynvml.NVMLError_Timeout(), event(0, 13, event_type=0x10)]

    def wait(event_set: Any, timeout_ms: int) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    probe = probe_on(monkeypatch, nvmlEventSetWait=wait)
    probe.register_xid_events()
    assert probe.wait_xid(1000) == XidEvent(UUIDS[1], 48)
    assert probe.wait_xid(1000) is None
    assert probe.wait_xid(1000) is None  # not an Xid event type


@pytest.mark.parametrize("error", [pynvml.NVMLError_Unknown(), LOST()], ids=["unknown", "lost"])
def test_wait_xid_other_errors_raise_xid_events_failed(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    probe = probe_on(monkeypatch, nvmlEventSetWait=raising(error))
    probe.register_xid_events()
    with pytest.raises(XidEventsFailed):
        probe.wait_xid(1000)


def test_wait_xid_before_registering_raises_xid_events_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(XidEventsFailed, match="register"):
        probe_on(monkeypatch).wait_xid(10)


def test_register_xid_events_event_set_refused_raises_xid_events_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_on(monkeypatch, nvmlEventSetCreate=raising(NOT_SUPPORTED()))
    with pytest.raises(XidEventsFailed, match="event set"):
        probe.register_xid_events()


def test_register_xid_events_again_frees_the_previous_set(monkeypatch: pytest.MonkeyPatch) -> None:
    freed: list[Any] = []
    sets = iter(["first", "second"])
    probe = probe_on(monkeypatch, nvmlEventSetCreate=lambda: next(sets), nvmlEventSetFree=freed.append)
    probe.register_xid_events()
    probe.register_xid_events()
    probe.shutdown()
    assert freed == ["first", "second"]
