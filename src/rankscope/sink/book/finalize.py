"""A finished step into its view: reduce every key, read the step's phases, run the detectors
(not on a step the job ended in: that one is named ``interrupted``).

``view_of`` builds a ``StepView`` (``views.step``: the views' own type) from what the step book
closed (``Finished``) and acts on nothing: it asks no process for anything and writes nothing.
What it found that calls for an action (a straggler's process to profile) rides on the view
(``StepView.stragglers``); the service acts on it (``views.captures.ask_stragglers``) before the
views write it. The detectors keep their running history (``views.anomalies.Watch``): that is
what judging a step means.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...backends.base import Metric
from ...core import names as attr
from ...core.anomalies import Corrected, Outlier, Partial, Straggler
from ...metrics.reduce import Reduce, reduced_items
from ..checked import OnError, Process, StateRows
from ..views.anomalies import Watch
from ..views.detectors.base import StepFacts
from ..views.step import StepView
from .merge import Running, holder, items, merge_rows, reduce_of, reduced
from .order import KeyOrder
from .outliers import judged_by, outliers
from .spread import spreads
from .stragglers import judge, record_of, straggler_metrics, stragglers
from .traces import TraceStore

HEAT_PROCESSES = 64
"""Processes a step's rank x phase map for people (``rankscope top``) names at most."""

MAX_VIEW_SPANS = 20_000
"""Spans a step's view carries at most, when a view asks for them (``Finished.keep_spans``)."""


@dataclass(slots=True, kw_only=True)
class Finished:
    """A step the book closed (or a late update of one): what its view is made of."""

    experiment: str
    step: int
    seq: int
    """Newest write-ahead-log record merged into the step (what a written view covers)."""
    merged: Mapping[str, Running]
    carried: Mapping[int, int] = field(default_factory=dict)
    """Time buckets the step took over, with their newest records (``Step.carried``)."""
    parts: list[tuple[Process, StateRows]]
    """Rows by process for per-process values (a late update: of processes new to the step)."""
    samples: dict[str, list[dict[str, Any]]]
    missing: list[str]
    """Processes the step waited for in vain (named in its ``missing`` record)."""
    away: list[str] = field(default_factory=list)
    """Processes named missing at an earlier step and absent from this one too: not waited for,
    not named again, but counted (the step's values lack them)."""
    late: bool = False
    arrived: list[str] = field(default_factory=list)
    """A late update's processes whose part came since the step's last view (``missing`` then
    lists those still absent)."""
    partial: bool = False
    """Late data of a step no longer kept (``book.retained``): said, never written as the step's values."""
    attempt: int = 0
    rewound: bool = False
    duration: float | None = None
    """Seconds since the previous step's window ended (the slow-step detector), if known."""
    from_start: bool = False
    """``duration`` counts from the start of the process that closed the step first (the run's
    first step: the job's set-up is in it)."""
    bucket_time: float | None = None
    """A time bucket's start (Unix seconds), when the run's steps are time buckets."""
    late_points: int = 0
    internal_errors: int = 0
    """The run's internal errors before this view (its own merge errors are added as it is built)."""
    keep_spans: bool = False
    interrupted: bool = False
    """Finalized at the job's end while processes had not closed it (Ctrl-C, a crash): its view names
    it ``interrupted`` and no detector judges it (``views.anomalies.Watch.interrupted``)."""
    failed: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """With ``interrupted``: the processes an exception ended, and their errors (``Roster.failed``)."""


class PerProcess(Mapping[Process, list[Metric]]):
    """Each process's values of one step, reduced on first use: a view that only asks how many
    processes there are (W&B past ``per_rank_max_processes``) pays nothing."""

    def __init__(
        self, parts: list[tuple[Process, StateRows]], on_error: OnError | None, order: KeyOrder | None = None
    ) -> None:
        self._parts = [(process, rows) for process, rows in parts if not process.merged]  # many processes: none's own
        self._on_error = on_error
        self._order = order
        """The keys' order in the global view: each process's view lists them the same way."""
        self._values: dict[Process, list[Metric]] | None = None

    def __len__(self) -> int:
        return len(self._computed()) if self._values is not None else len({p for p, _ in self._parts})

    def __iter__(self) -> Iterator[Process]:
        return iter(self._computed())

    def __getitem__(self, process: Process) -> list[Metric]:
        return self._computed()[process]

    def _computed(self) -> dict[Process, list[Metric]]:
        if self._values is None:
            stamp = time.time()
            states: dict[Process, dict[str, Running]] = {}
            for process, rows in self._parts:
                into = states.setdefault(process, {})
                merge_rows(into, rows.reduce, rows.keys, rows.rows, process.rank, process.label)
            values: dict[Process, list[Metric]] = {}
            for process in sorted(states, key=lambda p: (p.role, p.replica or "", p.rank)):
                metrics = values[process] = []
                own = states[process].items()
                for key, state in own if self._order is None else self._order.arrange(own):
                    reduce = reduce_of(state[0])
                    metrics.extend(Metric(n, v, reduce, stamp) for n, v in reduced_values(key, state, self._on_error))
            self._values = values
            self._parts = []
        return self._values


def reduced_values(key: str, state: Running, on_error: OnError | None) -> list[tuple[str, float]]:
    """The reduced (name, value) pairs of one key, or none if its reduce type fails on its states."""
    try:
        derived = items(key, state)
        return derived if derived is not None else reduced_items(key, reduced(state[0], state))
    except Exception as exc:  # a third-party reducer: leave the key out, keep the experiment going
        if on_error is not None:
            on_error(f"merging {key!r} ({state[0]})", exc)
        return []


def view_of(
    done: Finished,
    *,
    traces: TraceStore,
    watch: Watch,
    on_error: OnError | None = None,
    order: KeyOrder | None = None,
) -> StepView:
    """The view of a finished step (a late update: its values only), its keys in ``order``."""
    stamp = time.time()
    global_metrics: list[Metric] = []
    labels: dict[str, str] = {}
    bad: set[str] = set()
    errors = 0

    def failed(where: str, exc: BaseException) -> None:  # counted into this step's internal_errors too
        nonlocal errors
        errors += 1
        if on_error is not None:
            on_error(where, exc)

    merged: Iterable[tuple[str, Any]] = done.merged.items() if order is None else order.arrange(done.merged.items())
    for key, state in () if done.partial else merged:  # a partial step's values are not the step's
        reduce = reduce_of(state[0])
        values = reduced_values(key, state, failed)
        global_metrics.extend(Metric(n, v, reduce, stamp) for n, v in values)
        if any(not math.isfinite(v) for _, v in values):
            bad.add(key)
        if values and (reduce is Reduce.MAX or reduce is Reduce.MIN):
            metric, label = _extreme_rank(key, reduce, state, stamp)
            global_metrics.append(metric)
            labels[metric.key] = label
    per_process = PerProcess(done.parts, on_error, order)
    missing = [] if done.interrupted else done.missing + done.away  # the interrupted record names them, not "missing"
    view = StepView(
        done.experiment, done.step, done.seq, global_metrics, missing, done.late, per_process, labels=labels
    )
    view.samples, view.attempt, view.rewound = done.samples, done.attempt, done.rewound
    view.carried = done.carried
    view.away = len(done.away) if missing else 0
    view.duration = None if done.interrupted else done.duration
    view.from_start = done.from_start
    if not done.late:
        _judge(view, done, bad, traces, watch, stamp, done.internal_errors + errors)
    else:
        _corrected(view, done, stamp)
    return view


def _corrected(view: StepView, done: Finished, stamp: float) -> None:
    """A late update's record: the step corrected (who arrived, how many still missing, in
    ``rankscope/missing_processes`` too), or the late data of a step no longer kept (``partial``)."""
    arrived, n = tuple(done.arrived[:64]), len(done.arrived)
    if done.partial:
        view.anomalies = [Partial(step=done.step, processes=arrived, count=n, points=_points(done.parts))]
        return
    if arrived:
        view.anomalies = [Corrected(step=done.step, processes=arrived, count=n, missing=len(done.missing))]
    view.global_metrics.append(Metric(attr.MISSING_PROCESSES, float(len(done.missing)), Reduce.MAX, stamp))


def _points(parts: list[tuple[Process, StateRows]]) -> int:
    return sum(len(rows.keys) for _, rows in parts)


def _judge(
    view: StepView, done: Finished, bad: set[str], traces: TraceStore, watch: Watch, stamp: float, errors: int
) -> None:
    """A step's phases, stragglers, anomalies and the sink's own per-step metrics, onto its view."""
    if done.keep_spans:  # a view draws a Gantt (the report): the step's spans ride with its view
        view.spans = traces.spans(done.step)[:MAX_VIEW_SPANS]
    view.phase_times = traces.phase_times(done.step)
    view.heat = _heat(view.phase_times)
    metrics = view.global_metrics
    if done.interrupted:  # cut short by the job's end: nothing to judge (no straggler views either)
        view.anomalies = watch.interrupted(done.step, done.missing, done.failed)
    else:
        judgement = judge(traces.spans(done.step))
        keys, labels = straggler_metrics(judgement, stamp)
        metrics.extend(keys)
        view.labels.update(labels)
        d = watch.thresholds
        late = stragglers(judgement, ratio=d.straggler_ratio, min_s=d.straggler_min_s) if d.straggler_ratio > 0 else []
        nonfinite = _nonfinite(done.parts, bad) if bad else []
        metrics.append(Metric(attr.NONFINITE_VALUES, float(len(nonfinite)), Reduce.SUM, stamp))
        candidates = [(record_of(c), c.process) for c in late]
        far = outliers(spreads(done.parts, judged_by(d)), d) if d.outlier_sigmas > 0 else []
        facts = StepFacts(
            done.step,
            nonfinite=nonfinite,
            stragglers=candidates,
            outliers=far,
            duration=done.duration,
            missing=done.missing,
        )
        view.anomalies = watch.step(facts)
        processes = {record.process: process for record, process in candidates}
        view.stragglers = [(r, processes[r.process]) for r in view.anomalies if isinstance(r, Straggler)]
        if d.outlier_capture:
            whose = {record.process: process for record, process in far}
            view.outliers = [
                (r, whose[r.process]) for r in view.anomalies if isinstance(r, Outlier) and r.process in whose
            ]
    metrics.append(Metric(attr.MISSING_PROCESSES, float(len(view.missing)), Reduce.MAX, stamp))
    if done.late_points:
        metrics.append(Metric(attr.LATE_POINTS, float(done.late_points), Reduce.MAX, stamp))
    if errors:
        metrics.append(Metric(attr.INTERNAL_ERRORS, float(errors), Reduce.MAX, stamp))
    if done.bucket_time is not None:
        metrics.append(Metric(attr.BUCKET_TIME, done.bucket_time, Reduce.MAX, stamp))


def _extreme_rank(key: str, reduce: Reduce, state: Running, stamp: float) -> tuple[Metric, str]:
    """``{key}/argmax_rank`` (or ``argmin_rank``): the rank that holds a MAX (MIN) key's extreme
    this step (NaN first, then the lowest rank on a tie; ``sink.book.merge``), and that process's
    label. Ranks of different roles share the numbering."""
    rank, label = holder(state)
    if label.startswith("rankscope-merge"):  # a merged state from before holders were carried
        label = f"rank {rank}"
    name = f"{key}/argmax_rank" if reduce is Reduce.MAX else f"{key}/argmin_rank"
    return Metric(name, float(rank), Reduce.MAX, stamp), label


def _heat(times: dict[str, dict[Process, float]]) -> dict[str, dict[str, float]]:
    """A rank x phase map of one step for people: the processes of the lowest ranks, by label."""
    shown = sorted({p for by in times.values() for p in by}, key=lambda p: (p.role, p.replica or "", p.rank))
    keep = set(shown[:HEAT_PROCESSES])
    heat = {phase: {p.label: round(s, 6) for p, s in by.items() if p in keep} for phase, by in times.items()}
    return {phase: cells for phase, cells in heat.items() if cells}


def _nonfinite(parts: list[tuple[Process, StateRows]], keys: set[str]) -> list[tuple[str, Process | None]]:
    """(key, process) of each process state of ``keys`` whose value is NaN or infinite, in
    the order they came; a key merged upstream (no process state here) names no process."""
    found: list[tuple[str, Process | None]] = []
    named: set[str] = set()
    for process, rows in parts:
        if process.merged:  # a merge is many processes: it names none
            continue
        for i, key in enumerate(rows.keys):
            if key not in keys:
                continue
            alone: dict[str, Running] = {}
            merge_rows(alone, rows.reduce, [key], [rows.rows[i]], process.rank, process.label)
            if any(not math.isfinite(v) for _, v in reduced_values(key, alone[key], None)):
                found.append((key, process))
                named.add(key)
    found.extend((key, None) for key in sorted(keys - named))
    return found
