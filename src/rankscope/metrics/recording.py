"""``record_metric``: the hot path, from any function of any process.

A value for a key already seen this step costs one global read (this module's copy of the runtime
slot's recorder), a dict lookup and an ``append`` on a slotted accumulator (for MEAN, the default,
two additions in place). A key's first value of a step costs the same when its reduce is MEAN, STD
or COUNT (the step starts with the accumulators the export thread reset, ``Recorder.recycle``);
of another reduce, it takes a reset one from the spares instead of building one. A CUDA tensor of
the kind already checked under its key (type, reduce, dtype) is checked for one element and kept
by reference: four tensor attribute reads, no sync. Everything else (first use of a key, a changed
reduce type, other tensors, streaming, auto-init) goes through ``Recorder.record``. Flush hooks run
before a step is closed, so gauges sampled there (memory, rates) land in the step they describe.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from numbers import Real
from typing import Any

from ..core import runtime as _slot
from ..core.errors import report_internal_error, warn_once
from .recorder import Recorder
from .reduce import MeanAccumulator as _MeanAccumulator
from .reduce import Reduce
from .samples import check_row, check_selection
from .values import as_metric_name

_MEAN = Reduce.MEAN


def record_metric(key: str, value: Any, reduce: Reduce = _MEAN) -> None:
    """Record ``value`` under ``key``; reduced per step by ``reduce`` (default MEAN).

    Callable from any function of any process. Raises ``TypeError``/``ValueError`` naming
    the key for a non-numeric or multi-element value, an empty or invalid key, or a key
    already recorded with another reduce type. CUDA tensors are not synchronized here.
    """
    r = _recorder
    if r is None:
        if _disabled:
            return
        runtime = _slot.get()
        if runtime is None:
            return
        r = runtime.recorder
    if r.fast and (type(value) is float or type(value) is int):
        acc = r.accs.get(key)
        if acc is None:  # the key's first value of the step: a spare from the last exported step
            acc = r.spare.pop(key, None)
            if acc is not None and acc.reduction_type is reduce:
                r.accs[key] = acc
                if type(acc) is _MeanAccumulator:  # as below: no method call
                    acc.sum += value
                    acc.count += 1
                else:
                    acc.append(value)
                return
        elif acc.reduction_type is reduce:
            if type(acc) is _MeanAccumulator:  # the default reduce, added in place: no method call
                acc.sum += value
                acc.count += 1
            else:
                acc.append(value)
            return
    if _is_compiling():  # torch.compile tracing: telemetry stays out of the graph
        return
    kind = r.device_kinds.get(key)
    if (
        kind is not None  # a CUDA tensor was checked in full under this key: one of its kind is kept as is
        and r.fast
        and type(value) is kind[0]
        and kind[1] is reduce
        and value.is_cuda
        and value.dtype is kind[2]
        and value.numel() == 1
    ):
        # kept for the flush's batched copy; detached, so no autograd graph is kept alive
        r.device.items.append((key, value.detach() if value.requires_grad else value))
        if key not in r.accs:
            r.accs[key] = r.fresh(key, reduce)
        return
    r.record(key, value, reduce)


def record_logged(key: str, value: Any, reduce: Reduce = _MEAN, *, source: str) -> None:
    """A number a framework logged (Lightning, Transformers, TRL, verl, torchtitan), recorded under
    a valid metric name (``as_metric_name``: ``throughput(tps)`` is ``throughput_tps``) and never
    raised into the framework's loop: a key with no valid name, or one ``record_metric`` refuses
    (two reduce types for one key), is skipped with one warning naming ``source``. Non-numbers
    (strings, tables) are skipped: the framework logged them for other backends."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return
    name = as_metric_name(str(key))
    if name is None:
        warn_once(f"{source}: {key!r} has no valid metric name; not recorded")
        return
    try:
        record_metric(name, float(value), reduce)
    except (TypeError, ValueError) as exc:
        warn_once(f"{source}: {key!r} not recorded: {exc}")


def record_sample(table: str, row: Mapping[str, Any], *, rank_by: str | None = None, k: int = 8) -> None:
    """Offer ``row`` to this step's sample table ``table``; the experiment keeps, exactly across
    every process, the k rows with the highest and the k with the lowest ``rank_by`` value, or
    (no ``rank_by``) a uniform random sample of k rows.

    ``row`` maps field names to str, int, float or bool; strings longer than 4,096 characters
    are cut and marked. Each kept row gets provenance columns (step, role, replica, rank,
    policy version, trace and span id of the active span, record time). Raises ``TypeError``
    or ``ValueError`` naming the table for a bad row, ``rank_by`` or ``k``.
    """
    r = _recorder
    if r is None:
        runtime = None if _disabled else _slot.get()
        if runtime is None:  # off: the row is still checked, so a bad one fails the same way
            check_selection(table, rank_by, k)
            check_row(table, row)
            return
        r = runtime.recorder
    r.sample(table, row, rank_by, k)


def record_weighted_mean(key: str, value: float, weight: int) -> None:
    """``key`` (MEAN) weighted: the step's value is sum(value * weight) / sum(weight), across processes."""
    runtime = None if _disabled else _slot.get()
    if runtime is not None and weight > 0:
        recorder: Recorder = runtime.recorder
        recorder.record_weighted(key, value, weight)


_recorder: Recorder | None = None
_disabled = False


def _follow(recorder: Recorder | None, disabled: bool) -> None:
    global _recorder, _disabled
    _recorder, _disabled = recorder, disabled


_slot.watch(_follow)


def _never() -> bool:
    return False


_is_compiling: Callable[[], bool] = _never


def bind_compile_check() -> bool:
    """Once torch is imported, ``record_metric`` stays out of ``torch.compile`` graphs; True once it does."""
    global _is_compiling
    torch = sys.modules.get("torch")
    if torch is not None and _is_compiling is _never:
        _is_compiling = torch.compiler.is_compiling
    return _is_compiling is not _never


def defer_phase(prefix: str, name: str | None, start: int, end: int, block: Any) -> bool:
    """A CPU-timed ``Tracer`` phase (``name`` None: the whole block): one append here; its two
    durations and, with its ``block`` sampled, its span are made on the export thread
    (``Recorder.resolve_phases``, ``tracing.tracer.phase_spans``). False (do it now) while values are
    streamed as they come or the export thread waits for a periodic step, and when rankscope is off.
    (``Tracer.step`` and ``stop`` inline it.)"""
    r = _recorder
    if r is None or not r.fast:
        return False
    r.phases.append((prefix, name, start, end, block))
    return True


def defer_gpu_duration(avg_key: str, max_key: str, start: Any, end: Any, processor: Any) -> None:
    """A ``timer="gpu"`` phase: its duration is read from CUDA events on the export thread."""
    r = _slot.recorder
    if r is not None:
        r.defer(avg_key, max_key, start, end, processor)


flush_hooks: list[Callable[[], None]] = []
"""What ``add_flush_hook`` registered (a flush checks it is empty before calling ``run_flush_hooks``)."""


def add_flush_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` at every flush, before the step is closed (instrumentors sample gauges there)."""
    if hook not in flush_hooks:
        flush_hooks.append(hook)


def remove_flush_hook(hook: Callable[[], None]) -> None:
    if hook in flush_hooks:
        flush_hooks.remove(hook)


def run_flush_hooks() -> None:
    for hook in tuple(flush_hooks):
        try:
            hook()
        except Exception as exc:
            report_internal_error(f"flush hook {getattr(hook, '__qualname__', hook)}", exc)
