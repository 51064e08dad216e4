"""An experiment's report as data: what the ``report`` view saw, bounded, one JSON line per event.

The report view (``backends.report``) turns each step into *events* (``step_event`` and the
others below), appends them to ``report.jsonl`` and adds them to a ``Summary``;
``rankscope report FILE`` rebuilds the same ``Summary`` from that file (``read``), so a report
made after a crash shows what the live one would have. The view compacts the file now and then
to one ``snapshot`` event (``Summary.snapshot``: the whole summary, which ``add`` restores
exactly) plus the events since, so the file and the time to read it stay O(summary).

What keeps a 1,000-rank, 100,000-step experiment a page a browser opens:

* spread, not values: per role and key, each step keeps the global value, the min and max
  with the process holding each, and the median across that role's processes;
* at most ``MAX_SERIES`` series (and ``MAX_META_SERIES`` of ``rankscope/*``, ``straggler/*``) of
  at most ``MAX_POINTS`` points: past that, the series' stride doubles (every other point it
  kept is dropped, later points are kept at the new stride); its last point is always shown;
* at most ``HEAT_ROWS`` heat-map rows per step: more processes are binned into bands of
  consecutive ranks, each band showing its slowest;
* the Gantt of a few chosen steps only (the first straggler step, the slowest, the last), at
  most ``MAX_GANTT_SPANS`` spans each; more processes are paged in the page (64 at a time);
* the last ``SAMPLE_STEPS`` steps of each sample table, the first and last anomalies.

``Summary`` routes each event to its parts, one per thing the page summarizes, each bounded
as above: ``series.MetricSeries`` (the metric charts), ``phases.Phases`` (heat maps, Gantts),
``health.Health`` (anomalies, missing processes, late updates), ``samples.Samples``; it keeps
what the page says of the run as a whole (its steps, rewinds, runs, the sink's status, when it
started, and its configuration: what its processes' Resources said, ``config_of``, carried by
the step that brought them).

Events come from files a client's names reached: everything here takes what it knows and
skips the rest (``add`` never raises on a malformed event).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core import names as attr
from .health import Health
from .phases import HEAT_ROWS, MAX_GANTT_SPANS, MAX_PHASES, Phases
from .samples import Samples
from .series import MetricSeries
from .values import MAX_LISTED, cell, integer, listed, mapping, number, optional, relative_link, strict, text

SNAPSHOT_VERSION = 1
"""The form of a ``snapshot`` event; a file with another (a newer rankscope's) is read without it."""
MAX_CONFIG_ROLES = 32
MAX_CONFIG_KEYS = 64
"""A run's configuration (the steps' ``config``): roles, and Resource attributes per role, kept."""
PER_PROCESS = frozenset(
    {
        *(attr.EXPERIMENT_ID, attr.RUN_ID, attr.RUN_RESUME, attr.EXPERIMENT_ATTEMPT, attr.ROLE, attr.REPLICA),
        *(attr.RANK, attr.LOCAL_RANK, attr.SERVICE_NAME, attr.SERVICE_INSTANCE_ID, attr.HOST_NAME),
        *(attr.PROCESS_PID, attr.PROCESS_PARENT_PID, attr.MERGED, attr.MERGE_WINDOW),
    }
)
"""Resource attributes that say who a process is, not how the run was configured."""


# -- events: what the view writes, computed from the sink's step -----------------------------


def spread_of(per_process: Mapping[Any, Iterable[Any]]) -> dict[str, dict[str, list[Any]]]:
    """Role → key → ``[min, min's label, max, max's label, median, processes]`` over each
    process's value of the step (finite values only, the first process on a tie; ``processes``
    counts them all). One pass to group, then numpy per key: ~40 ms for 1,024 × 200."""
    by_role: dict[str, dict[str, tuple[list[float], list[str]]]] = {}
    for process, metrics in per_process.items():
        keys = by_role.setdefault(str(process.role), {})
        label = process.label
        for metric in metrics:
            found = keys.get(metric.key)
            if found is None:
                found = keys[metric.key] = ([], [])
            found[0].append(metric.value)
            found[1].append(label)
    out: dict[str, dict[str, list[Any]]] = {}
    for role, keys in by_role.items():
        role_out = out[role] = {}
        for key, (values, labels) in keys.items():
            array = np.fromiter(values, float, len(values))
            finite = np.isfinite(array)
            index = np.arange(len(values)) if finite.all() else np.flatnonzero(finite)
            if not len(index):
                role_out[key] = [None, None, None, None, None, len(values)]
                continue
            kept = array[index]
            low, high = int(index[kept.argmin()]), int(index[kept.argmax()])
            with np.errstate(all="ignore"):  # the middle of two values near the float max is inf, quietly
                median = float(np.median(kept))
            role_out[key] = [float(array[low]), labels[low], float(array[high]), labels[high], median, len(values)]
    return out


def heat_of(phase_times: Mapping[str, Mapping[Any, float]]) -> dict[str, Any] | None:
    """Seconds per phase per process, as ``{"rows", "phases", "z"}``: rows are process labels
    in (role, replica, rank) order, or bands of consecutive ranks when there are more than
    ``HEAT_ROWS`` (each band's slowest); the ``MAX_PHASES`` phases with the most time."""
    if not phase_times:
        return None
    total = {phase: sum(by.values()) for phase, by in phase_times.items()}
    phases = sorted(total, key=lambda p: -total[p])[:MAX_PHASES]
    phases.sort()
    processes = sorted(
        {p for by in phase_times.values() for p in by}, key=lambda p: (p.role, str(p.replica or ""), p.rank)
    )
    if not processes:
        return None
    size = -(-len(processes) // HEAT_ROWS)
    rows: list[str] = []
    z: list[list[float | None]] = []
    for start in range(0, len(processes), size):
        band = processes[start : start + size]
        rows.append(band[0].label if len(band) == 1 else f"{band[0].label}…r{band[-1].rank}")
        line: list[float | None] = []
        for phase in phases:
            by = phase_times[phase]
            seconds = [by[p] for p in band if p in by]
            line.append(round(max(seconds), 6) if seconds else None)
        z.append(line)
    return {"rows": rows, "phases": phases, "z": z, "band": size}


def config_of(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, dict[str, str | None]]:
    """Role → the Resource attributes that configure it (not ``PER_PROCESS``, nor a mesh
    coordinate), over ``(role, attributes)`` of new processes: a step event's ``config``.
    None: its processes disagree."""
    out: dict[str, dict[str, str | None]] = {}
    for role, attributes in resources:
        found = out.setdefault(str(role), {})
        for key, value in attributes.items():
            if key in PER_PROCESS or (key.startswith(attr.MESH_PREFIX) and key.endswith(".rank")):
                continue
            seen = found.setdefault(key, str(value))
            if seen is not None and seen != str(value):
                found[key] = None
    return out


def gantt_spans(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Span rows (the JSONL form) as compact bars in ms from the earliest start, at most
    ``MAX_GANTT_SPANS`` (the rest counted): ``p`` process, ``r`` rank, ``o`` role, ``n`` name,
    ``s`` start, ``d`` duration, ``i`` span id, ``u`` parent, ``l`` linked span ids, ``c`` caller;
    on a collective the sink matched, ``w`` the ms this rank waited for the last one and ``a``
    (true) on the rank that arrived last."""
    kept: list[dict[str, Any]] = []
    more = 0
    for row in rows:
        if len(kept) >= MAX_GANTT_SPANS:
            more += 1
            continue
        start, end = integer(row.get("start_ns")), integer(row.get("end_ns"))
        if start is None or end is None:
            continue
        found = row.get("attributes")
        attributes: dict[str, Any] = found if isinstance(found, dict) else {}
        links = [str(x.get("span_id")) for x in row.get("links") or () if isinstance(x, dict) and x.get("span_id")]
        bar: dict[str, Any] = {
            "p": text(row.get("process") or f"{row.get('role')}_r{row.get('rank')}"),
            "r": integer(row.get("rank")),
            "o": text(row.get("role") or ""),
            "n": text(row.get("name") or "?"),
            "s": start,
            "d": max(0, end - start),
            "i": str(row.get("span_id") or ""),
            "u": str(row.get("parent_span_id") or ""),
        }
        if links:
            bar["l"] = links[:16]
        caller = attributes.get(attr.CALLER)
        if isinstance(caller, str):
            bar["c"] = text(caller)
        waited = number(attributes.get(attr.COMM_WAIT))
        if waited is not None:
            bar["w"] = round(waited * 1e3, 3)
        if attributes.get(attr.COMM_LAST) is True:
            bar["a"] = True
        kept.append(bar)
    if kept:
        zero = min(b["s"] for b in kept)
        for bar in kept:
            bar["s"] = round((bar["s"] - zero) / 1e6, 3)
            bar["d"] = round(bar["d"] / 1e6, 3)
    return kept, more


def span_seconds(spans: list[dict[str, Any]]) -> float:
    """Wall-clock ms of a step's bars, first start to last end."""
    return max((b["s"] + b["d"] for b in spans), default=0.0)


# -- the summary ------------------------------------------------------------------------------


class Summary:
    """Everything the page shows, bounded (module docstring): the run as a whole here, the rest
    in the parts, so each bound and each section's state sit with the code that keeps them.
    ``add`` takes one event."""

    def __init__(self) -> None:
        self.experiment: str | None = None
        self.run = ""
        self.runs: list[dict[str, Any]] = []
        """The experiment's runs (the sink's status), each with a link to its page where known."""
        self.rewinds: list[dict[str, Any]] = []
        """Each rewind (the run executed steps again from ``step``): its steps' earlier values are gone."""
        self.steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.status: dict[str, Any] = {}
        """The sink's counts for the experiment (points, refused, late, spans...), as last reported."""
        self.skipped_events = 0
        self.started: float | None = None
        """When the run's first step was finalized: its ranks' first data (``started_at``)."""
        self.config: dict[str, dict[str, str | None]] = {}
        """Role → Resource attribute → its value (None: the role's processes disagree)."""
        self.series = MetricSeries()
        self.phases = Phases()
        self.health = Health()
        self.samples = Samples()

    # -- events in

    def add(self, event: Any) -> None:
        """One event (a line of ``report.jsonl``); a malformed one is counted and skipped."""
        handler: Callable[[dict[str, Any]], None] | None = None
        if isinstance(event, dict):
            handler = {
                "experiment": self._experiment,
                "step": self._step,
                "samples": self.samples.add,
                "anomaly": self.health.anomaly,
                "gantt": self.phases.add_gantt,
                "status": self._status,
                "rewind": self._rewind,
                "runs": self._runs,
                "snapshot": self._snapshot,
            }.get(str(event.get("kind")))
        if handler is None:
            self.skipped_events += 1
            return
        try:
            handler(event)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError):
            self.skipped_events += 1

    def _experiment(self, event: dict[str, Any]) -> None:
        self.experiment = text(event["id"])
        self.run = text(event.get("run") or "")

    def _config(self, roles: Any) -> None:
        """Attributes of new processes per role (``config_of``, a step event's ``config``): a
        value another process of the role disagrees with becomes None. What is not a mapping is
        skipped (the step is taken all the same)."""
        for raw_role, attributes in roles.items() if isinstance(roles, dict) else ():
            role = text(raw_role)[:64]
            if not isinstance(attributes, dict) or (role not in self.config and len(self.config) >= MAX_CONFIG_ROLES):
                continue
            known = self.config.setdefault(role, {})
            for raw_key, raw_value in attributes.items():
                key, value = text(raw_key)[:128], None if raw_value is None else text(raw_value)[:200]
                if key not in known:
                    if len(known) < MAX_CONFIG_KEYS:
                        known[key] = value
                elif known[key] != value:
                    known[key] = None

    def started_at(self) -> float | None:
        """When the run started, as its page and the comparison of runs say: its first step's data
        (when the sink finalized it), else, before any step, the sink's record of the run (``runs``).

        Not the sink's record first: that is when the sink first heard of the run from whichever
        process carrying its run id reported first, a rank or not (a launcher's, a helper's), so it
        can be long before the ranks began; nor the time in a ``torchrun --standalone`` run id,
        which is its agent's start (``core.identity``): the whole launch command's, setup steps
        such as a ``pip install`` before ``python train.py`` included. The first step is the
        ranks' own: their data of the run's first step, never earlier than the training."""
        if self.started is not None:
            return self.started
        return next((r["started"] for r in self.runs if r["run"] == self.run and r["started"] is not None), None)

    def _runs(self, event: dict[str, Any]) -> None:
        runs = []
        for run in event["runs"][:100]:
            href = run.get("href")
            runs.append(
                {
                    "run": text(run.get("run") or ""),
                    "started": number(run.get("started")),
                    "attempt": integer(run.get("attempt")),
                    "href": relative_link(href),
                }
            )
        self.runs = runs

    def _rewind(self, event: dict[str, Any]) -> None:
        """The run executes steps again from ``step``: what the page holds of them is dropped."""
        step = integer(event["step"])
        if step is None:
            raise ValueError("step")
        self.series.drop_from(step)
        self.phases.drop_from(step)
        self.samples.drop_from(step)
        if self.last_step is not None and self.last_step >= step:
            self.rewinds.append({"step": step, "from": self.last_step})
            del self.rewinds[:-MAX_LISTED]
            self.steps = max(0, self.steps - (self.last_step - step + 1))
            self.last_step = step - 1 if self.first_step is not None and step - 1 >= self.first_step else None
            if self.last_step is None:
                self.first_step = None

    def _status(self, event: dict[str, Any]) -> None:
        self.status = _status_fields(event)
        self.health.streaks(event.get("straggler_streaks") or event.get("anomalies"))  # as they went on

    def _step(self, event: dict[str, Any]) -> None:
        step = integer(event["step"])
        if step is None:
            raise ValueError("step")
        values: dict[str, Any] = event.get("values") or {}
        spread: dict[str, dict[str, list[Any]]] = event.get("spread") or {}
        if event.get("late"):
            self.health.late_update(step)
            self.series.late(step, values)
            return
        self.steps += 1
        if event.get("config"):
            self._config(event["config"])
        found = number(event.get("time"))
        if found is not None and (self.started is None or found < self.started):
            self.started = found
        self.first_step = step if self.first_step is None else min(self.first_step, step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        if event.get("missing"):
            self.health.missed(step, event["missing"])
        self.series.step(step, values, spread)
        if event.get("heat"):
            self.phases.add_heat(step, event["heat"])

    # -- the whole summary as one event (a compacted ``report.jsonl`` starts with it)

    def snapshot(self) -> dict[str, Any]:
        """The summary as one ``snapshot`` event: plain JSON (it shares the summary's lists: write
        it before adding more) that ``add`` restores exactly, in place of what it held, so that
        the events after it make the summary the events before it and after it would have."""
        return {
            "kind": "snapshot",
            "version": SNAPSHOT_VERSION,
            "experiment": self.experiment,
            "run": self.run,
            "runs": self.runs,
            "rewinds": self.rewinds,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            **self.series.state(),
            **self.phases.state(),
            **self.samples.state(),
            **self.health.state(),
            "status": self.status,
            "skipped_events": self.skipped_events,
            "started": self.started,
            "config": self.config,
        }

    def _snapshot(self, event: dict[str, Any]) -> None:
        """Become the snapshot's summary: built apart, checked as any event (its shapes, the
        bounds above), then taken whole, so a malformed snapshot changes nothing."""
        if event.get("version") != SNAPSHOT_VERSION:
            raise ValueError("snapshot version")
        new = Summary()
        experiment = event["experiment"]
        new.experiment = None if experiment is None else text(experiment)
        new.run = text(event["run"])
        new._runs({"runs": listed(event["runs"], 100)})
        new.rewinds = [{"step": strict(r["step"]), "from": strict(r["from"])} for r in listed(event["rewinds"])]
        new.steps = strict(event["steps"])
        new.first_step, new.last_step = optional(event["first_step"]), optional(event["last_step"])
        new.series = MetricSeries.restore(event)
        new.phases = Phases.restore(event)
        new.samples = Samples.restore(event)
        new.health = Health.restore(event)
        new.status = _status_fields(mapping(event["status"]))
        new.skipped_events = strict(event["skipped_events"])
        new.started = number(event.get("started"))  # absent from an earlier rankscope's snapshot
        new._config(listed_config(event.get("config") or {}))
        vars(self).update(vars(new))

    # -- the page's data

    def data(self) -> dict[str, Any]:
        """The page's data (``report.page`` embeds it as JSON): plain lists and dicts, no NaN."""
        return {
            "experiment": self.experiment,
            "run": self.run,
            "runs": self.runs,
            "rewinds": self.rewinds,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            **self.series.data(),
            **self.phases.data(),
            **self.health.data(),
            **self.samples.data(),
            "status": self.status,
            "skipped_events": self.skipped_events,
            "started": self.started_at(),
            "config": self.config,
        }


def listed_config(found: Any) -> dict[str, Any]:
    """A snapshot's ``config``, checked: role → attribute → str or None."""
    roles = mapping(found)
    if len(roles) > MAX_CONFIG_ROLES or any(len(mapping(a)) > MAX_CONFIG_KEYS for a in roles.values()):
        raise ValueError("config")
    for attributes in roles.values():
        if any(v is not None and not isinstance(v, str) for v in attributes.values()):
            raise ValueError("config")
    return roles


def _status_fields(event: dict[str, Any]) -> dict[str, Any]:
    fields = list(event.items())[:64]
    return {str(k)[:64]: cell(v) for k, v in fields if k != "kind" and isinstance(v, (int, float, str))}


def read(path: Path) -> Summary:
    """The summary of a ``report.jsonl``, compacted or not (bad lines, a line cut by a crash:
    skipped and counted)."""
    summary = Summary()
    for event in _events(path):
        summary.add(event)
    return summary


def _events(path: Path) -> Iterator[Any]:
    with path.open("rb") as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                yield None
