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
* Steps are finalized in increasing order. Points without a step (free-running
  processes) join the step in progress: the lowest open step, else the one after the last
  finalized step.
* Points for a finalized step are late: counted (``rankscope/late_points``), merged into
  the step's retained states, and written again as a late update of that step, at most
  once per step per ``late_interval`` (a flood of late processes costs one rewrite, not one
  per request).

Input comes checked from ``sink.validate``; the limits that depend on the experiment's own
state (steps within ``step_window`` of the frontier, processes, keys per step, late points
per step) are enforced here, in ``apply``, and refused points are counted. A key whose
states fail to merge (a third-party reduce type) is left out of the view and counted in
``internal_errors``: it never stops the experiment.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Metric
from ..core import names as attr
from ..core.identity import label_of
from ..metrics.reduce import Reduce, reduced_items
from .traces import TraceStore
from .validate import Limits, Point, Refusals, ResourceBatch


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

    @property
    def group(self) -> tuple[str, str | None, int]:
        return (self.role, self.replica, self.attempt)


@dataclass(slots=True)
class _Step:
    step: int
    opened: float
    states: dict[str, list[tuple[Process, dict[str, Any]]]] = field(default_factory=dict)
    reduces: dict[str, Reduce] = field(default_factory=dict)
    expected: int = 0
    driven: bool = False
    reporters: set[str] = field(default_factory=set)
    seq: int = 0
    """Newest write-ahead-log record merged into this step (what a written view covers)."""
    late_points: int = 0


class StepView:
    """A finished step: the global values, each process's values (computed on first use), who was missing."""

    def __init__(
        self,
        experiment: str,
        step: int,
        bucket: _Step,
        global_metrics: list[Metric],
        missing: list[str],
        late: bool,
        on_error: Callable[[str, BaseException], None] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.experiment, self.step, self.missing, self.late = experiment, step, missing, late
        self.global_metrics = global_metrics
        self.labels = labels or {}
        """Process labels of values that name a process (``{key}/argmax_rank``): the console shows them."""
        self.seq = bucket.seq
        self._bucket = bucket
        self._on_error = on_error
        self._per_process: dict[Process, list[Metric]] | None = None

    @property
    def per_process(self) -> dict[Process, list[Metric]]:
        """Per-process values, reduced only when a view asks (per-rank views, W&B series)."""
        if self._per_process is None:
            self._per_process = _per_process(self._bucket, self._on_error)
        return self._per_process


def _per_process(bucket: _Step, on_error: Callable[[str, BaseException], None] | None) -> dict[Process, list[Metric]]:
    stamp = time.time()
    per_process: dict[Process, list[Metric]] = {}
    for key, entries in list(bucket.states.items()):
        reduce = bucket.reduces[key]
        by_process: dict[Process, list[dict[str, Any]]] = {}
        for process, state in entries:
            if not process.merged:  # a merge is many processes: no per-process value
                by_process.setdefault(process, []).append(state)
        for process, states in by_process.items():
            items = merged(key, reduce, states, on_error)
            per_process.setdefault(process, []).extend(Metric(n, v, reduce, stamp) for n, v in items)
    return dict(sorted(per_process.items(), key=lambda kv: (kv[0].role, kv[0].replica or "", kv[0].rank)))


def _extreme_rank(
    key: str, reduce: Reduce, entries: list[tuple[Process, dict[str, Any]]], stamp: float
) -> tuple[Metric, str]:
    """``{key}/argmax_rank`` (or ``argmin_rank``): the rank that holds a MAX (MIN) key's extreme
    this step, the lowest such rank on a tie, and that process's label. A state merged by a
    Collector says who holds its extreme (``holder_rank``). Ranks of different roles share the
    numbering."""
    field = reduce.value
    held = [
        (state[field], state.get("holder_rank", process.rank), state.get("holder_label") or process.label)
        for process, state in entries
    ]
    if reduce is Reduce.MAX:
        _, rank, label = max(((v, -r, lab) for v, r, lab in held), key=lambda t: (t[0], t[1]))
        rank = -rank
    else:
        _, rank, label = min(held, key=lambda t: (t[0], t[1]))
    if label.startswith("rankscope-merge"):  # a merged state from before holders were carried
        label = f"rank {rank}"
    name = f"{key}/argmax_rank" if reduce is Reduce.MAX else f"{key}/argmin_rank"
    return Metric(name, float(rank), Reduce.MAX, stamp), label


def merged(
    key: str, reduce: Reduce, states: list[dict[str, Any]], on_error: Callable[[str, BaseException], None] | None
) -> list[tuple[str, float]]:
    """The reduced (name, value) pairs of one key, or none if its reduce type fails on these states."""
    try:
        return reduced_items(key, reduce.accumulator_class.get_reduced_value_from_states(states))
    except Exception as exc:  # a third-party reducer: leave the key out, keep the experiment going
        if on_error is not None:
            on_error(f"merging {key!r} ({reduce.value})", exc)
        return []


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Experiment:
    """State of one experiment id. Not thread-safe: one thread owns it."""

    def __init__(
        self,
        experiment_id: str,
        *,
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
    ) -> None:
        self.id = experiment_id
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
        self.late_points = 0
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
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        """Digests of recently taken ResourceMetrics: a client's retry is acknowledged, not merged twice."""

    # -- ingest ------------------------------------------------------------------------

    def process_for(self, resource: Mapping[str, Any]) -> Process | None:
        """The sending process (created on first sight), or None past ``max_processes``."""
        pid = str(resource.get(attr.SERVICE_INSTANCE_ID) or resource.get(attr.PROCESS_PID) or "?")
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
        self.processes[pid] = process
        if not process.merged:
            self._labels[label] = pid
        if attempt > self.attempt:
            self._new_attempt(attempt)
        return process

    def _new_attempt(self, attempt: int) -> None:
        """A restarted job (torchelastic restart count went up) replays steps from its checkpoint."""
        self.attempt = attempt
        for p in self.processes.values():
            if p.attempt < attempt:
                p.live = False
        self.last_finalized = min(self._open, default=0) - 1 if self._open else -1
        self._done.clear()
        self._late.clear()

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
            self._refuse(refused, len(batch.points) + len(batch.markers), f"{self.max_processes} processes (limit)")
            return 0
        if not process.live and process.attempt >= self.attempt:
            process.live = True  # it came back
        frontier = self.frontier
        horizon = None if frontier is None else frontier + self.limits.step_window
        parts: dict[int, ResourceBatch] = {}
        for point in batch.points:
            step = point.step
            if step is None:
                step = min(self._open) if self._open else self.last_finalized + 1
                point = Point(point.key, point.reduce, step, point.state)
            elif horizon is not None and step > horizon:
                window = self.limits.step_window
                self._refuse(refused, 1, f"{point.key}: step {step} is more than {window} ahead of {frontier}")
                continue
            parts.setdefault(step, ResourceBatch(batch.experiment, batch.resource)).points.append(point)
        for marker in batch.markers:
            if horizon is not None and marker.step > horizon:
                self._refuse(refused, 1, f"flush marker: step {marker.step} is over {self.limits.step_window} ahead")
            elif marker.step > self.last_finalized:  # a marker of a finalized step changes nothing
                parts.setdefault(marker.step, ResourceBatch(batch.experiment, batch.resource)).markers.append(marker)
            else:
                self._marker(process, marker.step, marker.expected, marker.driven, now)
        taken = 0
        for step in sorted(parts):
            part = parts[step]
            part.points = self._admit(step, part.points, refused)
            if part.points or part.markers:
                taken += self._merge(process, step, part, log(step, part) if log is not None else seq, now)
        if batch.goodbye:
            process.live = False
        self.points += taken
        if process.merged:
            self.merged_points += taken
        return taken

    def _refuse(self, refused: Refusals, n: int, why: str) -> None:
        refused.add(n, why)
        self.refused += n

    def _admit(self, step: int, points: list[Point], refused: Refusals) -> list[Point]:
        """The points of ``step`` that fit its limits (keys per step, late points per step, one reduce per key)."""
        late = step <= self.last_finalized
        bucket = (self._late.get(step) or self._done.get(step)) if late else self._open.get(step)
        reduces = dict(bucket.reduces) if bucket is not None else {}
        late_room = self.max_late_points_per_step - (bucket.late_points if bucket is not None else 0)
        kept: list[Point] = []
        for point in points:
            known = reduces.get(point.key)
            if known is None:
                if len(reduces) >= self.max_keys_per_step:
                    self._refuse(refused, 1, f"{point.key}: step {step} has {self.max_keys_per_step} keys (limit)")
                    continue
                known = reduces[point.key] = Reduce.get(point.reduce)
            if known.value != point.reduce:
                self._refuse(refused, 1, f"{point.key}: recorded as {known.name} and as {point.reduce.upper()}")
                continue
            if late:
                if late_room <= 0:
                    limit = self.max_late_points_per_step
                    self._refuse(refused, 1, f"{point.key}: step {step} has {limit} late points (limit)")
                    continue
                late_room -= 1
            kept.append(point)
        return kept

    def _merge(self, process: Process, step: int, part: ResourceBatch, seq: int, now: float) -> int:
        for marker in part.markers:
            self._marker(process, marker.step, marker.expected, marker.driven, now)
        if step <= self.last_finalized:
            bucket = self._late.get(step)
            if bucket is None:  # merged into the retained step, or written on its own past the window
                bucket = self._late[step] = self._done.get(step) or _Step(step, now)
            bucket.late_points += len(part.points)
            self.late_points += len(part.points)
        else:
            bucket = self._open.get(step) or self._open.setdefault(step, _Step(step, now))
        bucket.seq = max(bucket.seq, seq)
        for point in part.points:
            reduce = bucket.reduces.setdefault(point.key, Reduce.get(point.reduce))
            if reduce.value == point.reduce:  # else refused by _admit; only a replayed record gets here
                bucket.states.setdefault(point.key, []).append((process, point.state))
        return len(part.points)

    def stream_process(self, batch: ResourceBatch, refused: Refusals) -> Process | None:
        """The process of streamed values (``per_rank_no_reduce``), counted as activity."""
        self.last_activity = self.clock()
        process = self.process_for(batch.resource)
        if process is None:
            self._refuse(refused, len(batch.streams), f"{self.max_processes} processes (limit)")
        return process

    def _marker(self, process: Process, step: int, expected: int, driven: bool, now: float) -> None:
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
            absent = self._absent(step)
            bucket = self._open[step]
            if absent and not force and now - bucket.opened < self.grace:
                break
            del self._open[step]
            self._give_up_on(absent)
            missing = [label for label, _ in absent]
            self.last_finalized = step
            self._done[step] = bucket
            while len(self._done) > self.retain_steps:
                self._done.popitem(last=False)
            out.append(self._view(bucket, missing))
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
        return self._open[min(self._open)].opened + self.grace

    def _give_up_on(self, absent: list[tuple[str, Any]]) -> None:
        """Named once, not waited for again until they report (a dead rank costs one grace period)."""
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
        for key, entries in bucket.states.items():
            reduce = bucket.reduces[key]
            items = merged(key, reduce, [state for _, state in entries], self._merge_error)
            global_metrics.extend(Metric(n, v, reduce, stamp) for n, v in items)
            if items and (reduce is Reduce.MAX or reduce is Reduce.MIN):
                metric, label = _extreme_rank(key, reduce, entries, stamp)
                global_metrics.append(metric)
                labels[metric.key] = label
        if not late:
            global_metrics.extend(self.traces.stragglers(bucket.step))
            global_metrics.append(Metric(attr.MISSING_PROCESSES, float(len(missing)), Reduce.MAX, stamp))
            if self.late_points:
                global_metrics.append(Metric(attr.LATE_POINTS, float(self.late_points), Reduce.MAX, stamp))
            if self.internal_errors:
                global_metrics.append(Metric(attr.INTERNAL_ERRORS, float(self.internal_errors), Reduce.MAX, stamp))
        return StepView(self.id, bucket.step, bucket, global_metrics, missing, late, self._merge_error, labels)

    def _merge_error(self, where: str, exc: BaseException) -> None:
        self.internal_errors += 1
        if self.on_error is not None:
            self.on_error(f"experiment {self.id[:64]!r}: {where}", exc)

    def local_pids(self, host: str) -> set[int]:
        return {p.pid for p in self.processes.values() if p.pid and p.host == host}
