"""One experiment's backends, run on their own thread so a slow view never stalls ingest
or another experiment.

The sink calls the same ``LoggerBackend`` interface the SDK does; extra keyword arguments
say whose values they are: ``per_process`` (global views: every process's values),
``process_name``/``process`` (per-process views and streams), ``late`` (a late update).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from .._internal.backends.base import LoggerBackend, LoggingMode, Metric, get_backend_class
from .experiment import Process, StepView

log = logging.getLogger("rankscope.sink")


def make_backends(config: Mapping[str, Mapping[str, Any]]) -> list[LoggerBackend]:
    """Backends from ``{"name": {"logging_mode": ..., ...}}``; ``"backend"`` renames the class."""
    made = []
    for name, options in config.items():
        made.append(get_backend_class(str(options.get("backend", name)))(dict(options)))
    return made


def _identity(process: Process) -> dict[str, Any]:
    return {
        "process_name": process.label,
        "process": process,
        "rank": process.rank,
        "world_size": process.world_size,
        "role": process.role,
        "replica": process.replica,
    }


class ViewWriter:
    """Owns one experiment's backends and the thread that calls them."""

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Mapping[str, Any]],
        on_error: Callable[[str, BaseException], None],
        max_queued: int = 4096,
    ) -> None:
        self.experiment = experiment
        self.backends = make_backends(config)
        self._on_error = on_error
        self._queue: queue.Queue[Any] = queue.Queue(max_queued)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dropped = 0
        self.written_step = -1
        self._thread = threading.Thread(target=self._run, name=f"rankscope-views-{experiment}", daemon=True)
        self._thread.start()

    def step(self, view: StepView) -> None:
        self._put(("step", view))

    def stream(self, process: Process, metric: Metric, step: int | None) -> None:
        self._put(("stream", process, metric, step))

    def close(self, timeout: float) -> None:
        self.request_close(timeout)
        self.join(timeout)

    def request_close(self, timeout: float) -> None:
        """Ask the writer to finish its backends after what is queued (W&B's finish can take seconds)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(("stop",), timeout=timeout)

    def join(self, timeout: float) -> bool:
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def wait_idle(self, timeout: float) -> bool:
        done = threading.Event()
        self._put(("sync", done))
        return done.wait(timeout)

    def _put(self, item: Any) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("rankscope sink: views of %s are too slow; dropping updates", self.experiment)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                self._loop.run_until_complete(result)  # type: ignore[arg-type]
        except Exception as exc:
            self._on_error(f"{type(getattr(fn, '__self__', fn)).__name__}.{getattr(fn, '__name__', '?')}", exc)

    def _run(self) -> None:
        for backend in self.backends:
            self._call(backend.init, "global", experiment=self.experiment, role="sink")
        while True:
            item = self._queue.get()
            kind = item[0]
            if kind == "stop":
                break
            if kind == "sync":
                item[1].set()
            elif kind == "step":
                self._write_step(item[1])
                if not item[1].late:
                    self.written_step = max(self.written_step, item[1].step)
            elif kind == "stream":
                _, process, metric, step = item
                for backend in self.backends:
                    if backend.logging_mode is LoggingMode.PER_RANK_NO_REDUCE:
                        self._call(backend.log_stream, metric, step, **_identity(process))
        for backend in self.backends:
            self._call(backend.finish)
        if self._loop is not None:
            self._loop.close()

    def _write_step(self, view: StepView) -> None:
        if view.missing and not view.late:
            log.warning(
                "rankscope sink: experiment %s step %d finalized without %s", view.experiment, view.step, view.missing
            )
        for backend in self.backends:
            if backend.logging_mode is LoggingMode.GLOBAL_REDUCE:
                self._call(
                    backend.log_batch, view.global_metrics, view.step, per_process=view.per_process, late=view.late
                )
            elif backend.logging_mode is LoggingMode.PER_RANK_REDUCE:
                for process, metrics in view.per_process.items():
                    self._call(backend.log_batch, metrics, view.step, late=view.late, **_identity(process))
