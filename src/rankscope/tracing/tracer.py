"""``trace``/``Tracer``: phases as spans in the step's trace, and Forge's duration metrics.

``with rs.trace("train_step") as t: ...; t.step("fwd"); ...`` makes one span for the
whole block and one child span per ``step(name)`` (the time since the previous mark),
and records Forge's metric names, so dashboards carry over:
``{prefix}/{name}/duration_avg_s``, ``{prefix}/{name}/duration_max_s``,
``{prefix}/total_duration_avg_s``, ``{prefix}/total_duration_max_s`` and, with
``track_memory``, ``{prefix}/memory_peak_max_gb`` and ``{prefix}/memory_delta_end_start_avg_gb``.

Where a span hangs: under the current OpenTelemetry span if there is one (an enclosing
trace, the user's own span, the caller of a Monarch endpoint, ``TRACEPARENT``), else under
the root span of the step in progress (one trace per step per experiment, see ``spans``).
The block's span is the current OTel span inside it, so the user's own spans nest under it.

``timer="gpu"`` times the phases with CUDA events through ``CudaTimingProcessor``: nothing
waits on the caller's thread; the duration metrics are read by the export thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import random
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..core import names as attr
from ..core import runtime as _slot
from ..core.errors import report_internal_error, warn_once
from ..core.identity import process_label
from ..metrics.catalog import phase_keys
from ..metrics.recorder import Phase, Recorder
from ..metrics.recording import defer_gpu_duration, defer_phase, record_metric
from ..metrics.reduce import Reduce
from ..steps.clock import StepClock
from .gpu_timing import CudaTimingProcessor, Mark
from .spans import (
    CLOCK_OFFSET,
    BufferProcessor,
    SpanBuffer,
    SpanRecord,
    is_sampled,
    now_ns,
    perf_ns,
    random_id,
    step_ids,
)

F = TypeVar("F", bound=Callable[..., Any])
_GB = float(1 << 30)
_MEAN, _MAX = Reduce.MEAN, Reduce.MAX
_STEP = attr.STEP
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class SpanScope(NonRecordingSpan):
    """Where new spans go: trace id, parent span id, sampled, step (and a remote caller's label),
    and the recorded span itself when this process records it (``span``: links are added to it).

    Entered (``enter_scope``), it is also the current OpenTelemetry span of its context: a
    non-recording span whose ``SpanContext`` is made only when something asks for it (the user's own
    spans, a propagator), so a traced block builds one object, not four."""

    __slots__ = ("_context", "caller", "parent_id", "remote", "sampled", "span", "step", "trace_id")

    def __init__(
        self,
        trace_id: int,
        parent_id: int,
        sampled: bool,
        step: int,
        caller: str | None = None,
        span: SpanRecord | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.parent_id = parent_id
        self.sampled = sampled
        self.step = step
        self.caller = caller
        self.span = span
        self.remote = False

    def get_span_context(self) -> SpanContext:
        try:
            return self._context
        except AttributeError:  # the first ask: made here, not when the scope is entered
            flags = _SAMPLED if self.sampled else _NOT_SAMPLED
            found = self._context = SpanContext(self.trace_id, self.parent_id, self.remote, flags)
            return found

    def __repr__(self) -> str:
        return f"SpanScope(trace={self.trace_id:032x}, span={self.parent_id:016x}, step={self.step})"


class Block(SpanScope):
    """A ``Tracer`` block in progress: the scope its phases and the user's spans hang under (its own
    span id is ``parent_id``), plus what its span needs (name, start, the span it hangs under). The
    span record is made when first needed: at the end, on the export thread (``phase_spans``), or
    earlier on the caller's thread when something must be added to it (links, memory, an error)."""

    __slots__ = ("name", "start", "up")

    def __init__(self, name: str, trace_id: int, span_id: int, up: int, sampled: bool, step: int, start: int) -> None:
        self.name = name
        self.trace_id = trace_id
        self.parent_id = span_id
        self.up = up
        self.sampled = sampled
        self.step = step
        self.start = start
        self.caller = self.span = None
        self.remote = False

    def record(self) -> SpanRecord | None:
        """The block's span (None when its step is not sampled), made on first use."""
        span = self.span
        if span is None and self.sampled:
            span = self.span = SpanRecord(self.name, self.trace_id, self.parent_id, self.up, self.start, 0)
            span.attributes = {_STEP: self.step}
        return span


def _span_key() -> str:
    """The OTel context's key of the current span, read through the public API (``set_span_in_context``)."""
    return next(iter(otel_trace.set_span_in_context(otel_trace.INVALID_SPAN, Context())))


_SPAN_KEY = _span_key()
_SCOPE_KEY = otel_context.create_key("rankscope-scope")
"""The innermost rankscope scope (a block, a remote caller) of an OTel context, kept beside its span:
under the user's own spans (whose contexts are copies of it) it still gives the step."""


def _scope_of(context: otel_context.Context) -> SpanScope | None:
    found: SpanScope | None = context.get(_SCOPE_KEY)  # type: ignore[assignment]
    return found


def _entered(scope: SpanScope, context: otel_context.Context) -> otel_context.Context:
    """``context`` with ``scope`` as its current span and rankscope scope (one dict, no ``set_value`` copies)."""
    values = dict(context)
    values[_SPAN_KEY] = values[_SCOPE_KEY] = scope
    return Context(values)


def enter_scope(scope: SpanScope, remote: bool, context: otel_context.Context | None = None) -> Any:
    """Make ``scope`` (its span is ``parent_id``) the current OTel span and rankscope scope; returns
    the token ``leave_scope`` takes. ``context``: the current OTel context, when the caller has just
    read it (one read less)."""
    scope.remote = remote
    return otel_context.attach(_entered(scope, otel_context.get_current() if context is None else context))


def leave_scope(token: Any) -> None:
    """Undo ``enter_scope``; a no-op when left in another context (e.g. another asyncio task)."""
    if token is None:
        return
    if type(token) is not contextvars.Token:  # another runtime context (``OTEL_PYTHON_CONTEXT``)
        otel_context.detach(token)
        return
    try:  # the OTel runtime context's ContextVar, reset here: another context raises (and is
        token.var.reset(token)  # left alone) instead of being logged by ``otel_context.detach``
    except (ValueError, RuntimeError):
        return


MIN_AHEAD, MAX_AHEAD = 32, 256
"""Steps whose ids (and root-level blocks) the export thread makes ahead of the caller's: twice the
steps the caller ran in the last export round (0.4-0.6 s of them), within these bounds."""


class BlocksAhead:
    """Root-level ``Tracer`` blocks of the coming steps, made on the export thread as it takes
    flushed steps: a block that starts under the step's root span (no span around it) finds its
    ``Block`` and the OTel ``Context`` it enters ready, instead of hashing ids and building both on
    the training thread between cold caches (~4 us a step). Keyed by (prefix, step); each is taken
    once (``dict.pop``; each dict operation is atomic), so two blocks of one step never share a
    span id; one not taken (a step without that block) is dropped when its step has passed."""

    PREFIXES = 4
    """Prefixes made ahead (the first ones seen at the root): a loop's one or two kinds of block."""
    IDLE_STEPS = 64
    """A prefix whose blocks went untaken this many steps in a row is no longer made (a setup block);
    used again, it is seen again."""

    def __init__(self) -> None:
        self.ready: dict[tuple[str, int], tuple[Block, Context]] = {}
        self.prefixes: list[str] = []
        self._made: dict[str, tuple[int, int]] = {}
        """Each prefix's lowest and highest step that may be in ``ready``."""
        self._idle: dict[str, int] = {}
        """Each prefix's steps passed since one of its blocks was taken."""

    def seen(self, prefix: str) -> None:
        """A root-level block found none ready (caller's thread): its prefix is made ahead from now on."""
        if prefix not in self.prefixes and len(self.prefixes) < self.PREFIXES:
            self.prefixes.append(prefix)

    def make(self, first: int, count: int, ids: Callable[[int], tuple[int, int, bool]]) -> None:
        """Blocks for step ``first`` (the caller's next) and the ``count`` - 1 after it, those not made
        yet; the ones of earlier steps go (export thread)."""
        ready = self.ready
        end = first + count
        for prefix in tuple(self.prefixes):
            low, high = self._made.get(prefix, (first, first - 1))
            if low <= first <= low + count:
                untaken = sum(ready.pop((prefix, step), None) is not None for step in range(low, min(first, high + 1)))
                passed = min(first, high + 1) - low
                idle = self._idle[prefix] = self._idle.get(prefix, 0) + passed if untaken == passed else 0
                if idle >= self.IDLE_STEPS:
                    self._forget(prefix)
                    continue
            else:  # the steps jumped: a snapshot of the keys (one atomic copy), not a walk over the gap
                for key in tuple(ready):
                    if key[0] == prefix and (key[1] < first or first < low):
                        ready.pop(key, None)
                if first < low:  # back (a second loop from step 0): all of them went
                    high = first - 1
            for step in range(max(first, high + 1), end):
                trace_id, up, sampled = ids(step)
                block = Block(prefix, trace_id, random_id(64) or 1, up, sampled, step, 0)
                ready[(prefix, step)] = (block, Context({_SPAN_KEY: block, _SCOPE_KEY: block}))
            self._made[prefix] = (first, max(high, end - 1))

    def _forget(self, prefix: str) -> None:
        with contextlib.suppress(ValueError):
            self.prefixes.remove(prefix)
        for key in tuple(self.ready):
            if key[0] == prefix:
                self.ready.pop(key, None)
        self._made.pop(prefix, None)
        self._idle.pop(prefix, None)


class TracingState:
    """One process's tracing: step ids, sampling, the span pipeline, the step root it may own."""

    def __init__(
        self,
        resource: Resource,
        steps: StepClock,
        *,
        sample_ratio: float,
        root: bool,
        max_spans: int,
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        a = resource.attributes
        self.experiment = str(a[attr.EXPERIMENT_ID])
        self.attempt = int(a.get(attr.EXPERIMENT_ATTEMPT, 0))  # type: ignore[arg-type]
        self.label = process_label(a)
        self.ratio = sample_ratio
        self.root = root
        self.buffer = SpanBuffer(max_spans)
        self.processor = BufferProcessor(self.buffer)
        self._on_error = on_error
        self._gpu: CudaTimingProcessor | None = None
        self._gpu_checked = False
        self._ids: dict[int, tuple[int, int, bool]] = {}
        self._prefetched = (0, -1)
        """The steps whose ids ``prefetch`` computed, lowest and highest."""
        self._ids_lock = threading.Lock()
        self.steps = steps
        self.step_started_ns: int | None = None
        self.ahead = BlocksAhead()
        self.env_parent = _env_parent()
        var = _context_var()
        self.get_context: Callable[[], otel_context.Context] = otel_context.get_current if var is None else var.get
        """``otel_context.get_current``; with the default runtime context, its ContextVar's own ``get``."""
        self.attach: Callable[[otel_context.Context], Any] = otel_context.attach if var is None else var.set
        """``otel_context.attach``; with the default runtime context, its ContextVar's own ``set`` (the
        same token: ``leave_scope`` resets it). A block starts with two C calls, not four Python ones."""

    # -- steps -------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step in progress (the step clock's; 0 before the first flush)."""
        current = self.steps.current
        return 0 if current is None else current

    def ids(self, step: int) -> tuple[int, int, bool]:
        """(trace id, root span id, sampled) of ``step``: usually computed ahead on the export thread
        (``prefetch``), so the first span of a step does not hash on the training thread."""
        found = self._ids.get(step)
        if found is None:
            found = self._add_ids(step)
        return found

    def prefetch(self, step: int, count: int) -> None:
        """Compute the ids of ``step`` and the ``count`` - 1 steps after it, those not computed yet
        (the export thread, as it takes a flushed step: the training thread's next steps find them
        ready; a miss hashes on the training thread, ~30 us between cold caches)."""
        low, high = self._prefetched
        if not low <= step <= high + 1:  # the steps jumped (back: a second loop from step 0)
            low, high = step, step - 1
        for ahead in range(max(step, high + 1), step + count):
            if ahead not in self._ids:
                self._add_ids(ahead)
        self._prefetched = (low, max(high, step + count - 1))

    def _add_ids(self, step: int) -> tuple[int, int, bool]:
        trace_id, root_id = step_ids(self.experiment, self.attempt, step)
        found = (trace_id, root_id, is_sampled(trace_id, self.ratio))
        with self._ids_lock:  # both threads add; the oldest entries go
            self._ids[step] = found
            while len(self._ids) > 2 * MAX_AHEAD:
                del self._ids[next(iter(self._ids))]
        return found

    def scope(self, context: otel_context.Context | None = None) -> SpanScope:
        """Where a span started now hangs (see the module docstring); read, never changed, by the
        caller. ``context``: the current OTel context, when the caller has just read it."""
        if context is None:
            context = otel_context.get_current()
        if not context and self.env_parent is None:  # no span anywhere: under the step's root span
            step = self._step_now()
            trace_id, root_id, sampled = self._ids.get(step) or self._add_ids(step)
            return SpanScope(trace_id, root_id, sampled, step)
        current = otel_trace.get_current_span(context)
        if isinstance(current, SpanScope):  # rankscope's own (a block, a remote caller, a server span)
            return current
        ctx = current.get_span_context()
        mine = _scope_of(context)
        if ctx.is_valid:
            if mine is not None and mine.trace_id == ctx.trace_id:
                step = mine.step
                caller = mine.caller if mine.parent_id == ctx.span_id else None
            else:
                step, caller = self.step, None
            return SpanScope(ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, step, caller)
        if self.env_parent is not None:
            p = self.env_parent
            return SpanScope(p.trace_id, p.span_id, p.trace_flags.sampled, self.step)
        step = self.step
        trace_id, root_id, sampled = self.ids(step)
        return SpanScope(trace_id, root_id, sampled, step)

    def _step_now(self) -> int:
        """``step``, read without the property (a traced block starts here, on cold caches)."""
        steps = self.steps
        step = steps.explicit
        if step is None:
            step = 0 if steps.last is None else steps.last + 1
        return step

    def closed(self) -> tuple[int, int] | None:
        """``flush`` ran (caller's thread): the step's root span's start and end when this process
        emits it (the root process), for ``taken`` to make on the export thread."""
        now = perf_ns() + CLOCK_OFFSET  # ``now_ns``, inlined: every flush comes here
        started = self.step_started_ns
        self.step_started_ns = now  # the step clock itself is the runtime's to close
        return (now if started is None else started, now) if self.root else None

    def taken(self, step: int | None, root_span: tuple[int, int] | None) -> None:
        """The export thread has a flushed step: its root span, if sampled, and the next steps' ids."""
        if step is None:
            return
        if root_span is not None:
            trace_id, root_id, sampled = self.ids(step)
            if sampled:
                record = SpanRecord("step", trace_id, root_id, 0, *root_span)
                record.attributes = {attr.STEP: step}
                self.buffer.add(record)
        last = self.steps.last
        caller = step if last is None or last < step else last  # the caller's last flushed step
        count = min(MAX_AHEAD, max(MIN_AHEAD, 2 * (caller - step) + 8))  # twice the steps of an export round
        self.prefetch(caller + 1, count)
        if self.ahead.prefixes:
            self.ahead.make(caller + 1, count, self.ids)

    def note_start(self, start_ns: int) -> None:
        if self.step_started_ns is None:
            self.step_started_ns = start_ns

    # -- GPU -----------------------------------------------------------------------------

    def gpu(self) -> CudaTimingProcessor | None:
        """The CUDA-event processor, made on first use; None without CUDA (one warning)."""
        if not self._gpu_checked:
            self._gpu_checked = True
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                self._gpu = CudaTimingProcessor(self.processor, torch.cuda, on_error=self._on_error)
            else:
                warn_once("rankscope trace: timer='gpu' without CUDA; timing on the CPU clock")
        return self._gpu

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        return self._gpu is None or self._gpu.force_flush(timeout_millis)

    def shutdown(self) -> None:
        if self._gpu is not None:
            self._gpu.shutdown()


def _context_var() -> contextvars.ContextVar[otel_context.Context] | None:
    """The ContextVar behind OTel's runtime context, when it is one (the default,
    ``ContextVarsRuntimeContext``), found through the public API: the token ``attach`` returns."""
    token = otel_context.attach(otel_context.get_current())
    otel_context.detach(token)
    if type(token) is not contextvars.Token:  # another runtime context (``OTEL_PYTHON_CONTEXT``)
        return None
    var: contextvars.ContextVar[otel_context.Context] = token.var
    return var


def _env_parent() -> SpanContext | None:
    """A parent process's span from ``TRACEPARENT`` (see ``inject_env``)."""
    import os

    if "TRACEPARENT" not in os.environ:
        return None
    carrier = {"traceparent": os.environ["TRACEPARENT"], "tracestate": os.environ.get("TRACESTATE", "")}
    ctx = otel_trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    return ctx if ctx.is_valid else None


def _state() -> TracingState | None:
    runtime = _slot.get()
    return None if runtime is None else tracing_of(runtime)


def tracing_of(runtime: _slot.Runtime) -> TracingState:
    """The runtime's tracing state, typed (the core's ``Runtime`` protocol cannot name it)."""
    state: TracingState = runtime.tracing
    return state


_recorder: Recorder | None = None
"""The runtime slot's recorder (``Tracer.step``/``stop`` append the step's phases to it), followed as
``metrics.recording`` follows it: one global read."""


def _follow(recorder: Recorder | None, disabled: bool) -> None:
    global _recorder
    _recorder = recorder


_slot.watch(_follow)


_names: dict[str, dict[str, tuple[str, str, str]]] = {}
"""Metric and span names of each (prefix, phase), by prefix then phase (two lookups of strings,
whose hashes are cached, cost less than hashing a tuple each call)."""
_NO_PHASES: dict[str, tuple[str, str, str]] = {}


def _phase_names(prefix: str, name: str) -> tuple[str, str, str]:
    phases = _names.get(prefix)
    if phases is None:
        phases = _names[prefix] = {}
    found = phases.get(name)
    if found is None:
        found = phases[name] = (*phase_keys(prefix, name), f"{prefix}/{name}")
    return found


_total_names: dict[str, tuple[str, str]] = {}


def _total_names_of(prefix: str) -> tuple[str, str]:
    found = _total_names[prefix] = phase_keys(prefix, None)
    return found


def _cuda() -> Any:
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() else None


def _check(prefix: str, timer: str) -> None:
    if timer not in ("cpu", "gpu"):
        raise ValueError(f"trace({prefix!r}): timer must be 'cpu' or 'gpu', got {timer!r}")
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"trace: prefix must be a non-empty string, got {prefix!r}")


class Tracer:
    """``start()``, ``step(name)`` after each phase, ``stop()``: spans plus duration metrics.

    Args:
        prefix: the block's name (span name and metric prefix).
        track_memory: also record CUDA memory (peak and end-minus-start). The peak is the
            process's high-water mark at the end, which is this block's own peak whenever the
            block set a new high; rankscope never resets the peak, so nested blocks and other
            users of ``torch.cuda.max_memory_allocated`` stay correct.
        timer: ``"cpu"`` or ``"gpu"`` (CUDA events; CPU timing with one warning without CUDA).

    On the caller's thread a CPU-timed block reads the clock at each mark and appends one tuple
    per phase (and one at ``stop``) to the step's phases; their durations and spans are made on the
    export thread (``Recorder.resolve_phases``, ``phase_spans``). What it must do at once is make
    its ``Block`` the current OTel span, so the user's own spans nest under it.
    """

    __slots__ = (
        "_gpu",
        "_last",
        "_last_mark",
        "_memory",
        "_scope",
        "_start_mark",
        "_started",
        "_state",
        "_token",
        "prefix",
        "timer",
        "track_memory",
    )

    def __init__(self, prefix: str, track_memory: bool = False, timer: str = "cpu") -> None:
        if type(prefix) is not str or not prefix or (timer != "cpu" and timer != "gpu"):
            _check(prefix, timer)
        self.prefix = prefix
        self.timer = timer
        self.track_memory = track_memory
        self._state: TracingState | None = None
        self._scope: Block | None = None
        self._gpu: CudaTimingProcessor | None = None
        self._start_mark: Mark | None = None
        self._last_mark: Mark | None = None
        self._token: Any = None
        self._memory: tuple[int, int] | None = None
        self._last = self._started = 0

    def start(self) -> Tracer:
        runtime = _slot.current or _slot.get()  # ``_state()``, inlined as ``step``'s lookups are
        now = perf_ns() + CLOCK_OFFSET
        self._last = self._started = now
        if runtime is None:
            self._state = self._scope = None
            return self
        state = self._state = runtime.tracing
        try:
            context = state.get_context()
            if not context and state.env_parent is None:  # no span anywhere: under the step's root span
                steps = state.steps  # ``TracingState.scope``'s fast path, inlined: a block starts on cold caches
                step = steps.explicit
                if step is None:
                    step = 0 if steps.last is None else steps.last + 1
                made = state.ahead.ready.pop((self.prefix, step), None)
                if made is not None:  # made on the export thread (``BlocksAhead``)
                    block, entered = made
                    block.start = now
                else:
                    state.ahead.seen(self.prefix)
                    trace_id, up, sampled = state._ids.get(step) or state._add_ids(step)
                    block = Block(self.prefix, trace_id, random_id(64) or 1, up, sampled, step, now)
                    entered = Context({_SPAN_KEY: block, _SCOPE_KEY: block})
                self._scope = block
                self._token = state.attach(entered)
            else:
                parent = state.scope(context)
                block = Block(
                    self.prefix, parent.trace_id, random_id(64) or 1, parent.parent_id, parent.sampled, parent.step, now
                )
                self._scope = block
                if parent.caller is not None and (span := block.record()) is not None:
                    span.attributes[attr.CALLER] = parent.caller  # type: ignore[index]
                self._token = state.attach(_entered(block, context))
            if state.step_started_ns is None:  # ``note_start``
                state.step_started_ns = now
            if self.timer == "gpu":
                self._gpu = state.gpu()
                if self._gpu is not None:
                    self._start_mark = self._last_mark = self._gpu.mark()
            if self.track_memory and (cuda := _cuda()) is not None:
                self._memory = (cuda.memory_allocated(), cuda.max_memory_allocated())
        except Exception as exc:
            report_internal_error("trace start", exc)
        return self

    def step(self, name: str) -> None:
        """Close the phase ``name``: the time since ``start()`` or the previous ``step``."""
        now = perf_ns() + CLOCK_OFFSET
        if type(name) is not str:  # None marks the block's own end in a phase tuple
            name = str(name)
        r = _recorder  # ``defer_phase``, inlined: called between cold caches
        if r is not None and r.fast and self._gpu is None:
            r.phases.append((self.prefix, name, self._last, now, self._scope))
            self._last = now  # its durations and its span are made on the export thread
            return
        self._step_now(name, now)

    def _step_now(self, name: str, now: int) -> None:
        """A phase whose durations are recorded now (values streamed, a GPU timer, rankscope off)."""
        avg_key, max_key, span_name = _names.get(self.prefix, _NO_PHASES).get(name) or _phase_names(self.prefix, name)
        gpu = self._gpu
        mark = gpu.mark() if gpu is not None else None
        if mark is None or self._last_mark is None:
            seconds = (now - self._last) / 1e9
            record_metric(avg_key, seconds, _MEAN)
            record_metric(max_key, seconds, _MAX)
        else:
            defer_gpu_duration(avg_key, max_key, self._last_mark, mark, gpu)
        block = self._scope
        if block is not None and block.sampled:
            span = SpanRecord(span_name, block.trace_id, random_id(64) or 1, block.parent_id, self._last, now)
            span.attributes = {_STEP: block.step}
            if gpu is not None:
                gpu.submit(span, self._last_mark, mark)
            else:
                self._state.buffer.add(span)  # type: ignore[union-attr]  # the processor's only stage
        self._last = now
        self._last_mark = mark

    def stop(self, error: BaseException | None = None) -> None:
        """Close the block: total duration, memory, and its span (status error with ``error``)."""
        now = perf_ns() + CLOCK_OFFSET
        block = self._scope
        r = _recorder
        if (
            r is not None
            and r.fast
            and error is None
            and self._gpu is None
            and self._memory is None
            and (block is None or block.span is None)
        ):  # the total's durations and the block's span are made on the export thread
            r.phases.append((self.prefix, None, self._started, now, block))
        else:
            self._stop_now(now, error)
        token, self._token = self._token, None
        if token is None:
            return
        if type(token) is not contextvars.Token:  # ``leave_scope``, inlined
            otel_context.detach(token)
            return
        try:
            token.var.reset(token)
        except (ValueError, RuntimeError):  # left in another context (another asyncio task)
            return

    def _stop_now(self, now: int, error: BaseException | None) -> None:
        block = self._scope
        span = block.record() if block is not None else None
        gpu = self._gpu
        end_mark = gpu.mark() if gpu is not None else None
        prefix = self.prefix
        if end_mark is not None and self._start_mark is not None and gpu is not None:
            defer_gpu_duration(
                f"{prefix}/total_duration_avg_s", f"{prefix}/total_duration_max_s", self._start_mark, end_mark, gpu
            )
        elif not defer_phase(prefix, None, self._started, now, None):  # the block's own span is below
            seconds = (now - self._started) / 1e9
            avg_key, max_key = _total_names.get(prefix) or _total_names_of(prefix)
            record_metric(avg_key, seconds, _MEAN)
            record_metric(max_key, seconds, _MAX)
        if self._memory is not None and (cuda := _cuda()) is not None:
            allocated, peak_before = self._memory
            peak = cuda.max_memory_allocated()
            delta = (cuda.memory_allocated() - allocated) / _GB
            record_metric(f"{prefix}/memory_peak_max_gb", peak / _GB, _MAX)
            record_metric(f"{prefix}/memory_delta_end_start_avg_gb", delta, _MEAN)
            if span is not None:
                span.attributes[attr.MEMORY_PEAK_GB] = peak / _GB  # type: ignore[index]
                span.attributes[attr.MEMORY_PEAK_EXACT] = peak > peak_before  # type: ignore[index]
                span.attributes[attr.MEMORY_DELTA_GB] = delta  # type: ignore[index]
        if span is not None:
            span.end_time = now
            if error is not None:
                span.fail(error, now)
            if gpu is not None:
                gpu.submit(span, self._start_mark, end_mark)
            else:
                self._state.buffer.add(span)  # type: ignore[union-attr]  # the processor's only stage


def phase_spans(phases: list[Phase]) -> list[SpanRecord]:
    """The spans of a step's deferred phases and blocks (``Tracer.step``/``stop``), when sampled:
    made on the export thread as it takes the step (and for a step refused at its flush)."""
    spans = []
    for prefix, name, start, end, block in phases:
        if block is None or not block.sampled:
            continue
        if name is None:  # the block's end: its own span
            span = block.record()
            assert span is not None  # sampled
            span.end_time = end
        else:
            span = SpanRecord(f"{prefix}/{name}", block.trace_id, random_id(64) or 1, block.parent_id, start, end)
            span.attributes = {_STEP: block.step}
        spans.append(span)
    return spans


class trace:  # noqa: N801 - Forge's name
    """``with trace("step") as t: ...`` or ``@trace("reward")`` on sync and async functions.

    An exception inside still ends the span (status error, an ``exception`` event) and
    records the durations; the exception propagates.
    """

    def __init__(self, prefix: str, track_memory: bool = False, timer: str = "cpu") -> None:
        _check(prefix, timer)  # at the call site, not at first use
        self._args = (prefix, track_memory, timer)
        self._tracer: Tracer | None = None

    def __enter__(self) -> Tracer:
        self._tracer = Tracer(*self._args).start()
        return self._tracer

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        assert self._tracer is not None
        self._tracer.stop(exc)

    def __call__(self, fn: F) -> F:
        args = self._args
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*a: Any, **kw: Any) -> Any:
                tracer = Tracer(*args).start()
                try:
                    result = await fn(*a, **kw)
                except BaseException as exc:
                    tracer.stop(exc)
                    raise
                tracer.stop()
                return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*a: Any, **kw: Any) -> Any:
            tracer = Tracer(*args).start()
            try:
                result = fn(*a, **kw)
            except BaseException as exc:
                tracer.stop(exc)
                raise
            tracer.stop()
            return result

        return run  # type: ignore[return-value]


def record_event(name: str, **attributes: Any) -> None:
    """Record an instant event: a zero-length span under the current span (or the step root).

    A span rather than a span event, so it shows on every rank's timeline (Jaeger, Perfetto)
    even outside any ``trace`` block. Attribute values must be str, bool, int or float.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"record_event: name must be a non-empty string, got {name!r}")
    for key, value in attributes.items():
        if not isinstance(value, (str, bool, int, float)):
            raise TypeError(f"record_event({name!r}): attribute {key!r} must be str, bool, int or float, got {value!r}")
    state = _state()
    if state is None:
        return
    scope = state.scope()
    now = now_ns()
    state.note_start(now)
    if scope.sampled:
        span = SpanRecord(name, scope.trace_id, random_id(64) or 1, scope.parent_id, now, now)
        span.attributes = {attr.STEP: scope.step, **attributes}
        state.processor.on_end(span)


def open_span(name: str, attributes: dict[str, Any] | None = None) -> SpanRecord | None:
    """An instrumentor's span, started now under the current span (or the step root).

    Not made current (instrumented operations have no children). None when not sampled;
    finish it with ``close_span``. A step left pending by ``auto_step`` closes first.
    """
    runtime = _slot.get()
    if runtime is None:
        return None
    if runtime.steps.auto_pending:
        runtime.settle_auto_step()
    state = tracing_of(runtime)
    if state is None:
        return None
    scope = state.scope()
    now = now_ns()
    state.note_start(now)
    if not scope.sampled:
        return None
    span = SpanRecord(name, scope.trace_id, random_id(64) or 1, scope.parent_id, now, 0)
    span.attributes = {attr.STEP: scope.step, **attributes} if attributes else {attr.STEP: scope.step}
    return span


def close_span(span: SpanRecord, end_ns: int | None = None, error: BaseException | None = None) -> None:
    """End an ``open_span`` span (status error with ``error``) and queue it for export."""
    end = now_ns() if end_ns is None else end_ns
    span.end_time = end
    if error is not None:
        span.fail(error, end)
    runtime = _slot.current
    if runtime is not None:
        tracing_of(runtime).processor.on_end(span)


def link_active_span(contexts: list[tuple[int, int]], limit: int, name: str = "rl/consume") -> int:
    """Add OTel links to ``contexts`` (trace id, span id) to the span active here, or, outside any
    recorded span, to a zero-length ``name`` span under the step root. At most ``limit`` links
    per span: beyond it a uniform random choice is kept and the rest counted (returned, and in
    the span's ``rankscope.links.dropped``). Nothing happens when the step is not sampled."""
    current = otel_trace.get_current_span()
    span = None
    if isinstance(current, SpanScope):  # else a user's own OTel span is current: not ours to change
        span = current.record() if isinstance(current, Block) else current.span
    opened = None
    if span is None:
        span = opened = open_span(name)
        if span is None:
            return 0
    have = span.links or []
    known = set(have)
    fresh = [c for c in dict.fromkeys(contexts) if c not in known and c[0] and c[1]]
    room = max(0, limit - len(have))
    chosen = fresh if len(fresh) <= room else random.sample(fresh, room)
    dropped = len(fresh) - len(chosen)
    span.links = have + chosen
    if dropped:
        attributes = span.attributes if span.attributes is not None else {}
        attributes[attr.LINKS_DROPPED] = int(attributes.get(attr.LINKS_DROPPED, 0)) + dropped
        span.attributes = attributes
    if opened is not None:
        close_span(opened)
    return dropped


def current_gpu_timer() -> CudaTimingProcessor | None:
    """The process's CUDA-event processor (None without CUDA or before init)."""
    state = _state()
    return None if state is None else state.gpu()


def set_step(step: int) -> None:
    """Say which step the spans from now on belong to (until the next ``flush``).

    Optional: without it the step in progress is the one after the last flushed step (0 at start).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"set_step(step): step must be a non-negative int, got {step!r}")
    runtime = _slot.get()
    if runtime is not None:
        runtime.steps.explicit = step  # the one step clock: current_step() says the same


def inject_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ``os.environ``) plus ``TRACEPARENT``/``TRACESTATE`` for a child process.

    ``subprocess.Popen(cmd, env=rs.inject_env())`` run inside a ``trace`` block makes the
    child's spans children of that block's span.
    """
    import os

    out = dict(os.environ if env is None else env)
    state = _state()
    carrier: dict[str, str] = {}
    if state is not None:
        scope = state.scope()
        flags = _SAMPLED if scope.sampled else _NOT_SAMPLED
        ctx = otel_trace.set_span_in_context(
            NonRecordingSpan(SpanContext(scope.trace_id, scope.parent_id, False, flags))
        )
        TraceContextTextMapPropagator().inject(carrier, context=ctx)
    for key, value in carrier.items():
        out[key.upper()] = value
    return out


__all__ = ["Tracer", "inject_env", "record_event", "set_step", "trace"]
