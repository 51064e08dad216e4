"""One experiment's step alignment: which process reported which step, and when a step is done.

Pure logic with an injected clock; the service feeds it decoded OTLP and hands the
finished ``StepView``s to the backends.

The rules (documented in the README):

* A process that has ever sent a flush marker (``rankscope.flush``) is *stepped*: step N
  waits for its marker N. SPMD ranks flush themselves; Monarch actor processes are flushed
  by their controller's ``flush(N)`` (``rankscope.integrations.monarch.actors``), so they are stepped
  too, and the controller's marker says how many processes it flushed.
* Processes that declare ``rankscope.world_size`` W fill W rank slots of their
  (role, replica, attempt) group; an empty slot is waited for like a process.
* Step N is final when nothing is missing, or ``grace`` seconds after its first data;
  then the missing processes are named (warning + ``rankscope/missing_processes``) and not
  waited for again until they report.
* Steps are finalized in increasing order.
* Steps of data that has none, by time (``step_at``): a step's wall-clock window ends when
  its first process closes it (the flush marker's time; windows never go back), and a point
  or span without a step joins the step whose window holds its timestamp (a finalized
  step: as late data), or the step in progress when it is newer than every window. An
  experiment none of whose processes steps gets fixed time buckets instead
  (``time_bucket`` seconds, default 1): bucket N is step N counted from the experiment's
  first bucket, is final ``time_bucket_lag`` seconds after it ends, and its view carries
  ``rankscope/time`` (the bucket's start, Unix seconds) to plot against. When a process
  first closes a step, the buckets give way to steps (as after a restart). No request ever
  becomes a step by itself.
* Points for a finalized step are late: counted (``rankscope/late_points``), merged into
  the step's retained running states, and written again as a late update of that step, at
  most once per step per ``late_interval`` (a flood of late processes costs one rewrite, not
  one per request). A late update's per-process values are those of the processes whose data
  all came late (one that sent part of the step in time keeps its in-time value there).

Each key of a step is one running state (``sink.merge``): what arrives is merged at once,
and nothing is kept per point past the step's view except the rows a view may ask
per-process values of.

Input comes checked from ``sink.validate``; the limits that depend on the experiment's own
state (steps within ``step_window`` of the frontier, processes, keys per step, late points
per step) are enforced here, in ``apply``, and refused points are counted. A key whose
states fail to merge (a third-party reduce type) is left out of the view and counted in
``internal_errors``: it never stops the experiment.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends.base import Metric
from ..core import names as attr
from ..core.identity import label_of
from ..metrics.reduce import Reduce, reduced_items
from .anomalies import STRAGGLER, Detectors, Watch
from .captures import CaptureBook
from .merge import Running, holder, items, merge_rows, reduce_of, reduced
from .streams import Streams
from .tables import SampleTable, entries, take
from .traces import TraceStore
from .validate import Limits, Refusals, ResourceBatch, StateRows

log = logging.getLogger("rankscope.sink")


@dataclass(slots=True, eq=False)
class Process:
    """One process of the experiment, as its Resource describes it."""

    id: str
    label: str
    role: str
    replica: str | None
    rank: int
    world_size: int
    attempt: int
    host: str
    pid: int | None
    resource: Mapping[str, Any]
    stepped: bool = False
    last_marker: int = -1
    live: bool = True
    merged: bool = False
    """States merged upstream by a Collector (``rankscope.merged``): in the global view only."""
    ended: bool = False
    """It said goodbye (``rankscope.goodbye``): it ended, and does not come back."""
    suspect: bool = False
    """It took the slot of a process that ended, in a run whose processes had all ended, at the
    same attempt: its first data decides whether it is another launch (``reused``)."""
    reused: bool = False
    """...and that data was for a step the run had finalized already: another launch reusing the run
    id (a fixed ``--rdzv-id``, a ``RANKSCOPE_RUN_ID`` set by hand). Its data is refused."""

    @property
    def group(self) -> tuple[str, str | None, int]:
        return (self.role, self.replica, self.attempt)


@dataclass(slots=True)
class _Step:
    step: int
    opened: float
    merged: dict[str, Running] = field(default_factory=dict)
    """Each key's running state (``sink.merge``): the global view reduces these."""
    parts: list[tuple[Process, StateRows]] = field(default_factory=list)
    """The rows taken since the step's last view, by process: per-process values on demand."""
    viewed: set[Process] = field(default_factory=set)
    """Processes whose rows went into a view of this step already."""
    expected: int = 0
    driven: bool = False
    reporters: set[str] = field(default_factory=set)
    seq: int = 0
    """Newest write-ahead-log record merged into this step (what a written view covers)."""
    late_points: int = 0
    samples: dict[str, SampleTable] = field(default_factory=dict)
    """Sample tables (``record_sample``): every process's rows merged into one selection each."""


class StepView:
    """A finished step: the global values, each process's values (computed on first use), who was missing."""

    def __init__(
        self,
        experiment: str,
        step: int,
        seq: int,
        global_metrics: list[Metric],
        missing: list[str],
        late: bool,
        parts: list[tuple[Process, StateRows]] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        labels: dict[str, str] | None = None,
        samples: dict[str, list[dict[str, Any]]] | None = None,
        anomalies: list[dict[str, Any]] | None = None,
        heat: dict[str, dict[str, float]] | None = None,
        phase_times: dict[str, dict[Process, float]] | None = None,
        spans: list[Any] | None = None,
    ) -> None:
        self.experiment, self.step, self.missing, self.late = experiment, step, missing, late
        self.heat = heat or {}
        """Seconds per phase per process label (at most ``HEAT_PROCESSES`` of them): ``rankscope top``."""
        self.phase_times = phase_times or {}
        """Seconds per phase per process, every process: the report's heat map."""
        self.spans = spans or []
        """The step's stored spans (``traces.StoredSpan``) when it was finalized: the report's Gantt."""
        self.anomalies = anomalies or []
        """What the detectors found in this step (``sink.anomalies``)."""
        self.samples = samples or {}
        """Each sample table's kept rows (``sample_entry`` dicts); a late update: tables that changed."""
        self.global_metrics = global_metrics
        self.labels = labels or {}
        """Process labels of values that name a process (``{key}/argmax_rank``): the console shows them."""
        self.seq = seq
        self.attempt = 0
        """The run's attempt when the step was finalized (what the write-ahead log's checkpoint records)."""
        self.rewound = False
        """The step comes again (a restarted or resumed run executes it again): views drop what they
        hold of this step and later ones (TensorBoard's purge step) before writing it."""
        self.per_process = PerProcess(parts or [], on_error)
        """Each process's values (a late update: the processes whose data came late, their late data)."""


class PerProcess(Mapping[Process, list[Metric]]):
    """Each process's values of one step, reduced on first use: a view that only asks how many
    processes there are (W&B past ``per_rank_max_processes``) pays nothing."""

    def __init__(self, parts: list[tuple[Process, StateRows]], on_error: Callable[[str, BaseException], None] | None):
        self._parts = parts
        self._on_error = on_error
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
                for key, state in states[process].items():
                    reduce = reduce_of(state[0])
                    metrics.extend(Metric(n, v, reduce, stamp) for n, v in reduced_values(key, state, self._on_error))
            self._values = values
            self._parts = []
        return self._values


def reduced_values(
    key: str, state: Running, on_error: Callable[[str, BaseException], None] | None
) -> list[tuple[str, float]]:
    """The reduced (name, value) pairs of one key, or none if its reduce type fails on its states."""
    try:
        derived = items(key, state)
        return derived if derived is not None else reduced_items(key, reduced(state[0], state))
    except Exception as exc:  # a third-party reducer: leave the key out, keep the experiment going
        if on_error is not None:
            on_error(f"merging {key!r} ({state[0]})", exc)
        return []


def _extreme_rank(key: str, reduce: Reduce, state: Running, stamp: float) -> tuple[Metric, str]:
    """``{key}/argmax_rank`` (or ``argmin_rank``): the rank that holds a MAX (MIN) key's extreme
    this step (NaN first, then the lowest rank on a tie; ``sink.merge``), and that process's
    label. Ranks of different roles share the numbering."""
    rank, label = holder(state)
    if label.startswith("rankscope-merge"):  # a merged state from before holders were carried
        label = f"rank {rank}"
    name = f"{key}/argmax_rank" if reduce is Reduce.MAX else f"{key}/argmin_rank"
    return Metric(name, float(rank), Reduce.MAX, stamp), label


HEAT_PROCESSES = 64


def _heat(times: dict[str, dict[Process, float]]) -> dict[str, dict[str, float]]:
    """A rank x phase map of one step for people: the processes of the lowest ranks, by label."""
    shown = sorted({p for by in times.values() for p in by}, key=lambda p: (p.role, p.replica or "", p.rank))
    keep = set(shown[:HEAT_PROCESSES])
    heat = {phase: {p.label: round(s, 6) for p, s in by.items() if p in keep} for phase, by in times.items()}
    return {phase: cells for phase, cells in heat.items() if cells}


MAX_VIEW_SPANS = 20_000
"""Spans a step's view carries at most, when a view asks for them (``Experiment.keep_spans``)."""

MAX_CLOCK_SKEW_NS = 60 * 10**9
"""How far ahead of the sink's clock a sender's timestamp may be before it is taken as now."""


def _shown(reduce: str) -> str:
    """A reduce type as an error message names it (``SUM``; a plain OTel kind: ``OTel Gauge``)."""
    return f"OTel {reduce[5:].replace('_', ' ')}" if reduce.startswith("otel.") else reduce.upper()


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Experiment:
    """State of one run of an experiment (``sink.runs``). Not thread-safe: one thread owns it."""

    def __init__(
        self,
        experiment_id: str,
        *,
        run: str = "",
        grace: float,
        retain_steps: int = 16,
        clock: Callable[[], float] = time.monotonic,
        traces: TraceStore | None = None,
        limits: Limits | None = None,
        max_processes: int = 16_384,
        max_keys_per_step: int = 100_000,
        max_late_points_per_step: int = 1_000_000,
        late_interval: float = 1.0,
        on_error: Callable[[str, BaseException], None] | None = None,
        time_bucket: float = 1.0,
        time_bucket_lag: float = 2.0,
        max_series: int = 256,
        max_logs_per_step: int = 1000,
        max_sample_tables: int = 64,
        max_sample_chars_per_step: int = 16 << 20,
        detectors: Detectors | None = None,
        captures: CaptureBook | None = None,
        auto_capture_steps: int = 2,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.id = experiment_id
        self.run = run
        self.started = wall()
        self.traces = traces if traces is not None else TraceStore()
        self.grace = grace
        self.retain_steps = retain_steps
        self.clock = clock
        self.limits = limits or Limits()
        self.max_processes = max_processes
        self.max_keys_per_step = max_keys_per_step
        self.max_late_points_per_step = max_late_points_per_step
        self.late_interval = late_interval
        self.on_error = on_error
        self.processes: dict[str, Process] = {}
        self._labels: dict[str, str] = {}
        self._open: dict[int, _Step] = {}
        self._done: OrderedDict[int, _Step] = OrderedDict()
        self.last_finalized = -1
        self.attempt = 0
        self._last_viewed = -1
        """The last step finalized (never reset): a step at or below it comes again (``StepView.rewound``)."""
        self.keep_spans = False
        """Whether step views carry their spans (set by the sink when a view draws a Gantt)."""
        self.late_points = 0
        self.abandoned_steps = 0
        """Steps an earlier attempt left open when the run restarted (never written: executed again)."""
        self.superseded_points = 0
        self.reused_points = 0
        """Points refused because another launch reused the id of this run after it ended."""
        """Points refused because their process's attempt is older than the run's (a restart)."""
        self._abandoned: set[tuple[tuple[str, str | None, int], int]] = set()
        self._late: dict[int, _Step] = {}
        self._late_written = clock()
        self.last_activity = clock()
        self.refused = 0
        self.points = 0
        """States taken (markers not counted); ``merged_points`` of them came merged by a Collector."""
        self.merged_points = 0
        self.foreign_points = 0
        self.internal_errors = 0
        self._version = 0
        """Bumped by whatever decides who a step waits for (markers, processes coming and going)."""
        self._checked: tuple[int, int, list[tuple[str, Any]]] = (-1, -1, [])
        """(step, version, absent): ``ready`` re-checks a step only when the version moved."""
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        """Digests of recently taken ResourceMetrics: a client's retry is acknowledged, not merged twice."""
        self.streams = Streams(max_series=max_series)
        self.time_bucket = time_bucket
        self.time_bucket_lag = time_bucket_lag
        self.wall = wall
        self._window_steps: list[int] = []
        self._window_ends: list[int] = []
        """Steps whose window end is known, ascending, and those ends (ns, never going back)."""
        self.max_logs_per_step = max_logs_per_step
        self.max_sample_tables = max_sample_tables
        self.max_sample_chars_per_step = max_sample_chars_per_step
        self.sample_rows = 0
        """Sample rows taken (merged into their step's tables)."""
        self.watch = Watch(detectors)
        """Per-step anomaly detectors and what they found (``sink.anomalies``)."""
        self.captures = captures if captures is not None else CaptureBook(clock)
        """Profiler captures asked of this experiment's processes (``sink.captures``)."""
        self.auto_capture_steps = auto_capture_steps
        self.log_records = 0
        """Ordinary OTel log records taken (written to the views)."""
        self._logs_per_step: dict[int, int] = {}
        self._epoch: int | None = None
        """Time buckets (no process steps): the experiment's first bucket, in buckets since 1970."""

    def restore(self, last_finalized: int, attempt: int) -> None:
        """Go on where an earlier sink left the run (its write-ahead log, or an eviction)."""
        self.last_finalized = self._last_viewed = last_finalized
        self.attempt = attempt

    @property
    def name(self) -> str:
        """How logs name the run: ``experiment 'x' run 'y'``."""
        return f"experiment {self.id[:64]!r}" + (f" run {self.run[:48]!r}" if self.run else "")

    # -- ingest ------------------------------------------------------------------------

    def process_for(self, resource: Mapping[str, Any]) -> Process | None:
        """The sending process (created on first sight), or None past ``max_processes``."""
        pid = str(resource.get(attr.SERVICE_INSTANCE_ID) or resource.get(attr.PROCESS_PID) or "?")
        if resource.get(attr.MERGED) is True:  # a Collector merges every attempt under one instance id
            pid = f"{pid}@{_int(resource.get(attr.EXPERIMENT_ATTEMPT), 0)}"
        found = self.processes.get(pid)
        if found is None:
            if len(self.processes) >= self.max_processes:
                return None
            found = self._new_process(pid, resource)
        return found

    def _new_process(self, pid: str, resource: Mapping[str, Any]) -> Process:
        role = str(resource.get(attr.ROLE) or resource.get(attr.SERVICE_NAME) or "unknown")
        replica = resource.get(attr.REPLICA)
        rank = _int(resource.get(attr.RANK), 0)
        label = label_of(role, replica, rank)
        owner = self._labels.get(label)
        if owner is not None and owner != pid and self.processes[owner].live:
            label = f"{label}_{resource.get(attr.PROCESS_PID, pid)}"  # two live processes claim one slot
        attempt = _int(resource.get(attr.EXPERIMENT_ATTEMPT), 0)
        process = Process(
            id=pid,
            label=label,
            role=role,
            replica=None if replica is None else str(replica),
            rank=rank,
            world_size=max(1, _int(resource.get(attr.WORLD_SIZE), 1)),
            attempt=attempt,
            host=str(resource.get(attr.HOST_NAME, "")),
            pid=_int(resource.get(attr.PROCESS_PID), 0) or None,
            resource=dict(resource),
            merged=resource.get(attr.MERGED) is True,
        )
        others = [p for p in self.processes.values() if not p.merged]
        held = self.processes.get(self._labels.get(label_of(role, replica, rank), ""))
        process.suspect = (  # its slot's process ended, as did every other: maybe a second launch
            not process.merged
            and held is not None
            and held.ended
            and held.attempt == attempt == self.attempt
            and all(p.ended for p in others)
            and not any((p.host, p.pid) == (process.host, process.pid) for p in others)  # not a re-init
        )
        self.processes[pid] = process
        if not process.merged:
            self._labels[label] = pid
        if attempt > self.attempt:
            self._new_attempt(attempt)
        return process

    def _new_attempt(self, attempt: int) -> None:
        """A restarted or resumed run (the attempt went up: torchelastic's restart count, a Slurm
        requeue, ``rankscope.run.resume``) executes steps again from its checkpoint. What the
        earlier attempt left open is dropped (``abandoned_steps``; its processes are not waited
        for again), and the new attempt's steps open afresh whatever their number: the first
        one finalized at or below an earlier step is a rewind (``StepView.rewound``)."""
        self._version += 1
        self.attempt = attempt
        for p in self.processes.values():
            if p.attempt < attempt:
                p.live = False
        self.abandoned_steps += len(self._open)
        self._open.clear()
        self._done.clear()
        self._late.clear()
        self.last_finalized = -1
        self._window_steps.clear()
        self._window_ends.clear()

    @property
    def frontier(self) -> int | None:
        """The step new data is measured against: the last finalized, else the lowest open one."""
        if self.last_finalized >= 0:
            return self.last_finalized
        return min(self._open) if self._open else None

    def apply(
        self,
        batch: ResourceBatch,
        refused: Refusals,
        log: Callable[[int, ResourceBatch], int] | None = None,
        seq: int = 0,
    ) -> int:
        """Take one process's checked points and markers; returns how many points were taken.

        ``log(step, part)`` records the part of the batch that lands in ``step`` in the
        write-ahead log before it is merged and returns the record's sequence number; a
        replayed record passes its ``seq`` instead. Steps without a step attribute are
        resolved first, so a record always names its step."""
        now = self.clock()
        self.last_activity = now
        self.foreign_points += batch.foreign
        process = self.process_for(batch.resource)
        if process is None:
            self._refuse(refused, batch.point_count + len(batch.markers), f"{self.max_processes} processes (limit)")
            return 0
        if process.suspect:  # decided by its first data: a second launch starts over, below the run's last step
            process.suspect = False
            steps = [r.step for r in batch.states if r.step is not None] + [m.step for m in batch.markers]
            process.reused = bool(steps) and min(steps) <= self.last_finalized
        if process.reused:
            n = batch.point_count + len(batch.markers)
            self.reused_points += n
            why = f"run {self.run[:64]!r} ended (every process said goodbye) and another launch reuses its id: " + (
                "a resuming launch needs its own run id (unset RANKSCOPE_RUN_ID, a new --rdzv-id); "
                "RANKSCOPE_RESUME names the run it continues"
                if process.resource.get(attr.RUN_RESUME)
                else "give the launch its own run id, or resume the run (RANKSCOPE_RESUME)"
            )
            self._refuse(refused, n, why)
            return 0
        if process.attempt < self.attempt:  # a process of an earlier attempt, still sending: the run restarted
            n = batch.point_count + len(batch.markers)
            self.superseded_points += n
            self._refuse(refused, n, f"from attempt {process.attempt}; the run restarted as attempt {self.attempt}")
            return 0
        if not process.live and process.attempt >= self.attempt:
            process.live = True  # it came back
            process.ended = False
            self._version += 1
        parts = self._split(batch, process, refused, now)
        taken = self._merge_parts(process, parts, refused, log, seq, now)
        if batch.goodbye:
            process.live = False
            process.ended = True
            self._version += 1
        self.points += taken
        if process.merged:
            self.merged_points += taken
        return taken

    def _split(self, batch: ResourceBatch, process: Process, refused: Refusals, now: float) -> dict[int, ResourceBatch]:
        """The batch's parts by step, steps resolved: what is beyond the step window is refused, and
        a marker of a finalized step is applied at once."""
        frontier = self.frontier
        horizon = None if frontier is None else frontier + self.limits.step_window
        parts: dict[int, ResourceBatch] = {}
        self._split_states(batch, process, frontier, horizon, parts, refused)
        self._split_samples(batch, horizon, parts, refused)
        self._split_markers(batch, process, horizon, parts, refused, now)
        return parts

    def _split_states(
        self,
        batch: ResourceBatch,
        process: Process,
        frontier: int | None,
        horizon: int | None,
        parts: dict[int, ResourceBatch],
        refused: Refusals,
    ) -> None:
        states = batch.states if not batch.plain else batch.states + self._plain(process, batch.plain)
        for rows in states:
            step = rows.step
            if step is None:  # resolved here, so a write-ahead-log record always names its step
                step = self.step_at(rows.time_unix_nano)
                rows = StateRows(rows.reduce, step, rows.keys, rows.rows)
            elif horizon is not None and step > horizon:
                window = self.limits.step_window
                why = f"{rows.keys[0]}: step {step} is more than {window} ahead of {frontier}"
                self._refuse(refused, len(rows.keys), why)
                continue
            parts.setdefault(step, ResourceBatch(batch.experiment, batch.resource)).states.append(rows)

    def _split_samples(
        self, batch: ResourceBatch, horizon: int | None, parts: dict[int, ResourceBatch], refused: Refusals
    ) -> None:
        for row in batch.samples:
            step = row.step if row.step is not None else self.step_at(row.time_unix_nano)
            if horizon is not None and step > horizon:
                self._refuse(refused, 1, f"sample row: step {step} is more than {self.limits.step_window} ahead")
                continue
            if row.step is None:  # resolved here, so a write-ahead-log record always names its step
                row = replace(row, step=step)
            parts.setdefault(step, ResourceBatch(batch.experiment, batch.resource)).samples.append(row)

    def _split_markers(
        self,
        batch: ResourceBatch,
        process: Process,
        horizon: int | None,
        parts: dict[int, ResourceBatch],
        refused: Refusals,
        now: float,
    ) -> None:
        for marker in batch.markers:
            if horizon is not None and marker.step > horizon:
                self._refuse(refused, 1, f"flush marker: step {marker.step} is over {self.limits.step_window} ahead")
            elif marker.step > self.last_finalized:  # a marker of a finalized step changes nothing
                parts.setdefault(marker.step, ResourceBatch(batch.experiment, batch.resource)).markers.append(marker)
            else:
                self._marker(process, marker, now)

    def _merge_parts(
        self,
        process: Process,
        parts: dict[int, ResourceBatch],
        refused: Refusals,
        log: Callable[[int, ResourceBatch], int] | None,
        seq: int,
        now: float,
    ) -> int:
        """Admit and merge each step's part, lowest step first; returns how many points were taken."""
        taken = 0
        for step in sorted(parts):
            part = parts[step]
            part.states = self._admit(step, part.states, refused)
            if part.states or part.markers or part.samples:
                taken += self._merge(process, step, part, log(step, part) if log is not None else seq, now, refused)
        return taken

    def _plain(self, process: Process, points: list[Any]) -> list[StateRows]:
        """Plain OTel points as rows of their steps (``sink.streams``; ``step_at`` without a step)."""
        groups: dict[tuple[str, int], StateRows] = {}
        for point in points:
            converted = self.streams.convert(process.id, point)
            if converted is None:
                continue
            reduce, key, row = converted
            step = point[6] if point[6] is not None else self.step_at(point[5])
            rows = groups.get((reduce, step))
            if rows is None:
                rows = groups[(reduce, step)] = StateRows(reduce, step)
            rows.keys.append(key)
            rows.rows.append(row)
        return list(groups.values())

    def _clamped(self, time_unix_nano: int) -> int:
        """A sender's time, or the sink's now when it is absent or more than ``MAX_CLOCK_SKEW`` ahead
        (one bad clock never moves a window or a bucket into the future)."""
        now = int(self.wall() * 1e9)
        return now if not time_unix_nano or time_unix_nano > now + MAX_CLOCK_SKEW_NS else time_unix_nano

    def step_at(self, time_unix_nano: int) -> int:
        """The step whose wall-clock window holds ``time_unix_nano`` (0: now); see the module docstring."""
        t = self._clamped(time_unix_nano)
        if self._window_ends:
            i = bisect.bisect_left(self._window_ends, t)
            return self._window_steps[i] if i < len(self._window_steps) else self._window_steps[-1] + 1
        if any(p.stepped for p in self.processes.values()):  # stepping, no window known yet
            return min(self._open) if self._open else self.last_finalized + 1
        width = self.time_bucket * 1e9
        if self._epoch is None:  # from the sink's clock, give or take the skew: one old timestamp never
            # makes every later bucket a huge step; an evicted experiment reopened goes on after its last step
            first = max(t, int(self.wall() * 1e9) - MAX_CLOCK_SKEW_NS)
            self._epoch = int(first / width) - (self.last_finalized + 1)
        return max(0, int(t / width) - self._epoch)

    @property
    def bucketed(self) -> bool:
        """Whether steps are time buckets (no process of the experiment steps)."""
        return self._epoch is not None

    def _bucket_due(self, step: int) -> float:
        """When (this experiment's clock) time bucket ``step`` is final: its end plus the lag."""
        assert self._epoch is not None
        end = (self._epoch + step + 1) * self.time_bucket + self.time_bucket_lag
        return self.clock() + (end - self.wall())

    def _refuse(self, refused: Refusals, n: int, why: str) -> None:
        refused.add(n, why)
        self.refused += n

    def _admit(self, step: int, states: list[StateRows], refused: Refusals) -> list[StateRows]:
        """The rows of ``step`` that fit its limits (keys per step, late points per step, one reduce per key)."""
        late = step <= self.last_finalized
        bucket = (self._late.get(step) or self._done.get(step)) if late else self._open.get(step)
        merged = bucket.merged if bucket is not None else {}
        new: dict[str, str] = {}
        key_room = self.max_keys_per_step - len(merged)
        late_room = self.max_late_points_per_step - (bucket.late_points if bucket is not None else 0)
        kept: list[StateRows] = []
        for rows in states:
            reduce = rows.reduce
            dropped: set[int] | None = None
            for i, key in enumerate(rows.keys):
                state = merged.get(key)
                known = new.get(key) if state is None else state[0]
                why = None
                if known is None:
                    if len(new) >= key_room:
                        why = f"{key}: step {step} has {self.max_keys_per_step} keys (limit)"
                    else:
                        new[key] = reduce
                elif known != reduce:
                    why = f"{key}: recorded as {_shown(known)} and as {_shown(reduce)}"
                if why is None and late:
                    if late_room <= 0:
                        why = f"{key}: step {step} has {self.max_late_points_per_step} late points (limit)"
                    late_room -= 1
                if why is not None:
                    self._refuse(refused, 1, why)
                    dropped = dropped or set()
                    dropped.add(i)
            if dropped:
                keep = [i for i in range(len(rows.keys)) if i not in dropped]
                rows = StateRows(reduce, rows.step, [rows.keys[i] for i in keep], [rows.rows[i] for i in keep])
            if rows.keys:
                kept.append(rows)
        return kept

    def _merge(self, process: Process, step: int, part: ResourceBatch, seq: int, now: float, refused: Refusals) -> int:
        for marker in part.markers:
            self._marker(process, marker, now)
        late = step <= self.last_finalized
        if late:
            bucket = self._late.get(step)
            if bucket is None:  # merged into the retained step, or written on its own past the window
                bucket = self._late[step] = self._done.get(step) or _Step(step, now)
        else:
            bucket = self._open.get(step) or self._open.setdefault(step, _Step(step, now))
        bucket.seq = max(bucket.seq, seq)
        taken = 0
        if part.samples:  # counted apart from points (``sample_rows``)
            self._samples(process, bucket, part.samples, late, refused)
        for rows in part.states:
            merge_rows(bucket.merged, rows.reduce, rows.keys, rows.rows, process.rank, process.label)
            if not process.merged:  # a merge is many processes: no per-process value
                bucket.parts.append((process, rows))
            taken += len(rows.keys)
        if late:
            bucket.late_points += taken
            self.late_points += taken
        return taken

    def _samples(self, process: Process, bucket: _Step, rows: list[Any], late: bool, refused: Refusals) -> None:
        """Merge sample rows into their step's tables. Late ones count against the step's late
        points, and go only into a step still retained: a table rebuilt from late rows alone
        would be written as if it were that step's selection."""
        if late:
            if bucket.step not in self._done:
                self._refuse(refused, len(rows), f"sample rows: step {bucket.step} is no longer retained")
                return
            room = self.max_late_points_per_step - bucket.late_points
            if room < len(rows):
                why = f"sample rows: step {bucket.step} has {self.max_late_points_per_step} late points (limit)"
                self._refuse(refused, len(rows) - max(0, room), why)
                rows = rows[: max(0, room)]
            bucket.late_points += len(rows)
        self.sample_rows += len(rows)
        limits = (self.max_sample_tables, self.max_sample_chars_per_step)
        for n, why in take(bucket.samples, process, rows, *limits):
            self._refuse(refused, n, why)
            self.sample_rows -= n

    def stream_process(self, batch: ResourceBatch, refused: Refusals, streamed: int = 0) -> Process | None:
        """The process of streamed values, log records and sample rows (``streamed``: streamed rows
        taken out of ``batch.samples``), counted as activity."""
        self.last_activity = self.clock()
        process = self.process_for(batch.resource)
        if process is None:
            n = len(batch.streams) + len(batch.logs) + len(batch.samples) + streamed
            self._refuse(refused, n, f"{self.max_processes} processes (limit)")
        return process

    def logs(self, batch: ResourceBatch, refused: Refusals) -> list[tuple[int, Any]]:
        """(step, record) of the batch's ordinary log records that fit ``max_logs_per_step``
        (a record without a step: ``step_at`` its time); the rest are refused."""
        out = []
        frontier = self.frontier
        for record in batch.logs:
            step = record.step if record.step is not None else self.step_at(record.time_unix_nano)
            if frontier is not None and step > frontier + self.limits.step_window:
                self._refuse(refused, 1, f"log record: step {step} is more than {self.limits.step_window} ahead")
                continue
            n = self._logs_per_step.get(step, 0)
            if n >= self.max_logs_per_step:
                self._refuse(refused, 1, f"log records: step {step} has {self.max_logs_per_step} (limit)")
                continue
            self._logs_per_step[step] = n + 1
            if len(self._logs_per_step) > 4096:  # the lowest steps are forgotten first (not the newest counts)
                del self._logs_per_step[min(self._logs_per_step)]
            out.append((step, record))
        self.log_records += len(out)
        return out

    def _marker(self, process: Process, marker: Any, now: float) -> None:
        step, expected, driven = marker.step, marker.expected, marker.driven
        if self._epoch is not None:  # the first stepping process: time buckets give way to steps
            self._epoch = None
            self._new_attempt(self.attempt)
        if not self._window_steps or step > self._window_steps[-1]:  # a window ends at its first marker
            end = max(self._clamped(marker.time_unix_nano), self._window_ends[-1] if self._window_ends else 0)
            self._window_steps.append(step)
            self._window_ends.append(end)
            if len(self._window_steps) > 100_000:
                del self._window_steps[:50_000], self._window_ends[:50_000]
        self._version += 1
        process.stepped = True
        process.live = True
        process.last_marker = max(process.last_marker, step)
        self._abandoned.discard((process.group, process.rank))
        if step <= self.last_finalized:
            return
        bucket = self._open.get(step) or self._open.setdefault(step, _Step(step, now))
        bucket.reporters.add(process.id)
        bucket.expected = max(bucket.expected, expected)
        bucket.driven = bucket.driven or driven

    # -- finalize ----------------------------------------------------------------------

    def missing(self, step: int) -> list[str]:
        """Who step ``step`` still waits for (labels; ``+N unnamed`` from a controller's count)."""
        return [label for label, _ in self._absent(step)]

    def _absent(self, step: int) -> list[tuple[str, Any]]:
        """(label, what to stop waiting for: a Process, a rank slot, or None) per absentee."""
        absent: list[tuple[str, Any]] = []
        present: dict[tuple[str, str | None, int], set[int]] = {}
        sizes: dict[tuple[str, str | None, int], int] = {}
        stepped = [p for p in self.processes.values() if p.stepped and p.attempt >= self.attempt]
        for p in stepped:
            sizes[p.group] = max(sizes.get(p.group, 1), p.world_size)
            if p.last_marker >= step or p.live:  # a live laggard is named as itself below
                present.setdefault(p.group, set()).add(p.rank)
            if p.live and p.last_marker < step:
                absent.append((p.label, p))
        for group, size in sizes.items():
            for rank in sorted(set(range(size)) - present.get(group, set())):
                if (group, rank) not in self._abandoned:
                    role, replica, _ = group
                    absent.append((label_of(role, replica, rank), (group, rank)))
        bucket = self._open.get(step)
        if bucket is not None and bucket.driven and not bucket.expected:
            absent.append(("controller", None))  # actors closed the step; their controller's count is due
        if bucket is not None and bucket.expected > len(bucket.reporters) + len(absent):
            absent.append((f"+{bucket.expected - len(bucket.reporters) - len(absent)} unnamed", None))
        return absent

    def ready(self, *, force: bool = False) -> list[StepView]:
        """Finalize every step that is complete, or past its grace period (all when ``force``)."""
        out: list[StepView] = []
        now = self.clock()
        while self._open:
            step = min(self._open)
            if self._checked[:2] != (step, self._version):  # nothing that decides it changed: reuse
                self._checked = (step, self._version, self._absent(step))
            absent = self._checked[2]
            bucket = self._open[step]
            # A step holding only sample rows (sent before their process's flush marker) waits
            # for a marker like a step with an absent process, up to the grace period.
            rows_only = not bucket.reporters and not bucket.merged and bool(bucket.samples)
            if (absent or rows_only) and not force and now - bucket.opened < self.grace:
                break
            if self._epoch is not None and not force and now < self._bucket_due(step):
                break
            del self._open[step]
            self._give_up_on(absent)
            missing = [label for label, _ in absent]
            self.last_finalized = step
            self._done[step] = bucket
            while len(self._done) > self.retain_steps:
                self._done.popitem(last=False)
            view = self._view(bucket, missing)
            view.attempt = self.attempt
            view.rewound = step <= self._last_viewed
            self._last_viewed = step
            out.append(view)
        return out

    def late_updates(self, *, force: bool = False) -> list[StepView]:
        """Late updates due: each step with late data once per ``late_interval`` (all when ``force``)."""
        now = self.clock()
        if not self._late or (not force and now - self._late_written < self.late_interval):
            return []
        self._late_written = now
        late, self._late = self._late, {}
        return [self._view(bucket, [], late=True) for _, bucket in sorted(late.items())]

    def late_due(self, now: float) -> bool:
        return bool(self._late) and now - self._late_written >= self.late_interval

    def idle(self, now: float, after: float) -> bool:
        """Nothing open, nothing pending and no data for ``after`` seconds: safe to evict."""
        return not self._open and not self._late and now - self.last_activity >= after

    def next_deadline(self) -> float | None:
        if not self._open:
            return None
        if self._epoch is not None:
            return self._bucket_due(min(self._open))
        return self._open[min(self._open)].opened + self.grace

    def _give_up_on(self, absent: list[tuple[str, Any]]) -> None:
        """Named once, not waited for again until they report (a dead rank costs one grace period)."""
        self._version += 1
        for _, what in absent:
            if isinstance(what, Process):
                what.live = False
                self._abandoned.add((what.group, what.rank))
            elif what is not None:
                self._abandoned.add(what)

    def _view(self, bucket: _Step, missing: list[str], late: bool = False) -> StepView:
        stamp = time.time()
        global_metrics: list[Metric] = []
        labels: dict[str, str] = {}
        bad: set[str] = set()
        for key, state in bucket.merged.items():
            reduce = reduce_of(state[0])
            items = reduced_values(key, state, self._merge_error)
            global_metrics.extend(Metric(n, v, reduce, stamp) for n, v in items)
            if any(not math.isfinite(v) for _, v in items):
                bad.add(key)
            if items and (reduce is Reduce.MAX or reduce is Reduce.MIN):
                metric, label = _extreme_rank(key, reduce, state, stamp)
                global_metrics.append(metric)
                labels[metric.key] = label
        anomalies: list[dict[str, Any]] = []
        heat: dict[str, dict[str, float]] = {}
        times: dict[str, dict[Process, float]] = {}
        spans: list[Any] = []
        if not late:
            if self.keep_spans:  # a view draws a Gantt (the report): the step's spans ride with its view
                spans = self.traces.spans(bucket.step)[:MAX_VIEW_SPANS]
            times = self.traces.phase_times(bucket.step)
            phases = self.traces.phases(bucket.step, times)
            heat = _heat(times)
            global_metrics.extend(self.traces.stragglers(bucket.step, phases))
            nonfinite = self._nonfinite(bucket, bad) if bad else []
            global_metrics.append(Metric(attr.NONFINITE_VALUES, float(len(nonfinite)), Reduce.SUM, stamp))
            anomalies = self.watch.step(
                bucket.step, nonfinite=nonfinite, phases=phases, duration=self._duration(bucket.step), missing=missing
            )
            self._capture_stragglers(anomalies, phases)
            if self.watch.first_nonfinite is not None and any(a.get("first") for a in anomalies):
                log.warning(
                    "rankscope sink: experiment %r: first non-finite value: %r at step %d from %r",
                    self.id[:64],
                    self.watch.first_nonfinite["key"][:128],
                    bucket.step,
                    self.watch.first_nonfinite["process"],
                )
            global_metrics.append(Metric(attr.MISSING_PROCESSES, float(len(missing)), Reduce.MAX, stamp))
            if self.late_points:
                global_metrics.append(Metric(attr.LATE_POINTS, float(self.late_points), Reduce.MAX, stamp))
            if self.internal_errors:
                global_metrics.append(Metric(attr.INTERNAL_ERRORS, float(self.internal_errors), Reduce.MAX, stamp))
            if self._epoch is not None:
                start = (self._epoch + bucket.step) * self.time_bucket
                global_metrics.append(Metric(attr.BUCKET_TIME, start, Reduce.MAX, stamp))
        parts, bucket.parts = bucket.parts, []  # the view owns them; late rows start a new list
        senders = {process for process, _ in parts}
        if late:  # a process seen in an earlier view of the step would get a partial value: left out
            parts = [(process, rows) for process, rows in parts if process not in bucket.viewed]
        bucket.viewed |= senders
        samples = entries(bucket.samples, bucket.step, changed_only=late)
        return StepView(
            self.id,
            bucket.step,
            bucket.seq,
            global_metrics,
            missing,
            late,
            parts,
            self._merge_error,
            labels,
            samples,
            anomalies,
            heat,
            times,
            spans,
        )

    def _capture_stragglers(self, anomalies: list[dict[str, Any]], phases: list[Any]) -> None:
        """A straggler's process is asked to profile its next steps (rate-limited: ``CaptureBook``)."""
        if self.auto_capture_steps <= 0:
            return
        slowest = {phase.name: phase.slowest for phase in phases}
        for record in anomalies:
            if record["type"] != STRAGGLER:
                continue
            process = slowest[record["phase"]]
            reason = f"straggler at step {record['step']}: {process.label} in {record['phase']}"
            asked = self.captures.ask(reason, self.auto_capture_steps, processes=frozenset({process.id}), auto=True)
            if not isinstance(asked, str):
                record["capture"] = asked.id

    def _nonfinite(self, bucket: _Step, keys: set[str]) -> list[tuple[str, Process | None]]:
        """(key, process) of each process state of ``keys`` whose value is NaN or infinite, in
        the order they came; a key merged upstream (no process state here) names no process."""
        found: list[tuple[str, Process | None]] = []
        named: set[str] = set()
        for process, rows in bucket.parts:
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

    def _duration(self, step: int) -> float | None:
        """Seconds between the end of ``step``'s window and the previous step's (None if unknown)."""
        i = bisect.bisect_left(self._window_steps, step)
        if i == 0 or i >= len(self._window_steps) or self._window_steps[i] != step:
            return None
        return (self._window_ends[i] - self._window_ends[i - 1]) / 1e9

    def _merge_error(self, where: str, exc: BaseException) -> None:
        self.internal_errors += 1
        if self.on_error is not None:
            self.on_error(f"experiment {self.id[:64]!r}: {where}", exc)

    def local_pids(self, host: str) -> set[int]:
        return {p.pid for p in self.processes.values() if p.pid and p.host == host}
