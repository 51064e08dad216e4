"""The end of a run's time buckets: what it took before any process closed a step is its first step's.

Until a process closes its first step, it exports what it recorded so far every
``RANKSCOPE_EXPORT_INTERVAL`` without a step (it may be one that never flushes), and a run none of
whose processes has closed a step puts such data in time buckets (``windows``). A job's first step
is often its slowest (CUDA start, compile, a generator's spawn): its processes' values of that
step went to the buckets, and the buckets were dropped when the first flush marker came, so the
step lacked them. Now the first marker's step takes them over: its window holds everything before
it.

* An open bucket (not viewed yet) gives its running states and its per-process rows (spreads).
* A finalized bucket (viewed, kept for late data in ``retained``) gives its running states when
  the step is at or below its view, so the step's view rewinds it (``StepView.rewound``): the
  views end with the step whole, not the buckets. Its processes get no per-process value in the
  step (whole or absent, as in a late update, ``Step.hand_over``). A step above every bucket's
  view leaves them as they were written (carried, they would count twice).
* A finalized bucket no longer kept (past ``retain_seconds``/``retain_bytes``), or not carried,
  is counted in ``abandoned_steps`` when it had pending late data or was lost. Sample rows of
  open buckets are not carried (the tables of finalized ones were written with their views).
* The step takes at most ``max_keys_per_step`` keys (the union of many buckets could hold more);
  the points of the rest are refused, counted.
"""

from __future__ import annotations

from ..checked import StateRows
from .merge import Running, merge_state
from .step import Step
from .steps import StepTable


def carried(table: StepTable, first: int, into: int, now: float) -> tuple[Step | None, int, int]:
    """Every bucket of ``table`` (``first``: the first one's step) as one open step ``into`` (None
    when there were none), how many buckets are lost (finalized ones no longer kept, pending late
    updates not carried), and how many points were refused (the key limit). Takes them out of
    ``table``: call before its ``restart``."""
    buckets = list(table.open.values())
    table.open.clear()
    pending = list(table.late.pending.values())
    table.late.pending.clear()
    rewinds = into <= table.last_viewed
    lost = 0
    if rewinds:
        finalized = {bucket.step for bucket in pending}
        buckets += pending
        retained = table.retained
        for number in [*retained.hot, *retained.packed]:
            found = retained.take(number, now)
            if found is not None and found.step not in finalized:
                buckets.append(found)
                finalized.add(found.step)
        lost = sum(1 for number in range(first, table.last_finalized + 1) if number not in finalized)
    else:
        lost = len(pending)  # their late data: the buckets' views stand as written
    if not buckets:
        return None, lost, 0
    step = Step(into, now)  # opened now: its grace runs from the marker, as a step's from its first data
    limit, refused = table.admission.limits.max_keys_per_step, 0
    merged = step.merged
    for bucket in buckets:
        for key, state in bucket.merged.items():
            if key in merged or len(merged) < limit:
                merge_state(merged, key, state)
            else:
                refused += 1
        step.parts += bucket.parts
        step.viewed |= bucket.viewed
        step.reporters |= bucket.reporters
        step.seq = max(step.seq, bucket.seq)
    if refused:  # no process's value of a key the step does not hold
        step.parts = [(process, _within(rows, merged)) for process, rows in step.parts]
    return step, lost, refused


def _within(rows: StateRows, merged: dict[str, Running]) -> StateRows:
    kept = [i for i, key in enumerate(rows.keys) if key in merged]
    within = StateRows(rows.reduce, rows.step, [rows.keys[i] for i in kept], [rows.rows[i] for i in kept])
    if rows.spreads:  # by position: renumbered
        within.spreads = {n: rows.spreads[i] for n, i in enumerate(kept) if i in rows.spreads}
    return within
