"""When an open step is final, and who it closes without.

* Step N is final when nothing is missing (``roster``; a controller's flushed count), or
  ``grace`` seconds after its first data.
* In the run's first ``start_hold`` seconds (until ``HOLD_STEPS`` are open, or every process said
  goodbye) only by grace (or the end): a process is missing only once it has flushed a step, so
  one that starts a little after the others (a generator spawned by rank 0) would find the first step final without it.
* A time bucket is final once it is over plus ``time_bucket_lag`` (``windows``).
* Through a Collector tree a window's rank sets come after its states, and the sink takes a
  request's resources one at a time: until a process has closed a step (of the attempt, for a
  run fed only by a tree: a restart forgets the rank sets), a step holding a merge's states and no
  closer waits for them (up to the grace), or the finalizer, finding nobody absent yet, would make
  the first step final between two of its resources.

It decides; the book closes (``steps.close``) and names the missing.
"""

from __future__ import annotations

from .roster import Absent, Roster
from .steps import StepTable
from .windows import StepWindows

HOLD_STEPS = 16
"""Steps open at once that end a run's ``start_hold`` early: a fast job's first steps are not held
so long that their spans leave the trace store (64 steps) before they are judged."""


class Readiness:
    """The rules that make a run's open step final. Re-asks the roster only when its version moved."""

    def __init__(
        self, *, grace: float, start_hold: float, roster: Roster, windows: StepWindows, steps: StepTable, now: float
    ) -> None:
        self.grace = grace
        self.held_until: float | None = now + min(start_hold, grace)
        """Until then, a step is final only by its grace (``start_hold``); None: the hold is over."""
        self.roster = roster
        self.windows = windows
        self.steps = steps
        self._checked: tuple[int, int, list[Absent]] = (-1, -1, [])
        """(step, roster version, absent): ``final`` re-checks a step only when the version moved."""

    def end_hold(self) -> None:
        """End the run's ``start_hold`` now (a report asked for: what is complete is final)."""
        self.held_until = None

    def held(self, now: float) -> bool:
        """Whether complete steps still wait for their grace (the start hold; time buckets wait for
        their lag anyway). The hold ends at its time, once ``HOLD_STEPS`` steps are open, or once the
        run's attempt is over (every process said goodbye and every declared rank reported: nobody
        is left to wait for, and a short job's end is not held up)."""
        held_until = self.held_until
        if held_until is not None and (now >= held_until or len(self.steps.open) >= HOLD_STEPS or self.roster.finished):
            self.held_until = None
        return self.held_until is not None and not self.windows.bucketed

    def absent(self, step: int) -> list[Absent]:
        """Who ``step`` still waits for: the roster's absent, a controller whose actors closed the
        step, and the processes a controller flushed that have not reported (``+N unnamed``)."""
        bucket = self.steps.open.get(step)
        absent = self.roster.absent(step, bucket.sent if bucket is not None else ())
        if bucket is not None and bucket.driven and not bucket.expected:
            absent.append(("controller", None))  # actors closed the step; their controller's count is due
        if bucket is not None and bucket.expected > len(bucket.reporters) + len(absent):
            absent.append((f"+{bucket.expected - len(bucket.reporters) - len(absent)} unnamed", None))
        return absent

    def missing(self, step: int) -> list[str]:
        """Who step ``step`` still waits for, by label."""
        return [label for label, _ in self.absent(step)]

    def final(self, step: int, now: float, *, held: bool, force: bool = False) -> list[Absent] | None:
        """Who open ``step`` is final without (empty: nobody), or None while it is not final
        (``held``: what ``held`` said this round; ``force``: the job ended, every step is final)."""
        if self._checked[:2] != (step, self.roster.version):  # nothing that decides it changed: reuse
            self._checked = (step, self.roster.version, self.absent(step))
        absent = self._checked[2]
        bucket = self.steps.open[step]
        # A step holding only sample rows (sent before their process's flush marker) waits
        # for a marker like a step with an absent process, up to the grace period.
        rows_only = not bucket.reporters and not bucket.merged and bool(bucket.samples)
        unclosed = (  # cheapest first: the roster's walk comes last
            bucket.from_merge
            and not bucket.reporters
            and not self.windows.bucketed  # a time bucket has its own lag
            and not self.roster.stepping
        )
        if (absent or rows_only or unclosed or held) and not force and now - bucket.opened < self.grace:
            return None
        if self.windows.bucketed and not force and now < self.windows.bucket_due(step, now):
            return None
        return absent

    def deadline(self, now: float) -> float | None:
        """When the lowest open step is final at the latest (its grace, the hold's end, a time
        bucket's lag); None: nothing open."""
        open_steps = self.steps.open
        if not open_steps:
            return None
        lowest = min(open_steps)
        if self.windows.bucketed:
            return self.windows.bucket_due(lowest, now)
        due = open_steps[lowest].opened + self.grace
        return due if self.held_until is None else min(due, self.held_until)
