"""The end of a run's time buckets: what it took before any process closed a step is its first step's.

Until a process closes its first step, it exports what it recorded so far every
``RANKSCOPE_EXPORT_INTERVAL`` without a step (it may be one that never flushes), and a run none of
whose processes has closed a step puts such data in time buckets (``windows``). A job's first step
is often its slowest (CUDA start, compile, a generator's spawn): its processes' values of that
step went to the buckets, and the buckets were dropped when the first flush marker came, so the
step lacked them. Now the first marker's step takes them over: its window holds everything before
it.

* An open bucket (not viewed yet) gives its running states and its per-process rows (spreads).
* A finalized bucket (viewed, kept for late data in ``retained``) gives its running states; its
  processes get no per-process value in the step (whole or absent, as in a late update,
  ``Step.hand_over``). The step is at or below those views, so its view rewinds them
  (``StepView.rewound``): the views end with the step whole, not the buckets.
* A finalized bucket no longer kept (past ``retain_seconds``/``retain_bytes``) cannot be carried:
  the caller counts it in ``abandoned_steps``. Sample rows of open buckets are not carried (the
  tables of finalized ones were written with their views).
"""

from __future__ import annotations

from .merge import merge_state
from .step import Step
from .steps import StepTable


def carried(table: StepTable, first: int, into: int, now: float) -> tuple[Step | None, int]:
    """Every bucket of ``table`` (``first``: the first one's step) as one open step ``into`` (None
    when there were none), and how many finalized buckets were no longer kept. Takes them out of
    ``table``: call before its ``restart``."""
    buckets = list(table.open.values()) + list(table.late.pending.values())
    finalized = {bucket.step for bucket in table.late.pending.values()}
    table.open.clear()
    table.late.pending.clear()
    retained = table.retained
    for number in [*retained.hot, *retained.packed]:
        found = retained.take(number, now)
        if found is not None and found.step not in finalized:
            buckets.append(found)
            finalized.add(found.step)
    lost = sum(1 for number in range(first, table.last_finalized + 1) if number not in finalized)
    if not buckets:
        return None, lost
    step = Step(into, now)  # opened now: its grace runs from the marker, as a step's from its first data
    for bucket in buckets:
        for key, state in bucket.merged.items():
            merge_state(step.merged, key, state)
        step.parts += bucket.parts
        step.viewed |= bucket.viewed
        step.reporters |= bucket.reporters
        step.seq = max(step.seq, bucket.seq)
    return step, lost
