"""Per-process metric state: what ``record_metric`` writes and ``flush`` hands off.

The hot path (``metrics.recording.record_metric``) touches only ``Recorder.accs``: a dict lookup
and an ``append`` on a slotted accumulator (a MEAN key's first value of a step included: the step
starts with the reset accumulators of an exported one, ``Recorder.recycle``), and, for a CUDA
tensor of a kind checked before, one append to ``Recorder.device``. Everything else (first use of
a key, type checks, other device tensors, streaming) goes through ``Recorder.record``.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from ..core.errors import warn_once
from .catalog import phase_keys
from .reduce import (
    CountAccumulator,
    LastAccumulator,
    MaxAccumulator,
    MeanAccumulator,
    MetricAccumulator,
    MinAccumulator,
    Reduce,
    StdAccumulator,
    SumAccumulator,
)
from .samples import MAX_TABLES, Provenance, Row, TableSample, check_row, check_selection
from .values import check_key, to_number

StreamSink = Callable[[str, float, Reduce, float], None]
Phase = tuple[str, str | None, int, int, Any]
"""A traced phase: its block's prefix, its name (None: the whole block), start and end (ns), and the
block (``tracing.tracer.Block``: its span and the phases' parent) or None."""
RowSink = Callable[[str, Row, Provenance], None]


@dataclass(slots=True)
class DeviceValues:
    """1-element device tensors of one step, copied to the host in one batch per device.

    ``record_metric`` only keeps a reference (no reshape, no copy: each is a launch-side torch
    call of a microsecond or more; a tensor that requires grad is detached). ``start`` runs on the caller's thread at
    flush: under ``no_grad`` it stacks the step's tensors in one call per (device, rank of
    shape, dtype) group, converts them to float64, and queues one asynchronous copy per device
    into pinned memory plus a CUDA event, so flush never waits for the GPU. ``values`` runs on
    the export thread and waits for that event there. Until the flush the step holds the
    recorded tensors.
    """

    items: list[tuple[str, Any]] = field(default_factory=list)
    """(key, tensor), one append each: a take on another thread never splits a key from its tensor."""
    times: list[float] = field(default_factory=list)
    """Record times, only while values are streamed (``Recorder.stream_device_values``)."""
    keys: list[str] = field(default_factory=list)
    """The keys of the values ``start`` copied, in ``values``' order."""
    _copies: list[tuple[list[int], Any, Any]] = field(default_factory=list)

    def start(self) -> None:
        torch = sys.modules["torch"]
        items, self.items = self.items, []  # drop references to the originals; the stacked copies live on
        self.keys = [key for key, _ in items]
        tensors = [tensor for _, tensor in items]
        groups: dict[Any, dict[tuple[int, Any], list[int]]] = {}
        for i, tensor in enumerate(tensors):
            groups.setdefault(tensor.device, {}).setdefault((tensor.dim(), tensor.dtype), []).append(i)
        with torch.no_grad():
            for device, by_shape in groups.items():
                indices: list[int] = []
                parts = []
                for members in by_shape.values():  # to float64 per group: cat would round first
                    parts.append(torch.stack([tensors[i] for i in members]).reshape(-1).to(torch.float64))
                    indices.extend(members)
                stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
                if device.type == "cuda":
                    host = torch.empty(stacked.shape, dtype=torch.float64, pin_memory=True)
                    host.copy_(stacked, non_blocking=True)
                    event = torch.cuda.Event(blocking=True)  # its waiter sleeps: a spinning one burns a core
                    event.record(torch.cuda.current_stream(device))  # the copy's stream, on any GPU
                    self._copies.append((indices, host, event))
                else:  # other accelerators (and CPU): copy on the export thread
                    self._copies.append((indices, stacked, None))

    def values(self) -> list[float]:
        out = [0.0] * len(self.keys)
        for indices, host, event in self._copies:
            if event is not None:
                event.synchronize()
            for i, v in zip(indices, host.cpu().tolist(), strict=True):
                out[i] = v
        return out


@dataclass(slots=True)
class StepBatch:
    """Everything one process recorded for one step (``step`` None: a periodic export)."""

    step: int | None
    start_time_unix_nano: int
    """When the step began (the last step's take, else the recorder's start); a periodic export's
    data is sent from the previous export's end (``encode_steps``)."""
    time_unix_nano: int
    accs: dict[str, MetricAccumulator]
    device: DeviceValues | None
    expected: int = 0
    """Processes a controller flushed with this step (itself included); 0 when not a controller."""
    driven: bool = False
    """Closed by a Monarch controller's flush (the sink then also waits for that controller)."""
    deferred: list[tuple[str, str, Any, Any, Any]] | None = None
    """GPU-timed durations (avg key, max key, start mark, end mark, processor), read on the export thread."""
    held_points: int = 0
    """Points this step holds in the export queue's bound (set when it is queued)."""
    samples: list[TableSample] | None = None
    """Sample tables of the step (``record_sample``): each table's pre-selection of at most 2k rows."""
    phases: list[Phase] | None = None
    """CPU-timed ``Tracer`` phases of the step: their durations (and spans) are made on the export thread."""
    root_span: tuple[int, int] | None = None
    """The step's root span's start and end (ns), when this process emits it (made on the export thread)."""


Durations = tuple[tuple[tuple[str, Reduce], ...], float]
"""A duration's keys (its MEAN's and MAX's, with their reduce types) and its seconds."""

HandedStep = tuple[int, int, int, dict[str, MetricAccumulator], list[Phase] | None, tuple[int, int] | None]
"""A flushed step of host values and phases as the caller hands it over (``Recorder.hand_off``):
(step, start ns, end ns, accumulators, phases, root span); the export thread makes its batch."""


def as_batch(handed: HandedStep) -> StepBatch:
    """The ``StepBatch`` of a handed-over step (export thread, or a refused step's caller)."""
    step, start, end, accs, phases, root_span = handed
    return StepBatch(step, start, end, accs, None, phases=phases, root_span=root_span)


class Recorder:
    """Accumulators of the step in progress plus the process-lifetime key registry.

    The hot path's state (named so as not to be confused with the OpenTelemetry Collector)."""

    __slots__ = (
        "_asked_at",
        "_deferred",
        "_export_keys",
        "_lock",
        "_lower",
        "_phase_keys",
        "_reduce_of",
        "_spares",
        "_step_start",
        "_streams",
        "_tables",
        "accs",
        "device",
        "device_kinds",
        "fast",
        "on_take",
        "phases",
        "provenance",
        "rng",
        "row_streams",
        "samples",
        "spare",
    )

    def __init__(self, streams: list[StreamSink]) -> None:
        self.accs: dict[str, MetricAccumulator] = {}
        """The step's accumulators by key: what it recorded, and the reset ``PREFILLED`` ones of an
        exported step that it started with (``recorded`` leaves those out until a value reaches them)."""
        self.spare: dict[str, MetricAccumulator] = {}
        """Reset accumulators of an exported step, of the other reduce types, by key: a key's first
        value of the step in progress takes one from here instead of building one (``recycle``)."""
        self._spares: list[tuple[dict[str, MetricAccumulator], dict[str, MetricAccumulator]]] = []
        """Recycled steps waiting to serve a later step (at a take): each its ``PREFILLED``
        accumulators (the next step's ``accs``) and the others (its ``spare``). The export thread
        appends, the caller pops, each whole (list append and pop are atomic), so one request that
        carries several steps refills every one of the next steps, not only the first."""
        self._reduce_of: dict[str, Reduce] = {}
        self._lower: dict[str, str] = {}
        self.device = DeviceValues()
        """The step's device tensors (``recording.record_metric`` appends to it directly)."""
        self.device_kinds: dict[str, tuple[Any, Reduce, Any]] = {}
        """Keys whose CUDA tensor was checked in full: its (type, reduce, dtype). A later tensor of
        that kind takes ``recording.record_metric``'s device path: its one-element check, no more."""
        self._deferred: list[tuple[str, str, Any, Any, Any]] = []
        self._export_keys: set[str] = set()
        """Keys whose accumulators the export thread makes (deferred phases' durations): never recycled
        into the caller's spares, which would only hold them until the caller's thread frees them."""
        self._phase_keys: dict[tuple[str, str | None], tuple[tuple[str, Reduce], ...]] = {}
        """Each (prefix, phase)'s duration keys (``resolve_phases``, on the export thread)."""
        self.phases: list[Phase] = []
        """The step's CPU-timed phases (``Tracer.step``/``stop``: one append on the caller's thread)."""
        self._streams = streams
        # The hot path may skip ``record`` only when nothing else must see the value.
        self.fast = not streams
        self._step_start = time.time_ns()
        """When the step in progress began: the last step's take, else this recorder's start. A periodic
        export (a process that has not flushed yet) does not move it: it had made the first step's
        time the gap since that export (160 µs under torchrun, whose first collective served an ask)."""
        self._lock = threading.Lock()
        self._asked_at: float | None = None
        self.on_take: Callable[[StepBatch], None] | None = None
        """Where a periodic step taken on the caller's thread goes (the export thread's ``submit``)."""
        self.samples: dict[str, TableSample] = {}
        """The step's sample tables (``record_sample``)."""
        self._tables: dict[str, tuple[str | None, int]] = {}
        self.rng = random.Random()
        """Reservoir priorities (seeded by ``RANKSCOPE_SAMPLE_SEED`` for reproducible samples)."""
        self.provenance: Callable[[], Provenance] = _untraced
        """Stamps a row where it is recorded (the runtime's tracing gives the active span)."""
        self.row_streams: list[RowSink] = []
        """Every recorded row goes here too (``per_rank_no_reduce`` views)."""

    def set_streams(self, streams: list[StreamSink]) -> None:
        self._streams = streams
        self.fast = not streams and self._asked_at is None

    def record(self, key: str, value: Any, reduce: Reduce) -> None:
        """Full path: validate, convert, accumulate, stream. Raises on user errors, and then
        leaves nothing behind (no empty accumulator is exported for a refused value)."""
        if self._asked_at is not None:  # the export thread asked for a periodic step
            self._serve_periodic()
        if reduce is _SAMPLE:  # Forge's form: a row dict; ranked by its reward when it has one
            rank_by, k = self._tables.get(key) or (_forge_rank_by(value), 8)
            self.sample(key, value, rank_by, k)
            return
        known = self._reduce_of.get(key)
        if known is reduce and (type(value) is float or type(value) is int) and not self._streams:
            # A known key's first value of the step (the fast path found no accumulator yet).
            acc = self.accs.get(key)
            if acc is None:
                acc = self.accs[key] = self.fresh(key, reduce)
            acc.append(float(value))
            return
        if known is None:
            self._register(key, reduce)
        elif known is not reduce:
            raise ValueError(
                f"record_metric({key!r}): recorded with {known!r} before, now with {reduce!r}; "
                "one key has one reduce type per process"
            )
        number = to_number(key, value)
        if type(number) is float:
            acc = self.accs.get(key)
            if acc is None:
                acc = self.accs[key] = self.fresh(key, reduce)
            acc.append(number)
            if self._streams:
                now = time.time()
                for stream in self._streams:
                    stream(key, number, reduce, now)
            return
        # A device tensor: read at flush, streamed then with its record time.
        if number.is_cuda:
            self.device_kinds[key] = (type(number), reduce, number.dtype)
        if key not in self.accs:
            self.accs[key] = self.fresh(key, reduce)
        device = self.device
        device.items.append((key, number.detach() if number.requires_grad else number))
        if self._streams:
            device.times.append(time.time())

    def fresh(self, key: str, reduce: Reduce) -> MetricAccumulator:
        """An empty accumulator for ``key``: a recycled one when there is one (``recycle``)."""
        acc = self.spare.pop(key, None)
        if acc is None and self._spares:  # a step recycled since this one began
            self._next_spare()
            acc = self.spare.pop(key, None)
        return acc if acc is not None and acc.reduction_type is reduce else reduce.accumulator_class(reduce)

    def recycle(self, accs: dict[str, MetricAccumulator]) -> None:
        """The export thread is done with a step's accumulators (encoded, given to the local views):
        the built-in ones are reset and serve a later step. Building an accumulator costs the
        training thread ~250 ns per key and step, taking one from a spare dict ~130 ns; a reset here
        costs the export thread about as much, off the training thread. The ``PREFILLED`` ones wait
        in that step's ``accs`` itself, so a key's first value of the step costs what a later one
        does (``drop_unrecorded`` takes out the ones no value reached). An accumulator is only ever
        in one place: the step in progress, a step being exported, or the spares."""
        waiting = self._spares
        if waiting and sum(len(a) + len(b) for a, b in waiting) + len(accs) > MAX_SPARE_ACCUMULATORS:
            return  # at least one step waits, whatever its size
        prefill: dict[str, MetricAccumulator] = {}
        spare: dict[str, MetricAccumulator] = {}
        made_here = self._export_keys
        for key, acc in accs.items():
            kind = type(acc)
            if kind is MeanAccumulator:  # most keys: its ``reset`` inlined (a third of this loop's cost)
                if key not in made_here:
                    acc.sum, acc.count = 0.0, 0  # type: ignore[attr-defined]
                    prefill[key] = acc
            elif kind in RECYCLED and key not in made_here:
                acc.reset()
                if kind in PREFILLED:
                    prefill[key] = acc
                else:
                    spare[key] = acc
        self._spares.append((prefill, spare))

    def drop_unrecorded(self, batch: StepBatch) -> int:
        """Take out of a flushed step the recycled accumulators it started with that no value reached
        (export thread, before anything reads the step); how many. They are not recycled again: a
        key the step did not record is not waited for in the next one either."""
        accs = batch.accs
        # Usually every key got a value: two passes of C calls say so (a built-in state without
        # ``count`` reads 1; a user's type is never read: its ``count`` is its own), ~50 ns a key
        # against ~90 for the scan below, on caches the step's compute has cooled.
        values = list(accs.values())
        if RECYCLED.issuperset(map(type, values)) and all(map(getattr, values, repeat("count"), repeat(1))):
            return 0
        # a snapshot: another thread's late value may still add a key (the race ``take`` describes)
        empty = [key for key, acc in tuple(accs.items()) if type(acc) in PREFILLED and not acc.count]  # type: ignore[attr-defined]
        if empty and batch.device is not None:  # values still on their way from the device (a refused step)
            device = set(batch.device.keys)
            empty = [key for key in empty if key not in device]
        for key in empty:
            accs.pop(key, None)
        return len(empty)

    def _next_spare(self) -> None:
        """The newest recycled step becomes the spares, mid-step (a first value found none: the step
        began before it was recycled). Two threads may both see one waiting (a flush and another
        thread's first value): one of them takes it, the other keeps its spares."""
        try:
            prefill, spare = self._spares.pop()
        except IndexError:  # the other thread took the last one
            return
        spare.update(prefill)  # served from the spares too: ``accs`` holds only what this step recorded so far
        self.spare = spare

    def recorded(self) -> dict[str, MetricAccumulator]:
        """The step's accumulators that a value reached so far (a snapshot, for tests and probes)."""
        return {key: acc for key, acc in list(self.accs.items()) if _holds_values(acc)}

    def _pending(self) -> bool:
        """Anything but accumulators waits in the step: device values, GPU timings, phases, rows."""
        return bool(self.device.items or self._deferred or self.phases or self.samples)

    @property
    def spares_waiting(self) -> tuple[dict[str, MetricAccumulator], ...]:
        """Recycled steps not yet serving a step (oldest first), each's accumulators by key."""
        return tuple({**prefill, **spare} for prefill, spare in self._spares)

    def _register(self, key: str, reduce: Reduce) -> None:
        if not isinstance(reduce, Reduce):
            hint = ""
            if isinstance(reduce, str):  # reduce="max": say the name it was meant to be
                with contextlib.suppress(Exception):  # a broken reducer plugin does not replace this error
                    hint = f" (rankscope.Reduce.{Reduce.get(reduce).name})"
            raise TypeError(f"record_metric({key!r}): reduce must be a rankscope Reduce{hint}, got {reduce!r}")
        check_key(key)
        other = self._lower.get(key.lower())
        if other is not None:
            raise ValueError(
                f"record_metric({key!r}): metric names are case-insensitive in OpenTelemetry and "
                f"{other!r} is already recorded; use one spelling"
            )
        self._lower[key.lower()] = key
        self._reduce_of[key] = reduce

    def record_weighted(self, key: str, value: float, weight: int) -> None:
        """A MEAN value that counts ``weight`` times: ``key``'s step value is the weighted mean."""
        if self._asked_at is not None:  # the export thread asked for a periodic step
            self._serve_periodic()
        known = self._reduce_of.get(key)
        if known is None:
            self._register(key, Reduce.MEAN)
        elif known is not Reduce.MEAN:
            raise ValueError(f"record_metric({key!r}): recorded with {known!r} before, now as a weighted MEAN")
        acc = self.accs.get(key)
        if acc is None:
            acc = self.accs[key] = Reduce.MEAN.accumulator_class(Reduce.MEAN)
        acc.append_weighted(float(value), weight)  # type: ignore[attr-defined]

    def sample(self, table: str, row: Any, rank_by: str | None, k: int) -> None:
        """``record_sample``: check the row (raising at the call site) and offer it to the step's table."""
        checked = check_row(table, row)
        check_selection(table, rank_by, k)
        origin = self.provenance()
        with self._lock:  # two threads registering one table see one selection
            if table not in self._tables and len(self._tables) >= MAX_TABLES:
                raise ValueError(f"record_sample({table!r}): this process has {MAX_TABLES} sample tables (limit)")
            known = self._tables.setdefault(table, (rank_by, k))
            if known != (rank_by, k):
                raise ValueError(
                    f"record_sample({table!r}): recorded with rank_by={known[0]!r}, k={known[1]} before, "
                    f"now with rank_by={rank_by!r}, k={k}; one table has one selection"
                )
            found = self.samples.get(table)
            if found is None:
                found = self.samples[table] = TableSample(table, rank_by, k, self.rng)
            found.add(checked, origin)
        for stream in self.row_streams:
            stream(table, checked, origin)

    def defer(self, avg_key: str, max_key: str, start: Any, end: Any, processor: Any) -> None:
        """A GPU-timed duration: its value is ``elapsed_time`` of two CUDA events, read at export."""
        for key, reduce in ((avg_key, Reduce.MEAN), (max_key, Reduce.MAX)):
            known = self._reduce_of.get(key)
            if known is None:
                self._register(key, reduce)
            elif known is not reduce:
                raise ValueError(f"trace: {key!r} was recorded with {known!r} before")
        processor.hold(start, end)
        self._deferred.append((avg_key, max_key, start, end, processor))

    def take(self, step: int | None) -> StepBatch | None:
        """Hand off the current step's state and start a fresh one (caller's thread; O(1))."""
        with self._lock:
            return self._take(step)

    def hand_off(self, step: int, root_span: tuple[int, int] | None) -> HandedStep | None:
        """``take`` for a step of host values and phases only (a training loop's every step): the
        step as a plain tuple, its ``StepBatch`` made on the export thread (``as_batch``); None
        when the step holds more (device values, GPU timings, samples, a periodic ask): ``take`` it.
        After 20 ms of compute every object a flush touches is a cache miss: building the batch
        here cost the training thread ~5 µs a step in a probe (docs/benchmarks.md, "A step handed
        over as a tuple")."""
        with self._lock:
            if self._asked_at is not None or self.device.items or self._deferred or self.samples:
                return None
            accs = self.accs
            try:
                self.accs, self.spare = self._spares.pop()
            except IndexError:
                self.accs = {}
            now = time.time_ns()
            start, self._step_start = self._step_start, now
            phases: list[Phase] | None = self.phases
            if phases:
                self.phases = []
            else:
                phases = None  # not the live list: the next step's phases go there
            return step, start, now, accs, phases, root_span

    # -- periodic exports of processes that never flush ------------------------------------
    #
    # Swapping ``accs`` on the export thread while the caller appends would lose a value that
    # the caller's fast path fetched from the old dict just before the swap, and would run
    # the device copies of ``DeviceValues.start`` off the caller's thread. So the export
    # thread only *asks* (``take_periodic``): ``fast`` turns off, the caller's next
    # ``record_metric`` goes through ``record``, takes the step on its own thread and hands it
    # to ``on_take``. A caller that records nothing for ``grace`` seconds after the ask is
    # idle: then the export thread takes the step itself, under the lock that the ask, the
    # caller's take and ``take`` hold, unless device values are pending (those wait for the
    # caller, so such a step waits for the caller's next record or flush). What is left: a
    # thread stalled for the whole grace inside the fast path's three bytecodes (between
    # ``fast`` and ``append``), and, when several threads record, one thread's append racing
    # another thread's take (as with a flush from one thread while another records; a MEAN, STD or
    # COUNT key's first value of a step is such an append too, as it finds its accumulator in place).

    def take_periodic(self, grace: float) -> StepBatch | None:
        """The export thread's periodic step: ask the caller, or take it from an idle caller."""
        asked = self._asked_at
        now = time.monotonic()
        if asked is None:
            with self._lock:  # never between a take's clearing of the ask and its restoring ``fast``
                self._asked_at = now
                self.fast = False
            return None
        if now - asked < grace or self.device.items:
            return None
        with self._lock:
            if self._asked_at is None:  # the caller served it meanwhile
                return None
            return self._take(None)

    def _serve_periodic(self) -> None:
        on_take = self.on_take
        if on_take is None:  # between two runtimes (re-init): the ask stays for the next one
            return
        with self._lock:
            if self._asked_at is None:
                return
            batch = self._take(None)
        if batch is not None:
            on_take(batch)

    def _take(self, step: int | None) -> StepBatch | None:
        if self._asked_at is not None:
            self._asked_at = None
            self.fast = not self._streams
        accs = self.accs
        if step is None and not any(map(_holds_values, tuple(accs.values()))) and not self._pending():
            return None  # a periodic export of nothing: the recycled accumulators stay in place
        if self._spares:
            self.accs, self.spare = self._spares.pop()
        else:
            self.accs = {}
        now = time.time_ns()
        start = self._step_start  # a periodic batch's data overlaps the next one's: the encoder trims it
        if step is not None:
            self._step_start = now
        device: DeviceValues | None = None
        if self.device.items:
            device, self.device = self.device, DeviceValues()
        deferred = self._deferred
        if deferred:
            self._deferred = []
        phases = self.phases
        if phases:
            self.phases = []
        samples = self.samples
        if samples:
            self.samples = {}
        if device is not None:
            device.start()
        tables = list(samples.values()) if samples else None
        batch = StepBatch(step, start, now, accs, device, deferred=deferred or None, samples=tables)
        batch.phases = phases or None
        return batch

    def resolve_deferred(self, batch: StepBatch) -> None:
        """Wait for a batch's GPU-timed durations (export thread) and accumulate them."""
        durations: list[Durations] = []
        try:
            for avg_key, max_key, start, end, processor in batch.deferred or ():
                try:
                    seconds = processor.elapsed_s(start, end)
                finally:
                    processor.release(start, end)
                durations.append((((avg_key, Reduce.MEAN), (max_key, Reduce.MAX)), seconds))
        finally:  # the durations read before one that raised are kept
            _add_durations(batch.accs, durations)
        batch.deferred = None

    def resolve_phases(self, batch: StepBatch) -> None:
        """A batch's CPU-timed phases into their MEAN and MAX durations (export thread)."""
        names = self._phase_keys
        durations: list[Durations] = []
        for prefix, name, start, end, _ in batch.phases or ():
            keys = names.get((prefix, name))
            if keys is None:
                keys = names[(prefix, name)] = self._phase_durations(prefix, name)
            durations.append((keys, (end - start) / 1e9))
        _add_durations(batch.accs, durations)

    def _phase_durations(self, prefix: str, name: str | None) -> tuple[tuple[str, Reduce], ...]:
        """A phase's duration keys, registered once: a key's reduce type is fixed for good, so one
        recorded with another reduce type before is reported once, not raised (the caller has moved
        on), and left out of every later step."""
        taken = []
        for key, reduce in zip(phase_keys(prefix, name), (Reduce.MEAN, Reduce.MAX), strict=True):
            known = self._reduce_of.get(key)
            if known is None:
                try:
                    self._register(key, reduce)
                except (TypeError, ValueError) as exc:
                    warn_once(f"rankscope trace: {exc}")
                    continue
            elif known is not reduce:
                warn_once(f"rankscope trace: {key!r} was recorded with {known!r} before; phase durations are not")
                continue
            self._export_keys.add(key)
            taken.append((key, reduce))
        return tuple(taken)

    def stream_device_values(self, batch: StepBatch, values: list[float]) -> None:
        """Feed host copies of a batch's device values into its accumulators (export thread). Their
        record times are kept only while values are streamed; otherwise each has the step's end."""
        assert batch.device is not None
        times = batch.device.times
        if len(times) != len(values):  # not streamed (or streams were set mid-step)
            times = [batch.time_unix_nano / 1e9] * len(values)
        for key, value, when in zip(batch.device.keys, values, times, strict=True):
            acc = batch.accs.get(key)
            if acc is None:  # its accumulator went to the next step (a take on another thread in between)
                reduce = self._reduce_of[key]
                acc = batch.accs[key] = reduce.accumulator_class(reduce)
            acc.append(value)
            for stream in self._streams:
                stream(key, value, acc.reduction_type, when)


_SAMPLE = Reduce.SAMPLE
MAX_SPARE_ACCUMULATORS = 65_536
"""Recycled accumulators kept for later steps' first values (~6 MB; at least one step's, whatever its
size). The pool must outlast an export round: each step's come back only after its request is
sent (0.3-1 s), and a first value that finds none builds one through ``record``: ~4.5 us a key in a
training loop, mostly the cyclic GC that the training thread's allocations set off. Bounded by steps
(32) before: a 100-key loop at 5 ms steps (~80 steps a round) paid ~450 us a step inside
``record_metric`` instead of ~45."""

PREFILLED = frozenset({MeanAccumulator, StdAccumulator, CountAccumulator})
"""Recycled accumulators that wait in the next step's ``accs`` (``recycle``): their count says
whether a value reached them (a SUM, MAX, MIN or LAST one cannot tell an empty state from a
recorded 0, -inf, inf: those wait in ``spare``, taken at the key's first value)."""


def _add_durations(accs: dict[str, MetricAccumulator], durations: list[Durations]) -> None:
    """Each duration into its keys' accumulators (a MEAN and a MAX), every first key before every
    second: a step's keys then come in runs of one kind, which the encoder packs in one call each
    (``otlp.templates``); a phase's MEAN and MAX side by side went key by key, ~35 % of a 100-key
    step's encoding."""
    for position in (0, 1):
        for keys, seconds in durations:
            if position < len(keys):
                key, reduce = keys[position]
                acc = accs.get(key)
                if acc is None:
                    acc = accs[key] = reduce.accumulator_class(reduce)
                acc.append(seconds)


def _holds_values(acc: MetricAccumulator) -> bool:
    return type(acc) not in PREFILLED or acc.count > 0  # type: ignore[attr-defined]


RECYCLED = frozenset(
    {MeanAccumulator, SumAccumulator, CountAccumulator, MaxAccumulator, MinAccumulator, StdAccumulator, LastAccumulator}
)
"""Accumulator types whose reset is cheap and exact (a user's or Forge's type is never reused)."""


def _forge_rank_by(row: Any) -> str | None:
    reward = row.get("reward") if isinstance(row, dict) else None
    return "reward" if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None


def _untraced() -> Provenance:
    return Provenance(time.time_ns())
