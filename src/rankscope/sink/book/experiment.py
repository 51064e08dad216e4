"""One run's step book: which steps are open, done and late, what each holds, and when one is ready.

Pure logic with an injected clock. Beside it, each with one job: who a step waits for
(``roster``), steps for data without one (``windows``), the per-run limits (``admission``) and a
finished step into its view (``finalize``). The service drives one request through them:
``take`` (resolve steps, admit) → log (``durable.wal``) → ``merge`` → ``ready`` → act → write.

The rules (``docs/sink.md``):

* Step N is final when nothing is missing (``roster``), or ``grace`` seconds after its first
  data; but in the run's first ``start_hold`` seconds (until ``HOLD_STEPS`` are open) only by
  grace (or the end): a process is missing only once it has flushed a step, so one that starts
  a little after the others (a generator spawned by rank 0) would find the first step final
  without it, its data late. Then the missing processes are named (warning +
  ``rankscope/missing_processes``) and not waited for again until they report. Steps are
  finalized in increasing order.
* Monarch actor processes are flushed by their controller's ``flush(N)``: its marker says how
  many processes it flushed (``expected``), and the step waits for that many.
* A step's part without a step attribute gets one from ``windows`` before it is logged, so a
  write-ahead-log record always names its step. No request ever becomes a step by itself.
* Points for a finalized step are late: counted (``rankscope/late_points``), merged into the
  step's retained running states, and written again as a late update of that step, at most once
  per step per ``late_interval``. A late update's per-process values are those of the processes
  whose data all came late (one that sent part of the step in time keeps its in-time value).
* A higher attempt (a restart, a resume) drops what the earlier attempt left open
  (``abandoned_steps``) and refuses the earlier attempt's processes (``superseded_points``); its
  steps open afresh, and the first one finalized at or below an earlier step is a rewind.
* A step more than ``step_window`` ahead of the frontier is refused, the run's first step
  included (measured from 0, or from the last step an earlier attempt finalized).

Each key of a step is one running state (``sink.book.merge``): what arrives is merged at once,
and nothing is kept per point past the step's view except the rows a view may ask
per-process values of. A key whose states fail to merge (a third-party reduce type) is left
out of the view and counted in ``internal_errors``: it never stops the run.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...core import names as attr
from ..checked import Process, Refusals, ResourceBatch, StateRows, ended_reason
from ..views.anomalies import Detectors, Watch
from ..views.step import StepView
from .admission import Admission, ExperimentLimits
from .finalize import Finished, OnError, view_of
from .merge import Running, merge_rows
from .order import KeyOrder
from .roster import Absent, Roster
from .streams import Streams
from .tables import SampleTable, entries, take
from .traces import TraceStore
from .windows import StepWindows

__all__ = ["Counts", "Experiment", "ExperimentLimits", "Process", "StepView", "Taken"]

HOLD_STEPS = 16
"""Steps open at once that end a run's ``start_hold`` early: a fast job's first steps are not held
so long that their spans leave the trace store (64 steps) before they are judged."""


MAX_SEEN_DIGESTS = 65_536
"""Digests of recently taken ResourceMetrics a run remembers (a client's retry is merged once)."""


@dataclass(slots=True)
class Step:
    step: int
    opened: float
    merged: dict[str, Running] = field(default_factory=dict)
    """Each key's running state (``sink.book.merge``): the global view reduces these."""
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


@dataclass(slots=True)
class Counts:
    """What a run took and refused, as the status route and the views' own metrics show it."""

    points: int = 0
    """States taken (markers not counted); ``merged_points`` of them came merged by a Collector."""
    merged_points: int = 0
    late_points: int = 0
    refused: int = 0
    foreign_points: int = 0
    internal_errors: int = 0
    abandoned_steps: int = 0
    """Steps an earlier attempt left open when the run restarted (never written: executed again)."""
    superseded_points: int = 0
    """Points refused because their process's attempt is older than the run's (a restart)."""
    reused_points: int = 0
    """Points refused because another launch reused the id of this run after it ended (every process
    said goodbye): any later point of its attempt, once the run book says it finished (``book.runs``)."""
    scope_refused: int = 0
    """Points refused because they came with the token of another scope than the run's (``book.runs``)."""
    sample_rows: int = 0
    log_records: int = 0


@dataclass(slots=True)
class Taken:
    """One process's batch, admitted and split by step: what the service logs, then merges."""

    process: Process
    parts: dict[int, ResourceBatch]
    goodbye: bool = False
    settled: list[Any] = field(default_factory=list)
    """Flush markers of steps finalized already: they say the process is live, nothing to log."""


class Experiment:
    """The step book of one run of an experiment (``sink.book.runs``). Not thread-safe: one thread owns it."""

    def __init__(
        self,
        experiment_id: str,
        *,
        run: str = "",
        grace: float,
        start_hold: float = 0.0,
        retain_steps: int = 16,
        late_interval: float = 1.0,
        step_window: int = 1_000_000,
        limits: ExperimentLimits | None = None,
        time_bucket: float = 1.0,
        time_bucket_lag: float = 2.0,
        traces: TraceStore | None = None,
        detectors: Detectors | None = None,
        on_error: OnError | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.id = experiment_id
        self.run = run
        self.started = wall()
        self.clock = clock
        self.grace, self.retain_steps, self.late_interval = grace, retain_steps, late_interval
        self.held_until: float | None = clock() + min(start_hold, grace)
        """Until then, a step is final only by its grace (``start_hold``); None: the hold is over."""
        self.step_window = step_window
        self.on_error = on_error
        limits = limits or ExperimentLimits()
        self.roster = Roster(limits.max_processes)
        self.windows = StepWindows(time_bucket=time_bucket, time_bucket_lag=time_bucket_lag, wall=wall)
        self.admission = Admission(limits)
        self.streams = Streams(max_series=limits.max_series)
        self.traces = traces if traces is not None else TraceStore()
        self.key_order = KeyOrder()
        """Each key's place among the run's keys (``order``): the views list a step's values so."""
        self.watch = Watch(detectors)
        """Per-step anomaly detectors and what they found (``sink.views.anomalies``)."""
        self.counts = Counts()
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        """Digests of recently taken ResourceMetrics: a client's retry is acknowledged, not merged twice."""
        self.keep_spans = False
        """Whether step views carry their spans (set by the sink when a view draws a Gantt)."""
        self._open: dict[int, Step] = {}
        self._done: OrderedDict[int, Step] = OrderedDict()
        self._late: dict[int, Step] = {}
        self._late_written = clock()
        self.last_activity = clock()
        self.last_finalized = -1
        self._last_viewed = -1
        """The last step finalized (never reset): a step at or below it comes again (``StepView.rewound``)."""
        self._checked: tuple[int, int, list[Absent]] = (-1, -1, [])
        """(step, roster version, absent): ``ready`` re-checks a step only when the version moved."""

    def restore(self, last_finalized: int, attempt: int) -> None:
        """Go on where an earlier sink left the run (its write-ahead log, or an eviction)."""
        self.last_finalized = self._last_viewed = last_finalized
        self.roster.attempt = attempt

    @property
    def name(self) -> str:
        """How logs name the run: ``experiment 'x' run 'y'``."""
        return f"experiment {self.id[:64]!r}" + (f" run {self.run[:48]!r}" if self.run else "")

    @property
    def attempt(self) -> int:
        return self.roster.attempt

    @property
    def processes(self) -> dict[str, Process]:
        return self.roster.processes

    @property
    def bucketed(self) -> bool:
        """Whether steps are time buckets (no process of the run steps)."""
        return self.windows.bucketed

    @property
    def frontier(self) -> int:
        """The step new data is measured against: the last finalized, else the lowest open one, else
        the last step any attempt of the run finalized (0 for a new run): a run's first step is held
        to the same ``step_window`` as every later one, so one point cannot make the run's steps late."""
        if self.last_finalized >= 0:
            return self.last_finalized
        return min(self._open) if self._open else max(self._last_viewed, 0)

    def step_at(self, time_unix_nano: int) -> int:
        """The step whose window holds ``time_unix_nano`` (0: now; ``sink.book.windows``)."""
        open_step = min(self._open) if self._open else None
        return self.windows.step_at(
            time_unix_nano, stepping=self.roster.stepping, open_step=open_step, last_finalized=self.last_finalized
        )

    def remember(self, digest: bytes) -> None:
        """A batch with this digest was taken: its retry is acknowledged, not merged again."""
        if digest:
            self.seen[digest] = None
            if len(self.seen) > MAX_SEEN_DIGESTS:
                self.seen.popitem(last=False)

    # -- ingest: take (resolve, admit), then merge ---------------------------------------

    def process_for(self, resource: Mapping[str, Any]) -> Process | None:
        """The sending process (created on first sight), or None past ``max_processes``."""
        attempt = self.roster.attempt
        process = self.roster.process_for(resource)
        if self.roster.attempt > attempt:
            self._new_attempt()
        return process

    def apply(self, batch: ResourceBatch, refused: Refusals, seq: int = 0, *, replayed: bool = False) -> int:
        """``take`` and ``merge`` at once (a replayed record, a test); returns the points taken. A
        ``replayed`` record was acknowledged: it opens its steps whatever ``max_open_steps`` says."""
        taken = self.take(batch, refused, replayed=replayed)
        return 0 if taken is None else self.merge(taken, refused, {step: seq for step in taken.parts})

    def take(self, batch: ResourceBatch, refused: Refusals, *, replayed: bool = False) -> Taken | None:
        """One process's checked batch, split by step (each part's step resolved) and admitted:
        what is beyond the step window, over a limit, from a superseded attempt or from a launch
        that reuses the run's id is refused. Merges nothing: the caller logs each part first."""
        before = refused.count
        try:
            return self._take(batch, refused, replayed)
        finally:
            self.counts.refused += refused.count - before

    def _take(self, batch: ResourceBatch, refused: Refusals, replayed: bool = False) -> Taken | None:
        self.last_activity = self.clock()
        self.counts.foreign_points += batch.foreign
        n = batch.point_count + len(batch.markers)
        process = self.process_for(batch.resource)
        if process is None:
            refused.add(n, f"{self.roster.max_processes} processes (limit)")
            return None
        if process.suspect:  # decided by its first data: a second launch starts over, below the run's last step
            process.suspect = False
            steps = [r.step for r in batch.states if r.step is not None] + [m.step for m in batch.markers]
            process.reused = bool(steps) and min(steps) <= self.last_finalized
        if process.reused:
            self.counts.reused_points += n
            refused.add(n, self._reused_reason(process))
            return None
        if process.attempt < self.attempt:  # a process of an earlier attempt, still sending: the run restarted
            self.counts.superseded_points += n
            refused.add(n, f"from attempt {process.attempt}; the run restarted as attempt {self.attempt}")
            return None
        self.roster.came_back(process)
        self.key_order.place(process.role, batch.order)
        taken = Taken(process, {}, batch.goodbye)
        for step, part in sorted(self._split(batch, process, refused, replayed).items()):
            part.states = self.admission.states(step, part.states, *self._room(step), refused)
            if step <= self.last_finalized:
                taken.settled += part.markers
                part.markers = []
            if part.states or part.markers or part.samples:
                taken.parts[step] = part
        return taken

    def _reused_reason(self, process: Process) -> str:
        return ended_reason(self.run, bool(process.resource.get(attr.RUN_RESUME)))

    def _room(self, step: int) -> tuple[Mapping[str, Running], int | None]:
        """What admission weighs a part of ``step`` against: its keys so far, and its late points
        when it is finalized (None: it is not)."""
        if step <= self.last_finalized:
            bucket = self._late.get(step) or self._done.get(step)
            return (bucket.merged, bucket.late_points) if bucket is not None else ({}, 0)
        bucket = self._open.get(step)
        return (bucket.merged if bucket is not None else {}), None

    def _split(
        self, batch: ResourceBatch, process: Process, refused: Refusals, replayed: bool = False
    ) -> dict[int, ResourceBatch]:
        """The batch's parts by step, each step resolved; what is beyond the step window is refused."""
        frontier = self.frontier
        horizon = frontier + self.step_window
        parts: dict[int, ResourceBatch] = {}
        opened = 0

        def place(step: int, n: int, what: str) -> ResourceBatch | None:
            """The batch's part of ``step`` for ``n`` items (``what``: how a refusal names them); None
            when refused: beyond the step window, or opening a step past ``max_open_steps``."""
            nonlocal opened
            if step > horizon and not replayed:  # acknowledged once: a replayed record keeps its step
                refused.add(n, f"{what}: step {step} is more than {self.step_window} ahead of {frontier}")
                return None
            found = parts.get(step)
            if found is None:
                if not replayed and step > self.last_finalized and step not in self._open:
                    if not self.admission.opens_step(len(self._open) + opened):
                        limit = self.admission.limits.max_open_steps
                        refused.add(n, f"{what}: step {step} would open more than {limit} steps (limit)")
                        return None
                    opened += 1
                found = parts[step] = ResourceBatch(batch.experiment, batch.resource)
            return found

        states = batch.states if not batch.plain else batch.states + self._plain(process, batch.plain)
        for rows in states:
            step = rows.step if rows.step is not None else self.step_at(rows.time_unix_nano)
            found = place(step, len(rows.keys), rows.keys[0])
            if found is not None:  # a resolved step, so a write-ahead-log record always names its step
                found.states.append(
                    rows if rows.step is not None else StateRows(rows.reduce, step, rows.keys, rows.rows)
                )
        for row in batch.samples:
            step = row.step if row.step is not None else self.step_at(row.time_unix_nano)
            found = place(step, 1, "sample row")
            if found is not None:
                found.samples.append(row if row.step is not None else replace(row, step=step))
        for marker in batch.markers:
            found = place(marker.step, 1, "flush marker")
            if found is not None:
                found.markers.append(marker)
        return parts

    def _plain(self, process: Process, points: list[Any]) -> list[StateRows]:
        """Plain OTel points as rows of their steps (``sink.book.streams``; ``step_at`` without a step)."""
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

    def merge(self, taken: Taken, refused: Refusals, seqs: Mapping[int, int] | None = None) -> int:
        """Merge what ``take`` admitted (``seqs``: each step's write-ahead-log record); returns the
        points taken. Sample rows a step's tables cannot keep are refused here."""
        process, now, points = taken.process, self.clock(), 0
        before = refused.count
        for marker in taken.settled:
            self._marker(process, marker, now)
        for step, part in taken.parts.items():
            points += self._merge(process, step, part, (seqs or {}).get(step, 0), now, refused)
        self.counts.refused += refused.count - before
        if taken.goodbye:
            self.roster.ended(process)
        self.counts.points += points
        if process.merged:
            self.counts.merged_points += points
        return points

    def _merge(self, process: Process, step: int, part: ResourceBatch, seq: int, now: float, refused: Refusals) -> int:
        for marker in part.markers:
            self._marker(process, marker, now)
        if not part.states and not part.samples:
            if step in self._open:  # a marker's record: the step's view covers it (the log drops it then)
                self._open[step].seq = max(self._open[step].seq, seq)
            return 0
        late = step <= self.last_finalized
        if late:
            bucket = self._late.get(step)
            if bucket is None:  # merged into the retained step, or written on its own past the window
                bucket = self._late[step] = self._done.get(step) or Step(step, now)
        else:
            bucket = self._open.get(step) or self._open.setdefault(step, Step(step, now))
        bucket.seq = max(bucket.seq, seq)
        if part.samples:  # counted apart from points (``sample_rows``)
            self._samples(process, bucket, part.samples, late, refused)
        taken = 0
        for rows in part.states:
            merge_rows(bucket.merged, rows.reduce, rows.keys, rows.rows, process.rank, process.label)
            if not process.merged:  # a merge is many processes: no per-process value
                bucket.parts.append((process, rows))
            taken += len(rows.keys)
        if late:
            bucket.late_points += taken
            self.counts.late_points += taken
        return taken

    def _samples(self, process: Process, bucket: Step, rows: list[Any], late: bool, refused: Refusals) -> None:
        """Merge sample rows into their step's tables. Late ones count against the step's late
        points, and go only into a step still retained: a table rebuilt from late rows alone
        would be written as if it were that step's selection."""
        if late:
            if bucket.step not in self._done:
                refused.add(len(rows), f"sample rows: step {bucket.step} is no longer retained")
                return
            rows = rows[: self.admission.late_rows(bucket.step, len(rows), bucket.late_points, refused)]
            bucket.late_points += len(rows)
        limits = self.admission.limits
        kept = len(rows)
        for n, why in take(bucket.samples, process, rows, limits.max_sample_tables, limits.max_sample_chars_per_step):
            refused.add(n, why)
            kept -= n
        self.counts.sample_rows += kept

    def _marker(self, process: Process, marker: Any, now: float) -> None:
        if self.windows.stop_bucketing():  # the first stepping process: time buckets give way to steps
            self._new_attempt()
        self.windows.close(marker.step, marker.time_unix_nano)
        self.roster.marked(process, marker.step)
        if marker.step <= self.last_finalized:
            return
        bucket = self._open.get(marker.step) or self._open.setdefault(marker.step, Step(marker.step, now))
        bucket.reporters.add(process.id)
        bucket.expected = max(bucket.expected, marker.expected)
        bucket.driven = bucket.driven or marker.driven

    def _new_attempt(self) -> None:
        """A restarted or resumed run (the attempt went up: torchelastic's restart count, a Slurm
        requeue, ``rankscope.run.resume``), or the end of time buckets, executes steps again. What
        was open is dropped (``abandoned_steps``), and the new attempt's steps open afresh whatever
        their number: the first one finalized at or below an earlier step is a rewind
        (``StepView.rewound``)."""
        self.roster.version += 1
        self.counts.abandoned_steps += len(self._open)
        self._open.clear()
        self._done.clear()
        self._late.clear()
        self.last_finalized = -1
        self.windows.clear()
        self.watch.restart()  # its warm-up again; a streak does not carry over a restart

    # -- what goes to the views at once ------------------------------------------------------

    def stream_process(self, batch: ResourceBatch, refused: Refusals, streamed: int = 0) -> Process | None:
        """The process of streamed values, log records and sample rows (``streamed``: streamed rows
        taken out of ``batch.samples``), counted as activity."""
        self.last_activity = self.clock()
        process = self.process_for(batch.resource)
        if process is None:
            n = len(batch.streams) + len(batch.logs) + len(batch.samples) + streamed
            refused.add(n, f"{self.roster.max_processes} processes (limit)")
            self.counts.refused += n
        return process

    def logs(self, batch: ResourceBatch, refused: Refusals) -> list[tuple[int, Any]]:
        """(step, record) of the batch's ordinary log records that fit ``max_logs_per_step``
        (a record without a step: ``step_at`` its time); the rest are refused."""
        out = []
        frontier = self.frontier
        before = refused.count
        for record in batch.logs:
            step = record.step if record.step is not None else self.step_at(record.time_unix_nano)
            if step > frontier + self.step_window:
                refused.add(1, f"log record: step {step} is more than {self.step_window} ahead")
            elif self.admission.log_record(step, refused):
                out.append((step, record))
        self.counts.refused += refused.count - before
        self.counts.log_records += len(out)
        return out

    # -- finalize ------------------------------------------------------------------------

    def missing(self, step: int) -> list[str]:
        """Who step ``step`` still waits for (labels; ``+N unnamed`` from a controller's count)."""
        return [label for label, _ in self._absent(step)]

    def _absent(self, step: int) -> list[Absent]:
        absent = self.roster.absent(step)
        bucket = self._open.get(step)
        if bucket is not None and bucket.driven and not bucket.expected:
            absent.append(("controller", None))  # actors closed the step; their controller's count is due
        if bucket is not None and bucket.expected > len(bucket.reporters) + len(absent):
            absent.append((f"+{bucket.expected - len(bucket.reporters) - len(absent)} unnamed", None))
        return absent

    def ready(self, *, force: bool = False) -> list[StepView]:
        """Views of every step that is complete, or past its grace period (all when ``force``)."""
        return [self.view(done) for done in self.finished(force=force)]

    def end_hold(self) -> None:
        """End the run's ``start_hold`` now (a report asked for: what is complete is final)."""
        self.held_until = None

    def view(self, done: Finished) -> StepView:
        """A finished step's view (``finalize.view_of``)."""
        return view_of(done, traces=self.traces, watch=self.watch, on_error=self._merge_error, order=self.key_order)

    def finished(self, *, force: bool = False) -> list[Finished]:
        """Close every step that is complete, or past its grace period (all when ``force``)."""
        out: list[Finished] = []
        now = self.clock()
        if self.held_until is not None and (now >= self.held_until or len(self._open) >= HOLD_STEPS):
            self.held_until = None
        held = self.held_until is not None and not self.windows.bucketed  # buckets wait for their lag anyway
        for step in sorted(self._open):  # in order; nothing opens meanwhile (the tenant's lock)
            if self._checked[:2] != (step, self.roster.version):  # nothing that decides it changed: reuse
                self._checked = (step, self.roster.version, self._absent(step))
            absent = self._checked[2]
            bucket = self._open[step]
            # A step holding only sample rows (sent before their process's flush marker) waits
            # for a marker like a step with an absent process, up to the grace period.
            rows_only = not bucket.reporters and not bucket.merged and bool(bucket.samples)
            if (absent or rows_only or held) and not force and now - bucket.opened < self.grace:
                break
            if self.windows.bucketed and not force and now < self.windows.bucket_due(step, now):
                break
            del self._open[step]
            away = self.roster.away(step)  # named at an earlier step: counted again, not named again
            self.roster.give_up(absent)
            self.last_finalized = step
            self._done[step] = bucket
            while len(self._done) > self.retain_steps:
                self._done.popitem(last=False)
            done = self._finished(bucket, [label for label, _ in absent], rewound=step <= self._last_viewed)
            done.away = away
            done.interrupted = force and bool(absent)  # the job ended while these had not closed it
            out.append(done)
            self._last_viewed = step
        return out

    def late_updates(self, *, force: bool = False) -> list[StepView]:
        """Views of the late updates due (``late``)."""
        return [self.view(done) for done in self.late(force=force)]

    def late(self, *, force: bool = False) -> list[Finished]:
        """Late updates due: each step with late data once per ``late_interval`` (all when ``force``)."""
        now = self.clock()
        if not self._late or (not force and now - self._late_written < self.late_interval):
            return []
        self._late_written = now
        late, self._late = self._late, {}
        return [self._finished(bucket, [], late=True) for _, bucket in sorted(late.items())]

    def _finished(self, bucket: Step, missing: list[str], *, late: bool = False, rewound: bool = False) -> Finished:
        parts, bucket.parts = bucket.parts, []  # the view owns them; late rows start a new list
        senders = {process for process, _ in parts}
        if late:  # a process seen in an earlier view of the step would get a partial value: left out
            parts = [(process, rows) for process, rows in parts if process not in bucket.viewed]
        bucket.viewed |= senders
        return Finished(
            experiment=self.id,
            step=bucket.step,
            seq=bucket.seq,
            merged=bucket.merged,
            parts=parts,
            samples=entries(bucket.samples, bucket.step, changed_only=late),
            missing=missing,
            late=late,
            attempt=self.attempt,
            rewound=rewound,
            duration=None if late else self.windows.duration(bucket.step),
            bucket_time=self.windows.bucket_start(bucket.step) if self.windows.bucketed else None,
            late_points=self.counts.late_points,
            internal_errors=self.counts.internal_errors,
            keep_spans=self.keep_spans,
        )

    def late_due(self, now: float) -> bool:
        return bool(self._late) and now - self._late_written >= self.late_interval

    def idle(self, now: float, after: float) -> bool:
        """Nothing open, nothing pending and no data for ``after`` seconds: safe to evict."""
        return not self._open and not self._late and now - self.last_activity >= after

    @property
    def settled(self) -> bool:
        """Nothing open and no late update pending: every step it took is finalized."""
        return not self._open and not self._late

    def late_deadline(self) -> float | None:
        """When the pending late updates are due (``late_interval`` after the last), None: none pending."""
        return self._late_written + self.late_interval if self._late else None

    def next_deadline(self) -> float | None:
        if not self._open:
            return None
        if self.windows.bucketed:
            return self.windows.bucket_due(min(self._open), self.clock())
        due = self._open[min(self._open)].opened + self.grace
        return due if self.held_until is None else min(due, self.held_until)

    def _merge_error(self, where: str, exc: BaseException) -> None:
        self.counts.internal_errors += 1
        if self.on_error is not None:
            self.on_error(f"experiment {self.id[:64]!r}: {where}", exc)
