"""The run's steps by state, open, done and late, and where a part of step N goes.

* A step opens with its first data and takes what comes until it is finalized (``close``).
* Data of a finalized step is late: it merges into the step's pending late update (``late``),
  built on the step's kept states while the window keeps them (``retained``), so the update is
  the step's exact total; past it, on the late data alone (a partial step, said as such).
* A part is placed (``place``) only within ``step_window`` of the frontier, and opens a step only
  within ``max_open_steps``; what it holds is then admitted against its step (``admission``).
* A restart drops every step (``restart``); a resumed run goes on after the step an earlier
  attempt finalized last (``restore``), and a step finalized at or below it is a rewind.

The step table decides nothing about when a step is final (``readiness``) or who sent what
(``roster``): it holds the steps and merges into them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import replace

from ...core.identity import label_of
from ...otlp.markers import Marker, Ranks
from ...otlp.samples import SampleRow
from ..checked import Process, Refusals, ResourceBatch, StateRows
from .admission import Admission
from .counts import Counts
from .late import LateSteps
from .merge import Running, merge_rows
from .retained import Retained
from .spread import JUDGED
from .step import Step
from .tables import take


def _together(states: list[StateRows], step_at: Callable[[int], int]) -> Callable[[int | None, int], int]:
    """(step or None, time) -> step for one batch. Its rows without a step go together, at the
    newest of their times: a ``LAST`` point carries its value's own time and a ``SUM`` the export's,
    and by their own times the keys of one export would split over two steps. Its sample rows
    without a step go with them (alone, each by its own time)."""
    stepless = [rows.time_unix_nano for rows in states if rows.step is None]
    together = step_at(max(stepless)) if stepless else None

    def step_of(step: int | None, time_unix_nano: int) -> int:
        if step is not None:
            return step
        return together if together is not None else step_at(time_unix_nano)

    return step_of


class StepTable:
    """One run's open, done and late steps. Counts the late points and sample rows it merges."""

    def __init__(
        self,
        *,
        retained: Retained,
        step_window: int,
        late_interval: float,
        admission: Admission,
        counts: Counts,
        now: float,
    ) -> None:
        self.retained = retained
        self.step_window = step_window
        self.admission = admission
        self.counts = counts
        self.open: dict[int, Step] = {}
        """Steps taking data, by number. Cleared in place, never replaced (``readiness`` reads it)."""
        self.late = LateSteps(late_interval, now)
        self.last_finalized = -1
        self.last_viewed = -1
        """The last step finalized (never reset by a restart): one at or below it comes again
        (``StepView.rewound``)."""

    @property
    def frontier(self) -> int:
        """The step new data is measured against: the last finalized, else the lowest open one, else
        the last step any attempt of the run finalized (0 for a new run): a run's first step is held
        to the same ``step_window`` as every later one, so one point cannot make the run's steps late."""
        if self.last_finalized >= 0:
            return self.last_finalized
        return min(self.open) if self.open else max(self.last_viewed, 0)

    @property
    def settled(self) -> bool:
        """Nothing open and no late update pending: every step taken is finalized."""
        return not self.open and not self.late.pending

    def room(self, step: int) -> tuple[Mapping[str, Running], int | None]:
        """What admission weighs a part of ``step`` against: its keys so far, and its late points
        when it is finalized (None: it is not)."""
        if step <= self.last_finalized:
            bucket = self.late.pending.get(step) or self.retained.peek(step)
            return (bucket.merged, bucket.late_points) if bucket is not None else ({}, 0)
        bucket = self.open.get(step)
        return (bucket.merged if bucket is not None else {}), None

    def place(
        self,
        batch: ResourceBatch,
        states: list[StateRows],
        refused: Refusals,
        step_at: Callable[[int], int],
        *,
        replayed: bool = False,
    ) -> tuple[dict[int, ResourceBatch], list[Marker]]:
        """The batch's parts by step, in order, each admitted (``admission``), and the flush markers
        of steps finalized already (they say the process is live: nothing to log). ``states``: the
        batch's rows, its plain points made rows. Rows without a step are ``step_at`` the newest of
        their times, all of them (sample rows too; alone, a sample row goes by its own); what
        is beyond the step window or over a limit is refused. A ``replayed`` record was
        acknowledged once: it keeps its step and opens it whatever ``max_open_steps`` says."""
        frontier = self.frontier
        horizon = frontier + self.step_window
        last_finalized, open_steps, admission = self.last_finalized, self.open, self.admission
        parts: dict[int, ResourceBatch] = {}
        opened = 0

        def part(step: int, n: int, what: str) -> ResourceBatch | None:
            """The batch's part of ``step`` for ``n`` items (``what``: how a refusal names them); None
            when refused: beyond the step window, or opening a step past ``max_open_steps``."""
            nonlocal opened
            if step > horizon and not replayed:
                refused.add(n, f"{what}: step {step} is more than {self.step_window} ahead of {frontier}")
                return None
            found = parts.get(step)
            if found is None:
                if not replayed and step > last_finalized and step not in open_steps:
                    if not admission.opens_step(len(open_steps) + opened):
                        limit = admission.limits.max_open_steps
                        refused.add(n, f"{what}: step {step} would open more than {limit} steps (limit)")
                        return None
                    opened += 1
                found = parts[step] = ResourceBatch(batch.experiment, batch.resource)
            return found

        step_of = _together(states, step_at)
        for rows in states:
            step = step_of(rows.step, rows.time_unix_nano)
            found = part(step, len(rows.keys), rows.keys[0])
            if found is not None:  # a resolved step, so a write-ahead-log record always names its step
                found.states.append(
                    rows if rows.step is not None else StateRows(rows.reduce, step, rows.keys, rows.rows)
                )
        for row in batch.samples:
            step = step_of(row.step, row.time_unix_nano)
            found = part(step, 1, "sample row")
            if found is not None:
                found.samples.append(row if row.step is not None else replace(row, step=step))
        for marker in batch.markers:
            found = part(marker.step, 1, "flush marker")
            if found is not None:
                found.markers.append(marker)

        admitted: dict[int, ResourceBatch] = {}
        settled: list[Marker] = []
        for step, found in sorted(parts.items()):
            found.states = admission.states(step, found.states, *self.room(step), refused)
            if step <= last_finalized:
                settled += found.markers
                found.markers = []
            if found.states or found.markers or found.samples:
                admitted[step] = found
        return admitted, settled

    def merge(self, process: Process, step: int, part: ResourceBatch, seq: int, now: float, refused: Refusals) -> int:
        """Merge a part's rows and sample rows into ``step`` (its markers are the book's); returns the
        points taken. ``seq``: the write-ahead-log record it came in."""
        if not part.states and not part.samples:
            bucket = self.open.get(step)
            if bucket is not None:  # a marker's record: the step's view covers it (the log drops it then)
                bucket.seq = max(bucket.seq, seq)
            return 0
        late = step <= self.last_finalized
        if late:  # merged into the step's kept states, or alone past the window (partial)
            kept = self.late.pending.get(step) or self.retained.peek(step)
            if kept is not None and 0 < seq <= kept.seq:  # a replayed record the kept state holds already
                return 0
            bucket = self.late.bucket(step, self.retained.take, now)
            named = process.label in bucket.missing  # it arrived: the step was finalized without it
            if named:
                bucket.missing.remove(process.label)
            if (named or not bucket.whole) and process.label not in bucket.arrived:
                bucket.arrived.append(process.label)
        else:
            bucket = self.open.get(step) or self.open.setdefault(step, Step(step, now))
        bucket.seq = max(bucket.seq, seq)
        if not process.merged:
            bucket.sent.add(process.id)
        if part.samples:  # counted apart from points (``sample_rows``)
            self._samples(process, bucket, part.samples, late, refused)
        taken = 0
        bucket.from_merge = bucket.from_merge or process.merged
        merged, parts, rank, label = bucket.merged, bucket.parts, process.rank, process.label
        for rows in part.states:
            merge_rows(merged, rows.reduce, rows.keys, rows.rows, rank, label)
            if not process.merged or rows.reduce in JUDGED:  # a merge's rows: for their spreads only
                parts.append((process, rows))
            taken += len(rows.keys)
        if late:
            bucket.late_points += taken
            self.counts.late_points += taken
            if not bucket.whole:
                self.counts.partial_points += taken
        return taken

    def _samples(self, process: Process, bucket: Step, rows: list[SampleRow], late: bool, refused: Refusals) -> None:
        """Merge sample rows into their step's tables. Late ones count against the step's late
        points, and go only into a step still retained: a table rebuilt from late rows alone
        would be written as if it were that step's selection."""
        if late:
            if not (bucket.whole and bucket.tables):
                refused.add(len(rows), f"sample rows: step {bucket.step}'s tables are no longer kept")
                return
            rows = rows[: self.admission.late_rows(bucket.step, len(rows), bucket.late_points, refused)]
            bucket.late_points += len(rows)
        limits = self.admission.limits
        kept = len(rows)
        for n, why in take(bucket.samples, process, rows, limits.max_sample_tables, limits.max_sample_chars_per_step):
            refused.add(n, why)
            kept -= n
        self.counts.sample_rows += kept

    def marked(self, process: Process, marker: Marker, now: float) -> None:
        """``process`` closed ``marker.step``: an open step (opened by the marker if need be) knows
        who reported, how many its controller flushed (``expected``) and whether actors drive it."""
        if marker.step <= self.last_finalized:
            return
        bucket = self.open.get(marker.step) or self.open.setdefault(marker.step, Step(marker.step, now))
        bucket.reporters.add(process.id)
        bucket.expected = max(bucket.expected, marker.expected)
        bucket.driven = bucket.driven or marker.driven

    def ranks_arrived(self, step: int, ranks: Ranks) -> None:
        """A merged marker of finalized ``step``: the ranks it names that the step was finalized
        without arrived (their states came merged, before the marker), so its late update says so."""
        bucket = self.late.pending.get(step)
        if bucket is None or not bucket.missing:
            return
        prefix = label_of(ranks.role, ranks.replica, "")
        lows = [low for low, _ in ranks.spans]

        def closed(label: str) -> bool:
            rank = label[len(prefix) :]
            if not label.startswith(prefix) or not rank.isascii() or not rank.isdigit() or len(rank) > 7:
                return False
            at = bisect_right(lows, int(rank)) - 1
            return at >= 0 and int(rank) <= ranks.spans[at][1]

        arrived = [m for m in bucket.missing if closed(m)]
        if arrived:  # one pass each: a late set may name a whole group
            bucket.missing[:] = [m for m in bucket.missing if not closed(m)]
            known = set(bucket.arrived)
            bucket.arrived.extend(m for m in arrived if m not in known)

    def close(self, step: int, missing: list[str], now: float) -> tuple[Step, bool]:
        """Finalize open ``step`` (the lowest) without ``missing`` (labels): it is kept for late
        data; and whether it is a rewind (a step at or below one finalized before: a restart, a resume)."""
        bucket = self.open.pop(step)
        self.last_finalized = step
        bucket.missing, bucket.finalized = list(missing), now
        self.retained.keep(bucket, now)
        rewound = step <= self.last_viewed
        self.last_viewed = step
        return bucket, rewound

    def restart(self) -> int:
        """A new attempt executes steps again: every step is dropped; returns how many were open
        (``abandoned_steps``)."""
        abandoned = len(self.open)
        self.open.clear()
        self.retained.clear()
        self.late.clear()
        self.last_finalized = -1
        return abandoned

    def restore(self, last_finalized: int) -> None:
        """Go on after the last step an earlier sink (or attempt) finalized."""
        self.last_finalized = self.last_viewed = last_finalized
