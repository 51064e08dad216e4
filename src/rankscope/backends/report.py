"""The report view: one self-contained HTML page per run of an experiment (``rankscope.report``).

Config: ``path`` (default ``rankscope_logs/{experiment}/{run}/report.html``, or
``rankscope_logs/{experiment}/report.html`` for data without a run id; the names put into
it become safe components, as for JSONL) and ``max_spread_processes`` (default 4,096: past
it a step's spread is not computed, the page shows the global value only). Mode
``global_reduce`` (the default here): at a sink it gets every process's values of each step
(the spread), the step's phase times (the heat map) and spans (the Gantt of chosen steps).

Each step becomes events appended to ``report.jsonl`` beside the page (``report.summary``),
so ``rankscope report`` can rebuild the page from the file. The file stays O(summary) however
long the run: once the events appended since it was last compacted pass ``max(compact_bytes,
2 × its snapshot)`` (option ``compact_bytes``, default 4 MiB), it is rewritten as one snapshot
of the summary (``Summary.snapshot``, bounded as the page is) into a temporary file beside it,
synced, and renamed over it. So it stays under about 3 × the snapshot + ``compact_bytes``,
reopening it reads no more, and a crash leaves the old file or the new one whole (but for a
last appended line cut short, which reading skips). A reopened view compacts it first.

The page is written when the sink is asked for it (``rankscope report --sink``,
``rs.write_report()``, ``rankscope run --report``) and when the view finishes. The page lists
the experiment's other runs (linked when they follow the same path template), those its sink
knows and those found on disk beside its run's directory when the page is written
(``report.page.siblings``: a launch that had its own sink), and, after a rewind (a restarted
or resumed run executing steps again), shows each step's final values. The run's
configuration, for ``rankscope report`` over the experiment's runs, is what its processes'
Resources say (a step's ``config``, in the steps that brought new processes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from ..core.anomalies import Anomaly, Straggler
from ..report import page
from ..report.summary import Summary, config_of, gantt_spans, heat_of, read, span_seconds, spread_of
from .base import LoggerBackend, LoggingMode, Metric
from .jsonl import _component

COMPACT_BYTES = 4 << 20
"""Bytes appended to ``report.jsonl`` since it was last compacted before it may be again."""

MAX_PROCESSES_SEEN = 100_000
"""Processes whose configuration was taken (each once); past that, new ones are not looked at."""

_STATUS_FIELDS = (
    *("points", "late_points", "refused_points", "foreign_points", "series_overflow", "log_records"),
    *("sample_rows", "spans_stored", "spans_dropped", "internal_errors", "processes", "last_finalized_step"),
    "straggler_streaks",
)


class ReportBackend(LoggerBackend):
    run_bytes = 5 << 20
    """A page inlines plotly.js (4.8 MB), so that it opens offline."""

    def __init__(self, logger_backend_config: dict[str, Any] | None = None) -> None:
        config = {"logging_mode": LoggingMode.GLOBAL_REDUCE.value, **(logger_backend_config or {})}
        super().__init__(config)
        self.max_spread_processes = int(self.logger_backend_config.get("max_spread_processes", 4096))
        self.compact_bytes = int(self.logger_backend_config.get("compact_bytes", COMPACT_BYTES))
        self._appended = 0
        """Bytes appended since the file was last compacted (or opened)."""
        self._snapshot_bytes = 0
        self.summary = Summary()
        self._dirty = False
        self._slowest_ms = -1.0
        self._last_gantt: dict[str, Any] | None = None
        self._slowest_gantt: dict[str, Any] | None = None
        self._straggler_step: int | None = None
        self._straggler_kept = False
        self._processes_seen: set[Any] = set()

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        experiment = str(kwargs.get("experiment") or process_name or "experiment")
        run = str(kwargs.get("run") or "")
        default = "rankscope_logs/{experiment}/{run}/report.html" if run else "rankscope_logs/{experiment}/report.html"
        self._template = str(self.logger_backend_config.get("path", default))
        self._fields = {
            "experiment": _component(experiment),
            "process": _component(str(process_name)),
            "pid": os.getpid(),
        }
        self.path = self._path_of(run)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data_path = self.path.with_suffix(".jsonl")
        self.location = str(self.path.resolve())
        if self.data_path.exists():  # reopened (an idle experiment, a restarted sink): the page keeps its history
            self.summary = read(self.data_path)
            self._rewrite()  # O(summary) from now on; drops a line a crash cut (the next would be appended to it)
        self._file: IO[str] = self.data_path.open("a", encoding="utf-8")
        self._event({"kind": "experiment", "id": experiment, "run": run})

    def _path_of(self, run: str) -> Path:
        return Path(self._template.format(run=_component(run or "run"), **self._fields))

    def rewind(self, step: int) -> None:
        self._event({"kind": "rewind", "step": step})

    def _event(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, default=str)  # ASCII: its length is its size in bytes
        self._file.write(line + "\n")
        self.summary.add(json.loads(line))  # exactly what ``rankscope report`` reads back from the file
        self._dirty = True
        self._appended += len(line) + 1
        if self._appended > max(self.compact_bytes, 2 * self._snapshot_bytes):
            self._file.close()  # before the file is renamed over; reopened whatever happens
            try:
                self._rewrite()
            finally:
                self._file = self.data_path.open("a", encoding="utf-8")

    def _rewrite(self) -> None:
        """Rewrite the data file as one snapshot of the summary (module docstring): the old file
        or the new one, whole, whenever a crash comes."""
        self._appended = 0  # a failure (a full disk) is tried again after as many bytes more
        line = json.dumps(self.summary.snapshot(), separators=(",", ":"), default=str)
        tmp = self.data_path.with_name(f".{self.data_path.name}.tmp")  # one name: a crash leaves at most one
        try:
            with tmp.open("w", encoding="utf-8") as out:
                out.write(line + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.data_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.data_path.parent)
        self._snapshot_bytes = len(line) + 1

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if global_step is None:
            return
        late = bool(kwargs.get("late"))
        per_process: Mapping[Any, list[Metric]] = kwargs.get("per_process") or {}
        event: dict[str, Any] = {"kind": "step", "step": global_step, "values": {m.key: m.value for m in metrics}}
        if late:
            event["late"] = True
        else:
            if self.summary.first_step is None:  # the run's first step: when it started
                stamp = next((m.timestamp for m in metrics if m.timestamp is not None), None)
                if stamp is not None:
                    event["time"] = stamp
            if per_process and len(per_process) <= self.max_spread_processes:  # else the per-process values stay unmade
                event["spread"] = spread_of(per_process)
                roles = self._config(per_process)
                if roles:
                    event["config"] = roles
        if kwargs.get("missing") and not late:
            event["missing"] = list(kwargs["missing"])
        heat = heat_of(kwargs.get("phase_times") or {}) if not late else None
        if heat:
            event["heat"] = heat
        self._event(event)
        spans: Callable[[], list[dict[str, Any]]] | None = kwargs.get("spans")
        if spans is not None and not late:
            self._gantt(global_step, spans())
        self._file.flush()

    def _config(self, per_process: Mapping[Any, Any]) -> dict[str, Any]:
        """What the Resources of the processes new in this step configure (the step event's ``config``)."""
        if not per_process or len(self._processes_seen) >= MAX_PROCESSES_SEEN:
            return {}
        new = [p for p in per_process if getattr(p, "id", p) not in self._processes_seen]
        self._processes_seen.update(getattr(p, "id", p) for p in new)
        return config_of((str(p.role), p.resource) for p in new if isinstance(getattr(p, "resource", None), Mapping))

    def _gantt(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Keep the last and the slowest step's bars in memory (written with the page); write the
        first straggler step's now (once)."""
        if not rows:
            return
        bars, more = gantt_spans(rows)
        ms = span_seconds(bars)
        chosen = {"kind": "gantt", "step": step, "ms": ms, "spans": bars, "more": more}
        self._last_gantt = {**chosen, "why": "last step"}
        if self._slowest_ms < 0:  # the first step warms up (imports, allocations): not news
            self._slowest_ms = 0.0
        elif ms > self._slowest_ms:
            self._slowest_ms = ms
            self._slowest_gantt = {**chosen, "why": "slowest step"}
        if self._straggler_step == step and not self._straggler_kept:
            self._straggler_kept = True
            self._event({**chosen, "why": "first straggler"})

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> None:
        self._event({"kind": "samples", "table": table, "step": global_step, "rows": rows, "late": kwargs.get("late")})

    def log_anomaly(self, record: Anomaly, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if isinstance(record, Straggler) and self._straggler_step is None:
            self._straggler_step = global_step
        self._event({**record.to_json(), "kind": "anomaly"})

    def report(self, status: dict[str, Any] | None = None) -> str:
        """Write the page now (with the sink's ``status`` of the experiment) and return its path."""
        if status:
            self._event({"kind": "status", **{k: status[k] for k in _STATUS_FIELDS if k in status}})
            if status.get("runs"):
                self._event({"kind": "runs", "runs": [self._listed(r) for r in status["runs"][:100]]})
        for chosen in (self._slowest_gantt, self._last_gantt):
            if chosen is not None:
                self._event(chosen)
        self._slowest_gantt = self._last_gantt = None
        self._file.flush()
        page.write(self.summary, self.path)
        self._dirty = False
        return self.location or str(self.path)

    def _listed(self, run: Mapping[str, Any]) -> dict[str, Any]:
        """A run of the experiment as the page lists it, with the relative link to its page."""
        other = self._path_of(str(run.get("run") or ""))
        href = os.path.relpath(other, self.path.parent) if other != self.path else None
        return {"run": run.get("run"), "started": run.get("started"), "attempt": run.get("attempt"), "href": href}

    def finish(self) -> None:
        if self._dirty:
            self.report()
        self._file.close()


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (where directories can be synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
