"""The NVML instrumentor (issue 17, item 4): no NVML library means no sampler, and what it records
from a device, here a stand-in NVML module with a device's answers (the real NVML on a GPU is
checked on a lent GPU: ``docs/anomalies.md``, GPU health)."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from rankscope.instrumentation.gpu_health import REDUCES, NvmlSampler


class _Rates:
    gpu, memory = 87, 41


def _nvml(xids: int) -> types.ModuleType:
    """A stand-in ``pynvml``: one device's answers, one query it does not support (ECC)."""
    nvml = types.ModuleType("pynvml")
    events = [object()] * xids

    def wait(_events: object, _timeout: int) -> object:
        if not events:
            raise RuntimeError("NVML_ERROR_TIMEOUT")
        return events.pop()

    def unsupported(*_: object) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml.__dict__.update(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: ("gpu", i),
        nvmlEventSetCreate=lambda: "events",
        nvmlDeviceRegisterEvents=lambda *a: None,
        nvmlEventTypeXidCriticalError=8,
        nvmlEventSetWait=wait,
        nvmlDeviceGetUtilizationRates=lambda h: _Rates(),
        nvmlDeviceGetPowerUsage=lambda h: 412_500,
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetTemperature=lambda h, kind: 71,
        NVML_CLOCK_SM=1,
        nvmlDeviceGetClockInfo=lambda h, kind: 1755,
        nvmlClocksThrottleReasonGpuIdle=1,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x1 | 0x4,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlDeviceGetTotalEccErrors=unsupported,
    )
    return nvml


def test_a_sample_maps_the_devices_answers_and_leaves_unsupported_queries_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(xids=2))
    sampler = NvmlSampler.start()
    assert sampler is not None
    try:
        sample = sampler.sample(sampler._device())
        assert sample == {
            "gpu/utilization": 87.0,
            "gpu/memory_bandwidth_utilization": 41.0,
            "gpu/power_w": 412.5,
            "gpu/temperature_c": 71.0,
            "gpu/sm_clock_mhz": 1755.0,
            "gpu/throttle_reasons": 5.0,
            "gpu/throttled": 1.0,  # a reason other than idle is on
            "gpu/xid_errors": 2.0,
        }
        assert set(sample) <= set(REDUCES)
        assert sampler._thread.name == "rankscope-nvml" and sampler._thread is not threading.current_thread()
    finally:
        sampler.stop()


def test_no_nvml_library_means_no_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("pynvml")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.__dict__["nvmlInit"] = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert NvmlSampler.start() is None
