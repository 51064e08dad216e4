"""GPU health from NVML (the ``nvidia-ml-py`` package), sampled off the caller's thread.

At each flush the caller records the previous sample (a dict read, no NVML call) and wakes a
daemon thread that samples this process's GPU again, so NVML's latency (tens of microseconds
to milliseconds per query) never lands on the training thread. Per rank, reduced so the sink
names the rank that holds the extreme (``{key}/argmax_rank``, ``argmin_rank``):

- ``gpu/utilization`` and ``gpu/memory_bandwidth_utilization`` (percent, MIN: the idlest rank),
- ``gpu/power_w`` and ``gpu/temperature_c`` (MAX), ``gpu/sm_clock_mhz`` (MIN: the most throttled),
- ``gpu/throttled`` (MAX: 1 when a clock-throttle reason other than idle is active) and
  ``gpu/throttle_reasons`` (MAX, NVML's bitmask of the rank holding the highest),
- ``gpu/ecc_errors`` (MAX: volatile uncorrected ECC errors) and ``gpu/xid_errors`` (SUM: critical
  Xid events since the previous flush).

No NVML library, no GPU, or a query the device does not support: that metric (or all of them)
is silently absent. The device is the caller's ``torch.cuda.current_device()``, found by UUID
once CUDA is initialized (so ``CUDA_VISIBLE_DEVICES`` is honoured), until then ``LOCAL_RANK``'s
NVML index (CUDA is never initialized for telemetry).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from types import ModuleType
from typing import Any

from ..metrics.recording import add_flush_hook, record_metric, remove_flush_hook
from ..metrics.reduce import Reduce
from ._base import ModuleInstrumentor

_MAX, _MIN, _SUM = Reduce.MAX, Reduce.MIN, Reduce.SUM
REDUCES = {
    "gpu/utilization": _MIN,
    "gpu/memory_bandwidth_utilization": _MIN,
    "gpu/power_w": _MAX,
    "gpu/temperature_c": _MAX,
    "gpu/sm_clock_mhz": _MIN,
    "gpu/throttled": _MAX,
    "gpu/throttle_reasons": _MAX,
    "gpu/ecc_errors": _MAX,
    "gpu/xid_errors": _SUM,
}


class GpuHealthInstrumentor(ModuleInstrumentor):
    """``instrument()``: NVML health per rank at each flush (off, silently, without NVML or a GPU)."""

    target = "torch"

    def _apply(self, module: ModuleType) -> None:
        self._sampler = NvmlSampler.start()
        if self._sampler is not None:
            add_flush_hook(self._sampler.at_flush)

    def _revert(self) -> None:
        if self._sampler is not None:
            remove_flush_hook(self._sampler.at_flush)
            self._sampler.stop()


class NvmlSampler:
    """The sampling thread and its latest sample."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.latest: dict[str, float] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._handle: Any = None
        self._events: Any = None
        self._uuid: str | None = None
        """The caller's device UUID ("" when torch has none), None until CUDA is up."""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rankscope-nvml", daemon=True)

    @classmethod
    def start(cls) -> NvmlSampler | None:
        """A running sampler, or None when NVML or a GPU is absent (silently)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() < 1:
                return None
        except Exception:
            return None
        sampler = cls(pynvml)
        sampler._thread.start()
        sampler._wake.set()
        return sampler

    def at_flush(self) -> None:
        """Caller's thread: record the last sample, ask for the next one."""
        if self._uuid is None:
            self._find_device()
        with self._lock:
            latest, self.latest = self.latest, {}
        for key, value in latest.items():
            record_metric(key, value, REDUCES[key])
        self._wake.set()

    def _find_device(self) -> None:
        """The caller's CUDA device (current-device is per thread), by UUID: right under any
        ``CUDA_VISIBLE_DEVICES``. Until CUDA is up, the sampler uses ``LOCAL_RANK``."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        try:
            uuid = torch.cuda.get_device_properties(torch.cuda.current_device()).uuid
        except Exception:
            uuid = None
        self._uuid = f"GPU-{uuid}" if uuid else ""
        self._handle = None  # the sampler looks the device up again

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def _device(self) -> Any:
        if self._handle is None:
            if self._uuid:
                self._handle = self.nvml.nvmlDeviceGetHandleByUUID(self._uuid)
            else:
                index = int(os.environ.get("LOCAL_RANK", "0") or 0)
                self._handle = self.nvml.nvmlDeviceGetHandleByIndex(index % max(1, self.nvml.nvmlDeviceGetCount()))
            try:
                self._events = self.nvml.nvmlEventSetCreate()
                self.nvml.nvmlDeviceRegisterEvents(self._handle, self.nvml.nvmlEventTypeXidCriticalError, self._events)
            except Exception:
                self._events = None
        return self._handle

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            try:
                sample = self.sample(self._device())
            except Exception:  # a device gone or NVML broken: no sample this flush
                sample = {}
            with self._lock:
                self.latest = sample

    def sample(self, handle: Any) -> dict[str, float]:
        """Every metric the device answers; an unsupported query is left out."""
        n = self.nvml
        out: dict[str, float] = {}

        def take(key: str, read: Any) -> None:
            with contextlib.suppress(Exception):
                out[key] = float(read())

        rates: Any = None
        with contextlib.suppress(Exception):
            rates = n.nvmlDeviceGetUtilizationRates(handle)
        if rates is not None:
            out["gpu/utilization"] = float(rates.gpu)
            out["gpu/memory_bandwidth_utilization"] = float(rates.memory)
        take("gpu/power_w", lambda: n.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        take("gpu/temperature_c", lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU))
        take("gpu/sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM))
        try:
            reasons = int(n.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
            out["gpu/throttle_reasons"] = float(reasons)
            out["gpu/throttled"] = float(bool(reasons & ~n.nvmlClocksThrottleReasonGpuIdle))
        except Exception:
            pass
        take(
            "gpu/ecc_errors",
            lambda: n.nvmlDeviceGetTotalEccErrors(handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
        )
        if self._events is not None:
            xids = 0
            try:
                while True:
                    n.nvmlEventSetWait(self._events, 0)
                    xids += 1
            except Exception:  # NVML_ERROR_TIMEOUT: no more events
                pass
            out["gpu/xid_errors"] = float(xids)
        return out
