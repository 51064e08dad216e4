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

Events come from files a client's names reached: everything here takes what it knows and
skips the rest (``add`` never raises on a malformed event).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core import names as attr

MAX_POINTS = 1000
MAX_SERIES = 500
MAX_META_SERIES = 200
HEAT_ROWS = 128
HEAT_STEPS = 100
MAX_PHASES = 32
MAX_GANTT_SPANS = 20_000
SAMPLE_STEPS = 8
MAX_TABLES = 16
MAX_ANOMALIES = 250
MAX_LISTED = 500
SNAPSHOT_VERSION = 1
"""The form of a ``snapshot`` event; a file with another (a newer rankscope's) is read without it."""
_TEXT = 500
"""Characters of a sample cell or name kept for the page."""

META_PREFIXES = (attr.META_PREFIX, attr.STRAGGLER_PREFIX)
DERIVED_SUFFIXES = ("/argmax_rank", "/argmin_rank")


def number(value: Any) -> float | None:
    """A finite float, else None (a gap in a chart; the anomalies name non-finite values)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _TEXT else text[: _TEXT - 1] + "…"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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


def gantt_spans(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Span rows (the JSONL form) as compact bars in ms from the earliest start, at most
    ``MAX_GANTT_SPANS`` (the rest counted): ``p`` process, ``r`` rank, ``o`` role, ``n`` name,
    ``s`` start, ``d`` duration, ``i`` span id, ``u`` parent, ``l`` linked span ids, ``c`` caller."""
    kept: list[dict[str, Any]] = []
    more = 0
    for row in rows:
        if len(kept) >= MAX_GANTT_SPANS:
            more += 1
            continue
        start, end = _int(row.get("start_ns")), _int(row.get("end_ns"))
        if start is None or end is None:
            continue
        found = row.get("attributes")
        attributes: dict[str, Any] = found if isinstance(found, dict) else {}
        links = [str(x.get("span_id")) for x in row.get("links") or () if isinstance(x, dict) and x.get("span_id")]
        bar: dict[str, Any] = {
            "p": _text(row.get("process") or f"{row.get('role')}_r{row.get('rank')}"),
            "r": _int(row.get("rank")),
            "o": _text(row.get("role") or ""),
            "n": _text(row.get("name") or "?"),
            "s": start,
            "d": max(0, end - start),
            "i": str(row.get("span_id") or ""),
            "u": str(row.get("parent_span_id") or ""),
        }
        if links:
            bar["l"] = links[:16]
        caller = attributes.get(attr.CALLER)
        if isinstance(caller, str):
            bar["c"] = _text(caller)
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


@dataclass
class Series:
    """One role's key over steps: ``[step, global, median, min, max]`` points, holders apart."""

    points: list[list[Any]] = field(default_factory=list)
    holders: list[list[Any]] = field(default_factory=list)
    """``[min's label, max's label]`` per point."""
    last: list[Any] | None = None
    last_holders: list[Any] | None = None
    seen: int = 0
    stride: int = 1
    """Every ``stride``-th point this series got is kept (its own: a sparse series keeps its points)."""

    def drop_from(self, step: int) -> None:
        """Forget the points of ``step`` and later (a rewind: they come again)."""
        kept = [i for i, point in enumerate(self.points) if point[0] < step]
        self.points = [self.points[i] for i in kept]
        self.holders = [self.holders[i] for i in kept]
        if self.last is not None and self.last[0] >= step:
            self.last = self.points[-1] if self.points else None
            self.last_holders = self.holders[-1] if self.holders else None

    def add(self, point: list[Any], holders: list[Any]) -> None:
        self.last, self.last_holders = point, holders
        if self.seen % self.stride == 0:
            self.points.append(point)
            self.holders.append(holders)
            if len(self.points) > MAX_POINTS:
                self.stride *= 2
                self.points, self.holders = self.points[::2], self.holders[::2]
        self.seen += 1


class Summary:
    """Everything the page shows, bounded (module docstring). ``add`` takes one event."""

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
        self.processes: dict[str, int] = {}
        """Role → how many processes reported the largest step."""
        self.series: dict[tuple[str, str], Series] = {}
        self.globals: dict[str, Series] = {}
        """Keys with no process values (merged upstream, or past the view's spread limit): global only."""
        self.meta: dict[str, Series] = {}
        """``rankscope/*`` and ``straggler/*`` keys: the health and phase sections."""
        self.series_not_shown = 0
        self._refused: set[Any] = set()
        self._labels: dict[str, str] = {}
        self.heat: dict[int, dict[str, Any]] = {}
        self.heat_stride = 1
        self._heat_seen = 0
        self.last_heat: tuple[int, dict[str, Any]] | None = None
        self.gantt: dict[str, dict[str, Any]] = {}
        """Why (``last``, ``slowest``, ``straggler``, ``asked N``) → ``{"step", "ms", "spans", "more"}``."""
        self.samples: dict[str, deque[dict[str, Any]]] = {}
        self.tables_not_shown = 0
        self.anomalies_first: list[dict[str, Any]] = []
        self.anomalies_last: deque[dict[str, Any]] = deque(maxlen=MAX_ANOMALIES)
        self.anomaly_counts: dict[str, int] = {}
        self.missing: deque[dict[str, Any]] = deque(maxlen=MAX_LISTED)
        self.late: dict[int, int] = {}
        self.late_updates = 0
        self.status: dict[str, Any] = {}
        self.skipped_events = 0

    # -- events in

    def add(self, event: Any) -> None:
        """One event (a line of ``report.jsonl``); a malformed one is counted and skipped."""
        handler: Callable[[dict[str, Any]], None] | None = None
        if isinstance(event, dict):
            handler = {
                "experiment": self._experiment,
                "step": self._step,
                "samples": self._samples,
                "anomaly": self._anomaly,
                "gantt": self._gantt,
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
        self.experiment = _text(event["id"])
        self.run = _text(event.get("run") or "")

    def _runs(self, event: dict[str, Any]) -> None:
        listed = []
        for run in event["runs"][:100]:
            href = run.get("href")
            listed.append(
                {
                    "run": _text(run.get("run") or ""),
                    "started": number(run.get("started")),
                    "attempt": _int(run.get("attempt")),
                    "href": _text(href)
                    if isinstance(href, str) and "://" not in href and not href.startswith("/")
                    else None,
                }
            )
        self.runs = listed

    def _rewind(self, event: dict[str, Any]) -> None:
        """The run executes steps again from ``step``: what the page holds of them is dropped."""
        step = _int(event["step"])
        if step is None:
            raise ValueError("step")
        for table in (self.series, self.globals, self.meta):
            for series in table.values():
                series.drop_from(step)
        self.heat = {s: entry for s, entry in self.heat.items() if s < step}
        if self.last_heat is not None and self.last_heat[0] >= step:
            self.last_heat = None
        for table_name, kept in self.samples.items():
            self.samples[table_name] = deque(
                (e for e in kept if e["step"] is None or e["step"] < step), maxlen=SAMPLE_STEPS
            )
        if self.last_step is not None and self.last_step >= step:
            self.rewinds.append({"step": step, "from": self.last_step})
            del self.rewinds[:-MAX_LISTED]
            self.steps = max(0, self.steps - (self.last_step - step + 1))
            self.last_step = step - 1 if self.first_step is not None and step - 1 >= self.first_step else None
            if self.last_step is None:
                self.first_step = None

    def _status(self, event: dict[str, Any]) -> None:
        self.status = _status_fields(event)

    def _step(self, event: dict[str, Any]) -> None:
        step = _int(event["step"])
        if step is None:
            raise ValueError("step")
        values: dict[str, Any] = event.get("values") or {}
        spread: dict[str, dict[str, list[Any]]] = event.get("spread") or {}
        if event.get("late"):
            self.late[step] = self.late.get(step, 0) + 1
            self.late_updates += 1
            if len(self.late) > MAX_LISTED:
                self.late.pop(min(self.late))
            self._late_values(step, values)
            return
        self.steps += 1
        self.first_step = step if self.first_step is None else min(self.first_step, step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        if event.get("missing"):
            names = [_text(m) for m in event["missing"][:16]]
            self.missing.append({"step": step, "count": len(event["missing"]), "processes": names})
        shown = set()
        for role, keys in spread.items():
            self.processes[_text(role)] = max((int(c[5]) for c in keys.values()), default=0)
            for key, cell in keys.items():
                shown.add(key)
                if key in values and not key.startswith(META_PREFIXES):
                    self._point(self.series, (_text(role), _text(key)), step, values.get(key), cell)
        for key, value in values.items():
            if key.endswith(DERIVED_SUFFIXES):
                continue
            if key.startswith(META_PREFIXES):
                self._point(self.meta, key, step, value, None)
            elif key not in shown:
                self._point(self.globals, _text(key), step, value, None)
        if event.get("heat"):
            self._heat(step, event["heat"])

    def _point(self, table: dict[Any, Series], name: Any, step: int, value: Any, cell: list[Any] | None) -> None:
        series = table.get(name)
        if series is None:
            full = (
                len(self.meta) >= MAX_META_SERIES
                if table is self.meta
                else len(self.series) + len(self.globals) >= MAX_SERIES
            )
            if full:
                if len(self._refused) < 100_000 and name not in self._refused:
                    self._refused.add(name)
                    self.series_not_shown += 1
                return
            series = table[name] = Series()
        low, low_by, high, high_by, median = cell[:5] if cell else (None, None, None, None, None)
        point = [step, number(value), number(median), number(low), number(high)]
        series.add(point, [self._label(low_by), self._label(high_by)])

    def _label(self, label: Any) -> str | None:
        """One copy of each process label, however many points name it."""
        if not label:
            return None
        text = _text(label)
        return self._labels.setdefault(text, text) if len(self._labels) < 100_000 else text

    def _late_values(self, step: int, values: dict[str, Any]) -> None:
        """A late update rewrites the step's global values where a point for it is kept."""
        named = [(role_key[1], s) for role_key, s in self.series.items()] + list(self.globals.items())
        for key, series in named:
            if key not in values:
                continue
            for point in (p for p in series.points if p[0] == step):
                point[1] = number(values[key])
            if series.last is not None and series.last[0] == step:
                series.last[1] = number(values[key])

    def _heat(self, step: int, heat: dict[str, Any]) -> None:
        entry = _heat_entry(heat)
        self.last_heat = (step, entry)
        if self._heat_seen % self.heat_stride == 0:
            self.heat[step] = entry
            if len(self.heat) > HEAT_STEPS:
                self.heat_stride *= 2
                self.heat = dict(list(self.heat.items())[::2])
        self._heat_seen += 1

    def _gantt(self, event: dict[str, Any]) -> None:
        why, step = _text(event["why"])[:64], _int(event["step"])
        spans = event["spans"]
        if step is None or not isinstance(spans, list):
            raise ValueError("gantt")
        if why not in self.gantt and len(self.gantt) >= 8:
            return
        bars = [_bar(b) for b in spans[:MAX_GANTT_SPANS] if isinstance(b, dict)]
        more = _int(event.get("more")) or 0
        self.gantt[why] = {"step": step, "ms": number(event.get("ms")), "spans": [b for b in bars if b], "more": more}

    def _samples(self, event: dict[str, Any]) -> None:
        table, step = _text(event["table"])[:128], _int(event.get("step"))
        if table not in self.samples:
            if len(self.samples) >= MAX_TABLES:
                self.tables_not_shown += 1
                return
            self.samples[table] = deque(maxlen=SAMPLE_STEPS)
        rows = [_sample_row(r) for r in event["rows"] if isinstance(r, dict)][:64]
        kept = self.samples[table]
        if kept and kept[-1]["step"] == step:  # a late update of the same step replaces it
            kept.pop()
        kept.append({"step": step, "late": bool(event.get("late")), "rows": rows})

    def _anomaly(self, event: dict[str, Any]) -> None:
        kind = _text(event.get("type", "?"))[:64]
        self.anomaly_counts[kind] = self.anomaly_counts.get(kind, 0) + 1
        clean = _anomaly_record(event)
        if len(self.anomalies_first) < MAX_ANOMALIES:
            self.anomalies_first.append(clean)
        else:
            self.anomalies_last.append(clean)

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
            "processes": self.processes,
            "series": [[role, key, _series_state(s)] for (role, key), s in self.series.items()],
            "globals": [[key, _series_state(s)] for key, s in self.globals.items()],
            "meta": [[key, _series_state(s)] for key, s in self.meta.items()],
            "series_not_shown": self.series_not_shown,
            "refused": [list(name) if isinstance(name, tuple) else name for name in self._refused],
            "heat": [[step, entry] for step, entry in self.heat.items()],
            "heat_stride": self.heat_stride,
            "heat_seen": self._heat_seen,
            "last_heat": list(self.last_heat) if self.last_heat is not None else None,
            "gantt": [{"why": why, **g} for why, g in self.gantt.items()],
            "samples": [{"table": t, "steps": list(kept)} for t, kept in self.samples.items()],
            "tables_not_shown": self.tables_not_shown,
            "anomalies_first": self.anomalies_first,
            "anomalies_last": list(self.anomalies_last),
            "anomaly_counts": self.anomaly_counts,
            "missing": list(self.missing),
            "late": [[step, n] for step, n in self.late.items()],
            "late_updates": self.late_updates,
            "status": self.status,
            "skipped_events": self.skipped_events,
        }

    def _snapshot(self, event: dict[str, Any]) -> None:
        """Become the snapshot's summary: built apart, checked as any event (its shapes, the
        bounds above), then taken whole, so a malformed snapshot changes nothing."""
        if event.get("version") != SNAPSHOT_VERSION:
            raise ValueError("snapshot version")
        new = Summary()
        experiment = event["experiment"]
        new.experiment = None if experiment is None else _text(experiment)
        new.run = _text(event["run"])
        new._runs({"runs": _list(event["runs"], 100)})
        new.rewinds = [{"step": _strict(r["step"]), "from": _strict(r["from"])} for r in _list(event["rewinds"])]
        new.steps = _strict(event["steps"])
        new.first_step, new.last_step = _optional(event["first_step"]), _optional(event["last_step"])
        new.processes = {_str(role): _strict(n) for role, n in _dict(event["processes"]).items()}
        new.series = {
            (_str(role), _str(key)): new._series_of(state) for role, key, state in _list(event["series"], MAX_SERIES)
        }
        room = MAX_SERIES - len(new.series)
        new.globals = {_str(key): new._series_of(state) for key, state in _list(event["globals"], room)}
        new.meta = {_str(key): new._series_of(state) for key, state in _list(event["meta"], MAX_META_SERIES)}
        new.series_not_shown = _strict(event["series_not_shown"])
        new._refused = {
            (_str(n[0]), _str(n[1])) if isinstance(n, list) and len(n) == 2 else _str(n)
            for n in _list(event["refused"], 100_000)
        }
        new.heat = {_strict(step): _heat_entry(entry) for step, entry in _list(event["heat"], HEAT_STEPS)}
        new.heat_stride, new._heat_seen = _strict(event["heat_stride"], 1), _strict(event["heat_seen"])
        if event["last_heat"] is not None:
            step, entry = event["last_heat"]
            new.last_heat = (_strict(step), _heat_entry(entry))
        for gantt in _list(event["gantt"], 8):
            new._gantt(gantt)
        for table in _list(event["samples"], MAX_TABLES):
            new.samples[_text(table["table"])[:128]] = deque(
                (
                    {
                        "step": _optional(e["step"]),
                        "late": bool(e["late"]),
                        "rows": [_sample_row(_dict(r)) for r in _list(e["rows"], 64)],
                    }
                    for e in _list(table["steps"], SAMPLE_STEPS)
                ),
                maxlen=SAMPLE_STEPS,
            )
        new.tables_not_shown = _strict(event["tables_not_shown"])
        new.anomalies_first = [_anomaly_record(r) for r in _list(event["anomalies_first"], MAX_ANOMALIES)]
        new.anomalies_last.extend(_anomaly_record(r) for r in _list(event["anomalies_last"], MAX_ANOMALIES))
        new.anomaly_counts = {_text(kind)[:64]: _strict(n) for kind, n in _dict(event["anomaly_counts"]).items()}
        new.missing.extend(
            {
                "step": _strict(m["step"]),
                "count": _strict(m["count"]),
                "processes": [_text(p) for p in m["processes"][:16]],
            }
            for m in _list(event["missing"])
        )
        new.late = {_strict(step): _strict(n) for step, n in _list(event["late"])}
        new.late_updates = _strict(event["late_updates"])
        new.status = _status_fields(_dict(event["status"]))
        new.skipped_events = _strict(event["skipped_events"])
        vars(self).update(vars(new))

    def _series_of(self, state: Any) -> Series:
        points, holders, last, last_holders, seen, stride = state
        if len(_list(points, MAX_POINTS)) != len(_list(holders, MAX_POINTS)):
            raise ValueError("series")
        return Series(
            [_point(p) for p in points],
            [self._holders(h) for h in holders],
            None if last is None else _point(last),
            None if last_holders is None else self._holders(last_holders),
            _strict(seen),
            _strict(stride, 1),
        )

    def _holders(self, holders: Any) -> list[Any]:
        low, high = holders
        return [self._label(low), self._label(high)]

    # -- the page's data

    def stragglers(self) -> list[dict[str, Any]]:
        """Each (process, phase) named a straggler, with how often and its first and worst step."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for record in self.anomalies():
            if record.get("type") != "straggler":
                continue
            who = (str(record.get("process")), str(record.get("phase")))
            ratio = number(record.get("ratio")) or 0.0
            seen = found.setdefault(who, {"process": who[0], "phase": who[1], "steps": 0, "first": record.get("step")})
            seen["steps"] += 1
            if ratio >= seen.get("ratio", 0.0):
                seen.update(ratio=ratio, worst=record.get("step"), seconds=number(record.get("seconds")))
        return sorted(found.values(), key=lambda s: (-s["steps"], s["process"]))

    def anomalies(self) -> list[dict[str, Any]]:
        return self.anomalies_first + list(self.anomalies_last)

    def data(self) -> dict[str, Any]:
        """The page's data (``report.page`` embeds it as JSON): plain lists and dicts, no NaN."""
        roles: dict[str, list[dict[str, Any]]] = {}
        for (role, key), series in sorted(self.series.items()):
            roles.setdefault(role, []).append(_series_data(key, series))
        return {
            "experiment": self.experiment,
            "run": self.run,
            "runs": self.runs,
            "rewinds": self.rewinds,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "stride": max((s.stride for t in (self.series, self.globals) for s in t.values()), default=1),
            "roles": [
                {"role": role, "processes": self.processes.get(role, 0), "keys": keys}
                for role, keys in sorted(roles.items())
            ],
            "globals": [_series_data(key, s) for key, s in sorted(self.globals.items())],
            "meta": [_series_data(key, s) for key, s in sorted(self.meta.items())],
            "series_not_shown": self.series_not_shown,
            "heat": self._heat_data(),
            "gantt": [{"why": why, **g} for why, g in self.gantt.items()],
            "stragglers": self.stragglers(),
            "anomalies": self.anomalies(),
            "anomaly_counts": self.anomaly_counts,
            "missing": list(self.missing),
            "late": [{"step": s, "updates": n} for s, n in sorted(self.late.items())],
            "late_updates": self.late_updates,
            "samples": [{"table": t, "steps": list(kept)} for t, kept in self.samples.items()],
            "tables_not_shown": self.tables_not_shown,
            "status": self.status,
            "skipped_events": self.skipped_events,
        }

    def _heat_data(self) -> list[dict[str, Any]]:
        heat = dict(self.heat)
        if self.last_heat is not None:
            heat[self.last_heat[0]] = self.last_heat[1]
        return [{"step": step, **entry} for step, entry in sorted(heat.items())]


def _series_state(series: Series) -> list[Any]:
    return [series.points, series.holders, series.last, series.last_holders, series.seen, series.stride]


def _point(point: Any) -> list[Any]:
    """A series point from a snapshot: ``[step, global, median, min, max]``."""
    step, value, median, low, high = point
    return [_strict(step), number(value), number(median), number(low), number(high)]


def _strict(value: Any, least: int | None = None) -> int:
    """An int of a snapshot (at least ``least``; anything else: the snapshot is malformed)."""
    found = _int(value)
    if found is None or (least is not None and found < least):
        raise ValueError("int")
    return found


def _optional(value: Any) -> int | None:
    return None if value is None else _strict(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("str")
    return value


def _list(value: Any, most: int = MAX_LISTED) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        raise ValueError("list")
    return value


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("dict")
    return value


def _heat_entry(heat: dict[str, Any]) -> dict[str, Any]:
    rows = [_text(r) for r in heat["rows"]][: HEAT_ROWS + 1]
    phases = [_text(p) for p in heat["phases"]][:MAX_PHASES]
    z = [[number(v) for v in line[: len(phases)]] for line in heat["z"][: len(rows)]]
    return {"rows": rows, "phases": phases, "z": z, "band": _int(heat.get("band")) or 1}


def _status_fields(event: dict[str, Any]) -> dict[str, Any]:
    fields = list(event.items())[:64]
    return {str(k)[:64]: _cell(v) for k, v in fields if k != "kind" and isinstance(v, (int, float, str))}


def _anomaly_record(event: dict[str, Any]) -> dict[str, Any]:
    return {str(k)[:64]: _cell(v) for k, v in list(event.items())[:32] if k != "kind"}


def _series_data(key: str, series: Series) -> dict[str, Any]:
    points, holders = list(series.points), list(series.holders)
    if series.last is not None and (not points or points[-1][0] != series.last[0]):
        points.append(series.last)
        holders.append(series.last_holders or [None, None])
    return {"key": key, "points": points, "holders": holders}


def _bar(bar: dict[str, Any]) -> dict[str, Any] | None:
    """A Gantt bar from the file, as ``gantt_spans`` made it (anything else: None)."""
    start, duration = number(bar.get("s")), number(bar.get("d"))
    if start is None or duration is None:
        return None
    out: dict[str, Any] = {k: _text(bar.get(k) or "") for k in ("p", "o", "n", "i", "u")}
    out.update(r=_int(bar.get("r")), s=start, d=duration)
    if isinstance(bar.get("l"), list):
        out["l"] = [_text(x) for x in bar["l"][:16]]
    if isinstance(bar.get("c"), str):
        out["c"] = _text(bar["c"])
    return out


def _sample_row(entry: dict[str, Any]) -> dict[str, Any]:
    found = entry.get("row")
    row: dict[str, Any] = found if isinstance(found, dict) else {}
    cells = {str(k)[:64]: _cell(v) for k, v in list(row.items())[:32]}
    who = {k: _cell(entry.get(k)) for k in ("side", "process", "policy_version", "trace_id")}
    return {"row": cells, **who}


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else str(value)
    return _text(value)


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
