"""The end of a run's time buckets: what it took before any process closed a step is its first step's.

Until a process closes its first step, it exports what it recorded so far every
``RANKSCOPE_EXPORT_INTERVAL`` without a step (it may be one that never flushes), and a run none of
whose processes has closed a step puts such data in time buckets (``windows``). A job's first step
is often its slowest (CUDA start, compile, a generator's spawn): its processes' values of that
step went to the buckets, and the buckets were dropped when the first flush marker came, so the
step lacked them. Now the first marker's step takes them over: its window holds everything before
it.

* An open bucket (not viewed yet) gives its running states and its per-process rows (spreads).
* A finalized bucket (viewed, kept for late data in ``retained``) numbered at or above the step
  gives its running states: the step's view rewinds over its view (``StepView.rewound``), so the
  views end with the step whole, not the bucket. Its processes get no per-process value in the
  step (whole or absent, as in a late update, ``Step.hand_over``). One below the step keeps its
  view as written (carried, it would count twice).
* The pending late data of a bucket below the step is dropped (its view stands as written),
  counted in ``abandoned_steps``.
* A bucket's state of a key the step holds with another reduce type (admission holds a key to one
  reduce type within a step, not across steps) is refused, as a state past ``max_keys_per_step``
  keys (the union of many buckets could hold more): counted in the run's refused points.
* The step's view covers the write-ahead-log records of the buckets it took over or dropped
  (``Step.carried``): a restarted sink replays none of them as a step of its own.

The sample rows of an open or live kept bucket join the step's tables (within its limits: the
rest refused, counted). Lost with the rewind over their views: a finalized bucket no longer kept
(past ``retain_seconds``/``retain_bytes``), and a packed bucket's sample rows (packing keeps no
tables). Left where they were: spans filed under a bucket's number. The work is one pass over the
kept buckets, unpacked one at a time: linear in ``retain_bytes``, once per run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from ...otlp.samples import SampleRow
from ..checked import Process, StateRows
from .admission import ExperimentLimits
from .merge import Running, merge_state
from .step import Step
from .steps import StepTable
from .tables import take as take_rows


def carried(table: StepTable, into: int, now: float) -> tuple[Step | None, int, int]:
    """The buckets of ``table`` as one open step ``into`` (None when there were none), how many
    buckets' pending late data was dropped, and how many states were refused. Takes them out of
    ``table``: call before its ``restart``."""
    open_buckets = list(table.open.values())
    table.open.clear()
    pending = table.late.pending
    table.late.pending = {}
    step = Step(into, now)  # opened now: its grace runs from the marker, as a step's from its first data
    dropped = {number: bucket.seq for number, bucket in pending.items() if number < into}
    refused, seqs, limits, retained = 0, itertools.count(1), table.admission.limits, table.retained
    for number in sorted({*retained.hot, *retained.packed, *pending}):  # oldest first: a custom type's list in order
        found = (pending.get(number) or retained.take(number, now)) if number >= into else None  # one at a time
        if found is not None:
            refused += _merge(step, found, limits, seqs)
    for bucket in sorted(open_buckets, key=lambda b: b.step):
        refused += _merge(step, bucket, limits, seqs)
    if not step.carried and not dropped:
        return None, 0, refused
    step.carried.update(dropped)  # their late data is dropped: its records are covered all the same
    if refused:  # no process's value of a key the step does not hold (or holds with another reduce type)
        step.parts = [(process, _within(rows, step.merged)) for process, rows in step.parts]
    return step, len(dropped), refused


def _merge(step: Step, bucket: Step, limits: ExperimentLimits, seqs: Iterator[int]) -> int:
    """``bucket`` into ``step``; how many of its states and sample rows were refused."""
    merged, refused, limit = step.merged, 0, limits.max_keys_per_step
    for key, state in bucket.merged.items():
        held = merged.get(key)
        if (held is None and len(merged) < limit) or (held is not None and held[0] == state[0]):
            merge_state(merged, key, state)
        else:
            refused += 1
    step.parts += bucket.parts
    step.viewed |= bucket.viewed
    step.reporters |= bucket.reporters
    step.seq = max(step.seq, bucket.seq)
    step.carried[bucket.step] = bucket.seq
    for table in bucket.samples.values():  # a live bucket's (a packed one's tables are not kept)
        rows: dict[Process, list[SampleRow]] = {}
        for kept in table.kept:
            process, row = kept.origin
            # a row's seq counts within one export: rows of two buckets (and the step's own) share them,
            # and a table takes a (process, seq) it holds for a retry. Carried rows get their own
            # (negative: a client's are not).
            rows.setdefault(process, []).append(replace(row, seq=-next(seqs)))
        for process, mine in rows.items():
            found = take_rows(step.samples, process, mine, limits.max_sample_tables, limits.max_sample_chars_per_step)
            refused += sum(n for n, _ in found)
    return refused


def _within(rows: StateRows, merged: dict[str, Running]) -> StateRows:
    kept = [i for i, key in enumerate(rows.keys) if key in merged and merged[key][0] == rows.reduce]
    within = StateRows(rows.reduce, rows.step, [rows.keys[i] for i in kept], [rows.rows[i] for i in kept])
    if rows.spreads:  # by position: renumbered
        within.spreads = {n: rows.spreads[i] for n, i in enumerate(kept) if i in rows.spreads}
    return within
