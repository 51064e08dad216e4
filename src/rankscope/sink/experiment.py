"""One experiment's step alignment: which process reported which step, and when a step is done.

Pure logic with an injected clock; the service feeds it decoded OTLP and hands the
finished ``StepView``s to the backends.

The rules (documented in the README):

* A process that has ever sent a flush marker (``rankscope.flush``) is *stepped*: step N
  waits for its marker N. SPMD ranks flush themselves; Monarch actor processes are flushed
  by their controller's ``flush(N)`` (``rankscope._internal.monarch``), so they are stepped
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
  the step's retained states, and written again as a late update of that step.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._internal import attributes as attr
from .._internal.backends.base import Metric
from .._internal.reduce import Reduce, reduced_items
from .._internal.wire import attributes_dict, decode_metric
from .traces import TraceStore


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


class StepView:
    """A finished step: the global values, each process's values (computed on first use), who was missing."""

    def __init__(
        self, experiment: str, step: int, bucket: _Step, global_metrics: list[Metric], missing: list[str], late: bool
    ) -> None:
        self.experiment, self.step, self.missing, self.late = experiment, step, missing, late
        self.global_metrics = global_metrics
        self._bucket = bucket
        self._per_process: dict[Process, list[Metric]] | None = None

    @property
    def per_process(self) -> dict[Process, list[Metric]]:
        """Per-process values, reduced only when a view asks (per-rank views, W&B series)."""
        if self._per_process is None:
            self._per_process = _per_process(self._bucket)
        return self._per_process


def _per_process(bucket: _Step) -> dict[Process, list[Metric]]:
    stamp = time.time()
    per_process: dict[Process, list[Metric]] = {}
    for key, entries in bucket.states.items():
        reduce = bucket.reduces[key]
        merge = reduce.accumulator_class.get_reduced_value_from_states
        by_process: dict[Process, list[dict[str, Any]]] = {}
        for process, state in entries:
            by_process.setdefault(process, []).append(state)
        for process, states in by_process.items():
            per_process.setdefault(process, []).extend(
                Metric(n, v, reduce, stamp) for n, v in reduced_items(key, merge(states))
            )
    return dict(sorted(per_process.items(), key=lambda kv: (kv[0].role, kv[0].replica or "", kv[0].rank)))


@dataclass(frozen=True, slots=True)
class Ingested:
    accepted: int
    rejected: int
    errors: tuple[str, ...] = ()


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
    ) -> None:
        self.id = experiment_id
        self.traces = traces if traces is not None else TraceStore()
        self.grace = grace
        self.retain_steps = retain_steps
        self.clock = clock
        self.processes: dict[str, Process] = {}
        self._labels: dict[str, str] = {}
        self._open: dict[int, _Step] = {}
        self._done: OrderedDict[int, _Step] = OrderedDict()
        self.last_finalized = -1
        self.attempt = 0
        self.late_points = 0
        self._abandoned: set[tuple[tuple[str, str | None, int], int]] = set()
        self.streams: list[tuple[Process, Metric, int | None]] = []
        self.last_activity = clock()

    # -- ingest ------------------------------------------------------------------------

    def process_for(self, resource: Mapping[str, Any]) -> Process:
        pid = str(resource.get(attr.SERVICE_INSTANCE_ID) or resource.get(attr.PROCESS_PID) or "?")
        found = self.processes.get(pid)
        if found is None:
            found = self._new_process(pid, resource)
        return found

    def _new_process(self, pid: str, resource: Mapping[str, Any]) -> Process:
        role = str(resource.get(attr.ROLE) or resource.get(attr.SERVICE_NAME) or "unknown")
        replica = resource.get(attr.REPLICA)
        rank = _int(resource.get(attr.RANK), 0)
        label = f"{role}{'' if replica is None else f'_{replica}'}_r{rank}"
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
        )
        self.processes[pid] = process
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

    def ingest(self, resource: Mapping[str, Any], metrics: Iterable[Any]) -> tuple[Ingested, list[StepView]]:
        """Take one ResourceMetrics' metrics; returns counts and late updates to write."""
        now = self.clock()
        self.last_activity = now
        process = self.process_for(resource)
        if not process.live and process.attempt >= self.attempt:
            process.live = True  # it came back
        accepted = rejected = 0
        errors: list[str] = []
        late: dict[int, _Step] = {}
        for metric in metrics:
            name = metric.name
            if name == attr.FLUSH_MARKER:
                for point in metric.sum.data_points:
                    a = attributes_dict(point.attributes)
                    step = a.get(attr.STEP)
                    if isinstance(step, int) and step >= 0:
                        expected = _int(a.get(attr.EXPECTED_PROCESSES), 0)
                        self._marker(process, step, expected, a.get(attr.DRIVEN) is True, now)
                continue
            if name == attr.GOODBYE:
                process.live = False
                continue
            for point in decode_metric(resource, metric):
                try:
                    reduce = Reduce.get(point.reduce)
                except KeyError:
                    rejected += 1
                    errors.append(f"{name}: unknown reduce type {point.reduce!r}")
                    continue
                step = point.step if isinstance(point.step, int) and point.step >= 0 else None
                if step is None:
                    step = min(self._open) if self._open else self.last_finalized + 1
                if step <= self.last_finalized:
                    bucket = self._done.get(step)
                    self.late_points += 1
                    if bucket is None:  # beyond the retained window: written on its own
                        bucket = late.get(step) or _Step(step, now)
                    late[step] = bucket
                else:
                    bucket = self._open.get(step) or self._open.setdefault(step, _Step(step, now))
                known = bucket.reduces.setdefault(point.key, reduce)
                if known is not reduce:
                    rejected += 1
                    errors.append(f"{point.key}: recorded as {known.name} and as {reduce.name}; dropped the latter")
                    continue
                bucket.states.setdefault(point.key, []).append((process, point.state))
                accepted += 1
        views = [self._view(bucket, [], late=True) for bucket in late.values()]
        return Ingested(accepted, rejected, tuple(errors[:8])), views

    def ingest_stream(self, resource: Mapping[str, Any], key: str, value: float, step: int | None) -> None:
        """One streamed raw value (a log record) for ``per_rank_no_reduce`` views."""
        process = self.process_for(resource)
        self.last_activity = self.clock()
        self.streams.append((process, Metric(key, value, Reduce.MEAN, time.time()), step))

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
                    absent.append((f"{role}{'' if replica is None else f'_{replica}'}_r{rank}", (group, rank)))
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
        for key, entries in bucket.states.items():
            reduce = bucket.reduces[key]
            value = reduce.accumulator_class.get_reduced_value_from_states([state for _, state in entries])
            global_metrics.extend(Metric(n, v, reduce, stamp) for n, v in reduced_items(key, value))
        if not late:
            global_metrics.extend(self.traces.stragglers(bucket.step))
            global_metrics.append(Metric(attr.MISSING_PROCESSES, float(len(missing)), Reduce.MAX, stamp))
            if self.late_points:
                global_metrics.append(Metric(attr.LATE_POINTS, float(self.late_points), Reduce.MAX, stamp))
        return StepView(self.id, bucket.step, bucket, global_metrics, missing, late)

    def local_pids(self, host: str) -> set[int]:
        return {p.pid for p in self.processes.values() if p.pid and p.host == host}
