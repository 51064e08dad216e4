"""Driving a process's steps: the ``Runtime`` and what runs between ``init`` and ``shutdown``.

``Runtime.close`` closes a step (``flush``, a driving process's flush, an automatic step): it
touches every part the runtime holds, in order: flush hooks, a profiler capture, the recorder's
hand-off, the step clock, a Monarch controller's fan-out, the step's root span and the export
queue. The module-level calls (``flush``, ``flush_driven``, ``auto_step``, ...) find the runtime
in the slot (auto-initializing where a first use may start rankscope).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import cast

from opentelemetry.sdk.resources import Resource

from ..backends.console import ConsoleBackend, write_line
from ..core import runtime as _slot
from ..core.errors import report_internal_error
from ..core.settings import Settings
from ..export.senders import EmbeddedSender
from ..export.thread import ExportThread
from ..metrics.recorder import Recorder, StepBatch
from ..metrics.recording import bind_compile_check, flush_hooks, run_flush_hooks
from ..steps.clock import StepClock
from ..tracing.tracer import TracingState
from .state import process


class Runtime:
    """One initialized rankscope in one process (installed in ``core.runtime``; it is that
    module's ``Runtime`` protocol, what the stages below use of it)."""

    def __init__(
        self,
        resource: Resource,
        settings: Settings,
        recorder: Recorder,
        steps: StepClock,
        thread: ExportThread,
        tracing: TracingState,
    ):
        self.resource = resource
        self.settings = settings
        self.recorder = recorder
        self.steps = steps
        self.tracing = tracing
        self.thread = thread
        self.compile_checked = False
        """``record_metric`` stays out of ``torch.compile`` graphs (checked at each flush until torch is imported)."""

    @property
    def shutdown_timeout(self) -> float:
        return self.settings.shutdown_timeout

    def close(self, step: int, driven: bool, auto: bool = False) -> None:
        """Close ``step`` on this process (``flush``, a controller's flush, an automatic step)."""
        if (type(step) is not int and (isinstance(step, bool) or not isinstance(step, int))) or step < 0:
            raise TypeError(f"flush(step): step must be a non-negative int, got {step!r}")
        steps = self.steps
        if not auto:
            steps.auto = steps.auto_pending = False
        if not self.compile_checked:  # the first close comes here (and later ones until torch is imported)
            self.compile_checked = bind_compile_check()
            say_where_at_first_flush()
        if flush_hooks:
            run_flush_hooks()
        captures = self.thread.captures
        if captures is not None:  # a profiler capture starts, steps or stops here (idle: one check)
            captures.at_flush(step)
        if not (driven or steps.controller or process.fan_outs):  # a training loop's every step
            root_span = self.tracing.closed()  # the span itself is made on the export thread
            handed = self.recorder.hand_off(step, root_span)
            steps.close(step)
            if handed is not None:  # host values and phases: a tuple into the export thread's inbox
                self.thread.hand_off(handed)
                return
            batch, asked = self.recorder.take(step), 0  # device values, GPU timings, samples
        else:
            batch = self.recorder.take(step)
            steps.close(step)
            asked = self._fan_out(step)
            root_span = self.tracing.closed()
        if batch is not None:
            if asked:
                batch.expected = asked + 1
            batch.root_span = root_span
            batch.driven = driven
            self.thread.submit(batch)

    def _fan_out(self, step: int) -> int:
        """Close ``step`` in the processes this one drives (a Monarch controller's actors, the
        ``drive_processes`` fan-outs); how many it asked."""
        asked = 0
        if self.steps.controller:
            try:
                from ..integrations.monarch.actors import flush_actors  # only a Monarch program gets here

                asked = flush_actors(step)
            except Exception as exc:
                report_internal_error("Monarch actor flush", exc)
        for fan_out in process.fan_outs:
            try:
                asked += fan_out(step)
            except Exception as exc:
                report_internal_error("driven processes' flush", exc)
        return asked

    def flush_driven(self, step: int) -> None:
        """``flush`` sent by a Monarch controller to its actor processes.

        It may arrive after an endpoint call of a later step already closed ``step`` here
        (``catch_up``): then it is a no-op, or only the step's marker when catching up skipped it.
        """
        steps = self.steps
        if steps.last is not None and step <= steps.last:
            if step not in steps.closed:
                steps.closed.add(step)
                now = time.time_ns()
                self.thread.submit(StepBatch(step, now, now, {}, None, driven=True))
            return
        self.close(step, driven=True)

    def catch_up(self, step: int) -> None:
        """An endpoint call of the controller's step ``step`` arrived in this actor process: close
        the step before it first if the controller's ``flush`` has not arrived yet (Monarch orders
        it only after the replies the controller awaited, not before its next calls), so what the
        call records lands in ``step`` exactly."""
        steps = self.steps
        if steps.driven and step > 0 and (steps.last is None or steps.last < step - 1):
            self.close(step - 1, driven=True)

    def auto_step(self) -> None:
        """An instrumentor saw a training step end (an optimizer step): it will be closed as the
        next step, unless the program closes steps itself (it calls ``flush``) or a Monarch
        controller does.

        The close waits for the next instrumented event (``settle_auto_step``) or shutdown: a
        program that calls ``flush`` right after ``optimizer.step()`` gets there first, and its
        own step numbers win without a duplicate step.
        """
        if self.steps.auto:
            self.steps.auto_pending = True

    def settle_auto_step(self) -> None:
        """Close the step ``auto_step`` left pending (instrumentors call this before recording)."""
        steps = self.steps
        if steps.auto_pending:
            steps.auto_pending = False
            if steps.auto:
                self.close(steps.next, driven=False, auto=True)


def installed() -> Runtime | None:
    """The runtime in the slot, as this package built it (none is started here)."""
    # Only this package installs a runtime, so the slot's holds this class (the slot itself
    # types it as the protocol of what the stages below use of it).
    return cast("Runtime | None", _slot.current)


def started() -> Runtime | None:
    """The runtime in the slot, started from the environment on first use; None when disabled."""
    return cast("Runtime | None", _slot.get())


def flush(step: int) -> None:
    """Close ``step`` on this process: everything recorded since the last flush is exported
    stamped with it. Returns at once; export runs on a background thread."""
    runtime: Runtime | None = _slot.current or started()  # type: ignore[assignment]  # the slot holds a Runtime
    if runtime is not None:
        runtime.close(step, False)


def current_step() -> int | None:
    """The step in progress on this process: ``set_step``'s, else the last flushed step + 1,
    None before any flush."""
    runtime = installed()
    return None if runtime is None else runtime.steps.current


def auto_step() -> None:
    """An instrumentor saw a training step end (see ``Runtime.auto_step``)."""
    runtime = started()
    if runtime is not None:
        runtime.auto_step()


def settle_auto_step() -> None:
    """Close the step ``auto_step`` left pending (instrumentors call this before recording)."""
    runtime = installed()
    if runtime is not None and runtime.steps.auto_pending:
        runtime.settle_auto_step()


def drive_processes(fan_out: Callable[[int], int]) -> None:
    """This process's ``flush(N)`` also closes step N in the processes it drives (as a Monarch
    controller's does): ``fan_out(N)`` asks them (``flush_driven``) and returns how many it asked,
    which the step's marker carries so the sink waits for them."""
    if fan_out not in process.fan_outs:
        process.fan_outs.append(fan_out)


def follow_driver() -> None:
    """This process's steps are closed by a driving process's flush (``flush_driven``): what it
    records waits for that instead of leaving without a step."""
    runtime = started()
    if runtime is not None:
        runtime.steps.driven = True


def flush_driven(step: int) -> None:
    """Close ``step`` here, asked by the process that drives this one (``drive_processes``)."""
    runtime = started()
    if runtime is not None:
        runtime.flush_driven(step)


def capture(reason: str, *, steps: int = 2, ranks: list[int] | None = None) -> None:
    """Ask the experiment's processes (``ranks``; None: every one) to run ``torch.profiler`` for
    their next ``steps`` steps and send the Chrome traces to the sink (``rankscope capture`` from a
    shell does the same). Returns at once: the request goes out on the export thread. Needs a sink
    control URL (the embedded sink, ``rankscope run``, or ``RANKSCOPE_SINK_CONTROL``)."""
    if not isinstance(reason, str):
        raise TypeError(f"capture: reason must be a str, got {reason!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 64:
        raise ValueError(f"capture: steps must be an int in [1, 64], got {steps!r}")
    if ranks is not None and not all(type(r) is int and r >= 0 for r in ranks):
        raise ValueError(f"capture: ranks must be non-negative ints, got {ranks!r}")
    runtime = started()
    if runtime is not None and runtime.thread.captures is not None:
        runtime.thread.captures.ask(reason, steps, None if ranks is None else list(ranks))


def say_where_at_first_flush() -> None:
    """Say what auto-init found out about where the metrics go, at the first step's close rather
    than at the first recorded value: an ``init`` in between (which names the experiment) replaced it."""
    notices = process.notices
    message, notices.unsaid_where = notices.unsaid_where, None
    if message and message != notices.said_where:
        notices.said_where = message
        write_line(sys.stderr, message)


def prints_steps_here() -> bool:
    """Whether rankscope prints this job's steps on this terminal: a console view of this process,
    or the views of the job's embedded sink (or ``rankscope run``'s sink), which print where the
    job runs, when they are the default console or name one that is not off. (A ``rankscope run``
    given fixed views without a console says so with ``RANKSCOPE_CONSOLE=off``.) A framework whose
    own printing would repeat the steps' numbers asks this (the Transformers callback)."""
    runtime = started()
    if runtime is None:  # disabled
        return False
    thread = runtime.thread
    if any(isinstance(b, ConsoleBackend) and b.format != "off" for b in thread.backends.backends):
        return True
    if not isinstance(thread.sender, EmbeddedSender):
        return False  # the views are this process's (and hold no console) or a sink's elsewhere
    settings = runtime.settings
    views = settings.backends
    if not views:
        return settings.console != "off"
    console = views.get("console")
    return console is not None and console.get("format", settings.console) != "off"
