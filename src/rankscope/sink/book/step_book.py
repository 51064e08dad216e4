"""One run's step book: which steps are open, done and late, what each holds, and when one is ready.

Pure logic with an injected clock. The book resolves who sent a batch and drives its parts, each
with one job: its rules (``config.BookConfig``), who a step waits for (``roster``), steps for data
without one (``windows``), the per-run limits (``admission``), the steps by state and what each
holds (``steps``, ``late``: late updates), when an open step is final (``readiness``), what the run
counted (``counts``) and a finished step into its view (``finalize``). The service drives one
request through them: ``take`` (resolve steps, admit) → log (``durable.wal``) → ``merge`` →
``finished``/``late`` → act → write.

The rules (``docs/sink.md``):

* Step N is final when nothing is missing (``roster``), or ``grace`` seconds after its first
  data; but in the run's first ``start_hold`` seconds only by grace (``readiness``). Then the
  missing processes are named (warning + ``rankscope/missing_processes``) and not waited for
  again until they report. Steps are finalized in increasing order.
* Monarch actor processes are flushed by their controller's ``flush(N)``: its marker says how
  many processes it flushed (``expected``), and the step waits for that many.
* A step's part without a step attribute gets one from ``windows`` before it is logged, so a
  write-ahead-log record always names its step. No request ever becomes a step by itself.
* Points for a finalized step are late: counted (``rankscope/late_points``), merged into the
  step's kept running states (``retained``: a window in seconds and bytes), and written again as a
  late update of that step, its exact total, at most once per step per ``late_interval`` (``late``);
  it names the processes that arrived (``corrected``) and counts those still missing. Past the
  window the late data is said as a ``partial`` record, never written as the step's value. A late
  update's per-process values are those of the processes whose data all came late (one that sent
  part of the step in time keeps its in-time value).
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
from dataclasses import dataclass, field
from typing import Any

from ...core import names as attr
from ...otlp.markers import Marker
from ..checked import OnError, Process, Refusals, ResourceBatch, ended_reason
from ..views.anomalies import Watch
from ..views.step import StepView
from .admission import Admission, ExperimentLimits
from .buckets import carried
from .config import BookConfig
from .counts import Counts
from .finalize import Finished, view_of
from .order import KeyOrder
from .readiness import Readiness
from .retained import Retained, Retention
from .roster import Roster
from .step import Step
from .steps import StepTable
from .streams import Streams
from .tables import entries
from .traces import TraceStore
from .windows import StepWindows

__all__ = ["BookConfig", "Counts", "ExperimentLimits", "Process", "StepBook", "StepView", "Taken"]

MAX_SEEN_DIGESTS = 65_536
"""Digests of recently taken ResourceMetrics a run remembers (a client's retry is merged once)."""


@dataclass(slots=True)
class Taken:
    """One process's batch, admitted and split by step: what the service logs, then merges."""

    process: Process
    parts: dict[int, ResourceBatch]
    goodbye: bool = False
    settled: list[Marker] = field(default_factory=list)
    """Flush markers of steps finalized already: they say the process is live, nothing to log."""
    exit_error: str | None = None
    """What the goodbye said of the exception that ended the process (``rankscope.exit.error``)."""
    exit_step: int | None = None


def after_its_closes(
    step_at: Callable[[int], int], process: Process, batch: ResourceBatch, said: int | None = None
) -> Callable[[int], int]:
    """``step_at`` for ``process``'s data without a step: never a step the process had closed when
    it took the data, in an earlier batch or in this one. The windows learn this batch's closes
    only when it merges, so a job's last request (its last steps' markers and the values it
    recorded after them, sent at exit) would otherwise put those values into a step it had closed,
    by that step's window. A close in this batch counts only if it came before the data: a request
    held back (a sink still starting) carries what the process sent before its first flush beside
    the markers of the steps it closed since, and those values are its first step's (at the latest
    the first step closed after them, whatever the others' windows say). ``said``: the step the
    batch's failed goodbye named (``set_step``'s, checked against the step window): what the process
    recorded after its last close is that step's, where the record of its failure goes too."""
    earlier = process.last_marker
    own = [(m.time_unix_nano, m.step) for m in batch.markers if m.ranks is None]
    if earlier < 0 and not own and said is None:
        return step_at

    def placed(time_unix_nano: int) -> int:
        closed = max([earlier, *(step for when, step in own if when <= time_unix_nano)])
        coming = [step for when, step in own if when > time_unix_nano and step > closed]
        if said is not None and said > closed and not coming:
            return said
        step = step_at(time_unix_nano) if closed < 0 else max(step_at(time_unix_nano), closed + 1)
        return min([step, *coming])  # taken before it closed ``coming``: none later than that

    return placed


class StepBook:
    """The step book of one run of an experiment (``sink.runs.runbook``). Not thread-safe: one thread owns it."""

    def __init__(
        self,
        experiment_id: str,
        config: BookConfig,
        *,
        run: str = "",
        traces: TraceStore | None = None,
        on_error: OnError | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        retention: Retention | None = None,
    ) -> None:
        self.id = experiment_id
        self.run = run
        self.started = wall()
        self.clock = clock
        self.config = config
        self.on_error = on_error
        limits = config.limits
        self.roster = Roster(limits.max_processes, limits.max_rank_slots)
        self.windows = StepWindows(time_bucket=config.time_bucket, time_bucket_lag=config.time_bucket_lag, wall=wall)
        self.admission = Admission(limits)
        self.streams = Streams(max_series=limits.max_series)
        self.traces = traces if traces is not None else TraceStore()
        self.key_order = KeyOrder()
        """Each key's place among the run's keys (``order``): the views list a step's values so."""
        self.watch = Watch(config.detectors)
        """Per-step anomaly detectors and what they found (``sink.views.anomalies``)."""
        self.counts = Counts()
        self.steps = StepTable(
            retained=Retained(max_bytes=config.retain_bytes, max_seconds=config.retain_seconds, retention=retention),
            step_window=config.step_window,
            late_interval=config.late_interval,
            admission=self.admission,
            counts=self.counts,
            now=clock(),
        )
        self.readiness = Readiness(
            grace=config.grace,
            start_hold=config.start_hold,
            roster=self.roster,
            windows=self.windows,
            steps=self.steps,
            now=clock(),
        )
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        """Digests of recently taken ResourceMetrics: a client's retry is acknowledged, not merged twice."""
        self.keep_spans = False
        """Whether step views carry their spans (set by the sink when a view draws a Gantt)."""
        self.last_activity = clock()

    def restore(self, last_finalized: int, attempt: int) -> None:
        """Go on where an earlier sink left the run (its write-ahead log, or an eviction)."""
        self.steps.restore(last_finalized)
        self.roster.attempt = attempt

    @property
    def name(self) -> str:
        """How logs name the run: ``experiment 'x' run 'y'``."""
        return f"experiment {self.id[:64]!r}" + (f" run {self.run[:48]!r}" if self.run else "")

    @property
    def attempt(self) -> int:
        return self.roster.attempt

    @property
    def last_finalized(self) -> int:
        """The run's last finalized step (-1: none yet, or none since a restart)."""
        return self.steps.last_finalized

    @property
    def settled(self) -> bool:
        """Nothing open and no late update pending: every step it took is finalized."""
        return self.steps.settled

    def step_at(self, time_unix_nano: int) -> int:
        """The step whose window holds ``time_unix_nano`` (0: now; ``sink.book.windows``)."""
        steps = self.steps
        return self.windows.step_at(
            time_unix_nano,
            stepping=self.roster.stepping,
            open_step=min(steps.open) if steps.open else None,
            last_finalized=steps.last_finalized,
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

    def _take(self, batch: ResourceBatch, refused: Refusals, replayed: bool) -> Taken | None:
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
            process.reused = bool(steps) and min(steps) <= self.steps.last_finalized
        if process.reused:
            self.counts.reused_points += n
            refused.add(n, ended_reason(self.run, bool(process.resource.get(attr.RUN_RESUME))))
            return None
        if process.attempt < self.attempt:  # a process of an earlier attempt, still sending: the run restarted
            self.counts.superseded_points += n
            why = f"from attempt {process.attempt}; the run restarted as attempt {self.attempt}"
            if process.resource.get(attr.ATTEMPT_FALLBACK):
                why += " (its attempt is its node's restart count: it could not read the rendezvous round)"
            refused.add(n, why)
            return None
        self.roster.came_back(process)
        self.key_order.place(process.role, batch.order)
        # Plain OTel points go by their own times (another exporter's, they may come after a marker
        # of the step they were taken in); rankscope's own values without a step came after its last flush.
        states = (
            batch.states if not batch.plain else batch.states + self.streams.rows(process.id, batch.plain, self.step_at)
        )
        said = batch.exit_step if batch.exit_step is not None and batch.exit_step <= self.horizon else None
        step_at = after_its_closes(self.step_at, process, batch, said)
        parts, settled = self.steps.place(batch, states, refused, step_at, replayed=replayed)
        return Taken(process, parts, batch.goodbye, settled, batch.exit_error, batch.exit_step)

    def merge(self, taken: Taken, refused: Refusals, seqs: Mapping[int, int] | None = None) -> int:
        """Merge what ``take`` admitted (``seqs``: each step's write-ahead-log record); returns the
        points taken. Sample rows a step's tables cannot keep are refused here."""
        process, now, points, steps = taken.process, self.clock(), 0, self.steps
        before = refused.count
        for marker in taken.settled:  # first: a run's first marker ends its time buckets (a restart)
            self._marker(process, marker, now)
        for step, part in taken.parts.items():
            for marker in part.markers:
                self._marker(process, marker, now)
            points += steps.merge(process, step, part, (seqs or {}).get(step, 0), now, refused)
        self.counts.refused += refused.count - before
        if taken.goodbye:
            if taken.exit_error:
                process.exit_error, process.exit_step = taken.exit_error, taken.exit_step
            self.roster.ended(process)
        self.counts.points += points
        if process.merged:
            self.counts.merged_points += points
        return points

    def _marker(self, process: Process, marker: Marker, now: float) -> None:
        if self.windows.stop_bucketing():  # the first stepping process: time buckets give way to steps
            try:
                step, lost, refused = carried(self.steps, marker.step, now)
            except Exception as exc:  # a fault of ours: the buckets are dropped (as before them), the run goes on
                self.counts.internal_errors += 1
                if self.on_error is not None:
                    self.on_error(f"experiment {self.id[:64]!r}: the end of time buckets", exc)
                step, lost, refused = None, 0, 0
            self._new_attempt()
            self.counts.abandoned_steps += lost
            self.counts.refused += refused
            if step is not None:  # what the buckets took is the first step's (``book.buckets``)
                self.steps.open[marker.step] = step
        # the run's first step is timed from its first closer's start: a process's own marker (a merged
        # one's start is its ranks' earliest, on other hosts' clocks), before any step of the attempt
        first = marker.ranks is None and self.steps.last_finalized < 0
        self.windows.close(marker.step, marker.time_unix_nano, marker.start_unix_nano if first else 0)
        if marker.ranks is None:
            self.roster.marked(process, marker.step)
        else:  # a Collector's merged markers: its ranks closed the step, not the merge itself
            self.roster.ranks_marked(process.attempt, marker.ranks, marker.step)
            if marker.step <= self.steps.last_finalized:
                self.steps.ranks_arrived(marker.step, marker.ranks)
        self.steps.marked(process, marker, now)

    def _new_attempt(self) -> None:
        """A restarted or resumed run (the attempt went up: torchelastic's restart count, a Slurm
        requeue, ``rankscope.run.resume``), or the end of time buckets, executes steps again. What
        was open is dropped (``abandoned_steps``), and the new attempt's steps open afresh whatever
        their number: the first one finalized at or below an earlier step is a rewind
        (``StepView.rewound``)."""
        self.roster.version += 1
        self.counts.abandoned_steps += self.steps.restart()
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

    @property
    def horizon(self) -> int:
        """The highest step data may be for now: ``step_window`` ahead of the frontier."""
        return self.steps.frontier + self.config.step_window

    def logs(self, batch: ResourceBatch, refused: Refusals) -> list[tuple[int, Any]]:
        """(step, record) of the batch's ordinary log records that fit ``max_logs_per_step``
        (a record without a step: ``step_at`` its time); the rest are refused."""
        out = []
        window = self.config.step_window
        horizon = self.horizon
        before = refused.count
        for record in batch.logs:
            step = record.step if record.step is not None else self.step_at(record.time_unix_nano)
            if step > horizon:
                refused.add(1, f"log record: step {step} is more than {window} ahead")
            elif self.admission.log_record(step, refused):
                out.append((step, record))
        self.counts.refused += refused.count - before
        self.counts.log_records += len(out)
        return out

    # -- finalize ------------------------------------------------------------------------

    def ready(self, *, force: bool = False) -> list[StepView]:
        """Views of every step that is complete, or past its grace period (all when ``force``)."""
        return [self.view(done) for done in self.finished(force=force)]

    def view(self, done: Finished) -> StepView:
        """A finished step's view (``finalize.view_of``). A key whose states fail to merge is left
        out, counted in ``internal_errors`` and reported (``on_error``): it never stops the run."""

        def failed(where: str, exc: BaseException) -> None:
            self.counts.internal_errors += 1
            if self.on_error is not None:
                self.on_error(f"experiment {self.id[:64]!r}: {where}", exc)

        return view_of(done, traces=self.traces, watch=self.watch, on_error=failed, order=self.key_order)

    def finished(self, *, force: bool = False, until: float | None = None) -> list[Finished]:
        """Close every step that is complete, or past its grace period (all when ``force``, or once
        every process of the attempt said goodbye and one of them failed), in order; a grace passes
        by ``until`` at the latest (the sink's ``edge.backlog``: a request received in time and not
        yet taken holds it)."""
        out: list[Finished] = []
        now = self.clock() if until is None else min(self.clock(), until)
        steps, readiness, roster = self.steps, self.readiness, self.roster
        held = readiness.held(now)
        # A crash: every process of the attempt said goodbye, one with an exception. Its open steps
        # are final now, as at the job's end, so the failed step is said before its launcher's last
        # lines. Only then: a run that ended cleanly, or time buckets (plain OTel exporters send
        # after the goodbye), keep their grace for a role yet to report; and no step of its own for
        # a failure no open step holds (``died_in``: at the job's end).
        ended = force or (
            bool(steps.open) and not self.windows.bucketed and roster.finished and bool(roster.failed(1)[0])
        )
        for step in sorted(steps.open):  # in order; nothing opens meanwhile (the tenant's lock)
            absent = readiness.final(step, now, held=held, force=ended)
            if absent is None:
                break
            # Named at an earlier step: counted again, not named again.
            away = roster.away(step, steps.open[step].sent)
            roster.give_up(absent)
            labels = [label for label, _ in absent]
            bucket, rewound = steps.close(step, labels + away, now)
            done = self._finished(bucket, labels, rewound=rewound)
            done.away = away
            done.interrupted = ended and bool(absent)  # the job ended while these had not closed it
            if done.interrupted:
                done.failed = roster.failed()
            out.append(done)
        if force and not any(done.interrupted for done in out):  # a failure no open step holds
            died = roster.died_in(steps.last_finalized, self.horizon)
            if died is not None and not steps.open:  # an empty step of its own for the record (``Roster.died_in``)
                step, labels = died
                steps.open[step] = Step(step, now)
                bucket, rewound = steps.close(step, labels, now)
                done = self._finished(bucket, labels, rewound=rewound)
                done.interrupted, done.failed = True, roster.failed()
                out.append(done)
        return out

    def late(self, *, force: bool = False) -> list[Finished]:
        """Late updates due: each step with late data once per ``late_interval`` (all when ``force``),
        its exact total when the window kept its states; back to the window then."""
        now, out = self.clock(), []
        for bucket in self.steps.late.take(now, force=force):
            out.append(self._finished(bucket, list(bucket.missing), late=True))
            if bucket.whole:
                self.steps.retained.keep(bucket, now)
        return out

    def next_deadline(self) -> float | None:
        """When ``finished`` or ``late`` next has something to give (a step's grace, the start hold's
        end, a time bucket's lag, the late updates' interval); None: nothing open or pending."""
        due = self.readiness.deadline(self.clock())
        late = self.steps.late.deadline()
        return due if late is None else late if due is None else min(due, late)

    def _finished(self, bucket: Step, missing: list[str], *, late: bool = False, rewound: bool = False) -> Finished:
        return Finished(
            experiment=self.id,
            step=bucket.step,
            seq=bucket.seq,
            merged=bucket.merged,
            carried=bucket.carried if not late else {},
            parts=bucket.hand_over(),  # the view owns them; late rows start a new list
            samples=entries(bucket.samples, bucket.step, changed_only=late),
            missing=missing,
            late=late,
            arrived=self._arrived(bucket) if late else [],
            partial=not bucket.whole,
            attempt=self.attempt,
            rewound=rewound,
            duration=None if late else self.windows.duration(bucket.step),
            from_start=not late and self.windows.from_start(bucket.step),
            bucket_time=self.windows.bucket_start(bucket.step) if self.windows.bucketed else None,
            late_points=self.counts.late_points,
            internal_errors=self.counts.internal_errors,
            keep_spans=self.keep_spans,
        )

    @staticmethod
    def _arrived(bucket: Step) -> list[str]:
        """The processes a late update names as arrived (they start anew for the next one)."""
        arrived, bucket.arrived = bucket.arrived, []
        return arrived
