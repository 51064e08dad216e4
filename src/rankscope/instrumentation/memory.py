"""CUDA memory (and optionally host RSS/CPU) sampled at each flush, never initializing CUDA.

``cuda/memory_{allocated,reserved,peak}_bytes`` (MAX) come from the caching allocator's
host-side counters (no device sync); ``cuda/alloc_retries`` and ``cuda/ooms`` are the
increase since the previous flush. With ``host=True`` (``RANKSCOPE_HOST_METRICS``):
``host/rss_bytes`` and ``host/cpu_utilization`` (process CPU seconds per wall second).

With ``RANKSCOPE_MEMORY_HISTORY=N`` the allocator keeps its last N events
(``torch.cuda.memory._record_memory_history``, armed at the first flush after CUDA is up), and
a CUDA out-of-memory error makes the process save a memory snapshot to
``rankscope_artifacts/oom/<process>-<pid>-<time>.pickle`` (open it at pytorch.org/memory_viz),
named in a warning. Off by default: recording allocator history costs on every allocation.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType

from ..core.settings import resolve
from ..metrics.recording import add_flush_hook, record_metric, remove_flush_hook
from ..metrics.reduce import Reduce
from ._base import ModuleInstrumentor

_SUM, _MAX, _MEAN = Reduce.SUM, Reduce.MAX, Reduce.MEAN
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryInstrumentor(ModuleInstrumentor):
    """``instrument(host=None)``: ``host`` defaults to ``RANKSCOPE_HOST_METRICS``."""

    target = "torch"

    def _apply(self, module: ModuleType) -> None:
        host = self.options.get("host")
        self._sampler = _Sampler(resolve("host_metrics") if host is None else bool(host), resolve("memory_history"))
        add_flush_hook(self._sampler.sample)

    def _revert(self) -> None:
        remove_flush_hook(self._sampler.sample)


class _Sampler:
    def __init__(self, host: bool, history: int | None = None) -> None:
        self.host = host
        self.history = history
        self.armed = False
        self.retries: dict[int, int] = {}
        self.ooms: dict[int, int] = {}
        self.cpu = (time.perf_counter(), _cpu_seconds())

    def sample(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():  # never initialize CUDA for telemetry
            if self.history and not self.armed:
                self.armed = True
                _arm_oom_snapshots(torch, self.history)
            device = torch.cuda.current_device()
            stats = torch.cuda.memory_stats(device)
            record_metric("cuda/memory_allocated_bytes", stats.get("allocated_bytes.all.current", 0), _MAX)
            record_metric("cuda/memory_reserved_bytes", stats.get("reserved_bytes.all.current", 0), _MAX)
            record_metric("cuda/memory_peak_bytes", stats.get("allocated_bytes.all.peak", 0), _MAX)
            retries, ooms = stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)
            record_metric("cuda/alloc_retries", retries - self.retries.get(device, 0), _SUM)
            record_metric("cuda/ooms", ooms - self.ooms.get(device, 0), _SUM)
            self.retries[device], self.ooms[device] = retries, ooms
        if self.host:
            record_metric("host/rss_bytes", _rss_bytes(), _MAX)
            now, cpu = time.perf_counter(), _cpu_seconds()
            wall = now - self.cpu[0]
            if wall > 0:
                record_metric("host/cpu_utilization", (cpu - self.cpu[1]) / wall, _MEAN)
            self.cpu = (now, cpu)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # peak, in KiB on Linux


def _arm_oom_snapshots(torch: ModuleType, entries: int) -> None:
    """Keep the allocator's last ``entries`` events; on an OOM, dump them (see the module docstring)."""
    from pathlib import Path

    from ..core.errors import warn
    from ..core.identity import process_label
    from ..core.paths import safe_component
    from ..lifecycle import get_resource

    try:
        torch.cuda.memory._record_memory_history(max_entries=entries)
    except Exception as exc:
        warn(f"rankscope: CUDA memory history is unavailable ({exc!r})")
        return

    def on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        resource = get_resource()
        label = process_label(resource.attributes) if resource is not None else "process"
        path = Path("rankscope_artifacts") / "oom" / f"{safe_component(label)}-{os.getpid()}-{int(time.time())}.pickle"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
            warn(f"rankscope: CUDA out of memory on device {device}; memory snapshot: {path}")
        except Exception as exc:
            warn(f"rankscope: CUDA out of memory; the snapshot failed ({exc!r})")

    torch._C._cuda_attach_out_of_memory_observer(on_oom)
