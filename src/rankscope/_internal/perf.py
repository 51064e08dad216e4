"""Forge's ``Tracer`` and ``trace``: durations (and optional CUDA memory) as metrics.

Metric names match Forge so dashboards carry over: ``{prefix}/{step}/duration_avg_s``,
``{prefix}/{step}/duration_max_s``, ``{prefix}/total_duration_avg_s``,
``{prefix}/total_duration_max_s`` and, with ``track_memory``, ``{prefix}/memory_peak_max_gb``
and ``{prefix}/memory_delta_end_start_avg_gb``. Timing here is CPU wall time;
``timer="gpu"`` is accepted and measured on the CPU clock with one warning.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from .main import record_metric
from .reduce import Reduce

F = TypeVar("F", bound=Callable[..., Any])
_GB = float(1 << 30)
_warned_gpu = False


def _cuda() -> Any:
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() else None


class Tracer:
    """``start()``, ``step(name)`` after each phase, ``stop()``; each phase's duration is recorded."""

    def __init__(self, prefix: str, track_memory: bool = False, timer: str = "cpu") -> None:
        global _warned_gpu
        if timer not in ("cpu", "gpu"):
            raise ValueError(f"Tracer({prefix!r}): timer must be 'cpu' or 'gpu', got {timer!r}")
        if timer == "gpu" and not _warned_gpu:
            _warned_gpu = True
            warnings.warn("rankscope Tracer: timer='gpu' is measured on the CPU clock", RuntimeWarning, stacklevel=2)
        self.prefix = prefix
        self.track_memory = track_memory and _cuda() is not None
        self._start = self._last = 0.0
        self._memory_start = 0

    def start(self) -> Tracer:
        if self.track_memory:
            self._memory_start = _cuda().memory_allocated()
        self._start = self._last = time.perf_counter()
        return self

    def step(self, name: str) -> None:
        now = time.perf_counter()
        duration, self._last = now - self._last, now
        record_metric(f"{self.prefix}/{name}/duration_avg_s", duration, Reduce.MEAN)
        record_metric(f"{self.prefix}/{name}/duration_max_s", duration, Reduce.MAX)

    def stop(self) -> None:
        total = time.perf_counter() - self._start
        record_metric(f"{self.prefix}/total_duration_avg_s", total, Reduce.MEAN)
        record_metric(f"{self.prefix}/total_duration_max_s", total, Reduce.MAX)
        if self.track_memory:
            cuda = _cuda()
            record_metric(f"{self.prefix}/memory_peak_max_gb", cuda.max_memory_allocated() / _GB, Reduce.MAX)
            delta = (cuda.memory_allocated() - self._memory_start) / _GB
            record_metric(f"{self.prefix}/memory_delta_end_start_avg_gb", delta, Reduce.MEAN)


class trace:  # noqa: N801 - Forge's name
    """``with trace("step") as t: ...`` or ``@trace("reward")`` on sync and async functions."""

    def __init__(self, prefix: str, track_memory: bool = False, timer: str = "cpu") -> None:
        self._args = (prefix, track_memory, timer)
        self._tracer: Tracer | None = None

    def __enter__(self) -> Tracer:
        self._tracer = Tracer(*self._args).start()
        return self._tracer

    def __exit__(self, *exc: object) -> None:
        assert self._tracer is not None
        self._tracer.stop()

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                tracer = Tracer(*self._args).start()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    tracer.stop()

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            tracer = Tracer(*self._args).start()
            try:
                return fn(*args, **kwargs)
            finally:
                tracer.stop()

        return run  # type: ignore[return-value]
