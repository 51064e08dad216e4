"""W&B backend: one W&B run per rankscope run, every role and process in it; the runs of an
experiment are one W&B group.

The W&B run id is derived from the experiment and run ids, and the run is opened with
``resume="allow"``, so a restarted sink continues the same run instead of starting a new
one. Its name is the experiment plus a short run suffix (``grpo-qwen · 3f2a9c1d``). A rewound
run (a restart or resume that executes steps again) cannot drop the rows W&B already holds
(offline, or without W&B's run forking): the steps are logged again, the first of them with
``rankscope/rewound_to``, and a warning says so; plot against ``step`` and the later row of a
step is the one to read. A late update (a step's exact total once a late node's data came) cannot
rewrite its step either: its values go under ``late/`` at that step (``late/loss``), with
``rankscope/late_update``; the run summary counts the late updates (``rankscope/corrections``).
Values are plotted against a ``step`` metric declared with ``define_metric``, not W&B's internal
``_step``: steps of different roles share one axis, and a late update of an earlier step is a valid
log call (W&B's own step only ever increases).

Config keys: ``project`` (``WANDB_PROJECT``), ``entity`` (``WANDB_ENTITY``), ``group``
(``WANDB_RUN_GROUP``), ``mode`` (``WANDB_MODE``: online/offline/disabled), ``dir``,
``name`` (default: the experiment id), and which per-process series a global view adds under
``role/replica/rRANK/key``: ``per_rank_series`` (``"auto"`` by default: every key's series while a
step has at most ``per_rank_max_processes`` processes, 64 by default, and beyond that only the keys
matching ``per_rank_keys``, a list of ``fnmatch`` patterns; ``true``: always every key; ``false``:
none). At 1,000 ranks × 200 keys every series would be 200,000 series in one run.

Ordinary OTel log records of the experiment go to a ``logs`` Table (step, time, severity,
process, body, trace id), logged with the next step's values: at most ``max_log_rows`` rows
(default 1,000) per table, the rest counted in its ``rankscope/log_rows_dropped`` value.

Sample tables (``record_sample``) are W&B Tables named after the table, one per step: the
provenance columns (step, side, role, replica, rank, process, policy version, trace and span
id, time), then the row's fields.

A ``wandb.init`` that fails (no API key and not offline, say) turns the backend off with one
error naming the fix, instead of an error at every step: the job and the other views go on.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import re
from pathlib import Path
from typing import Any

from ..core import names as attr
from ..core.anomalies import Anomaly, Capture, Located
from .base import PROVENANCE_COLUMNS, LoggerBackend, LoggingMode, Metric, short_run

STEP_METRIC = "step"
LATE_PREFIX = "late/"
"""A late update's keys (``late/loss`` at its step): W&B cannot rewrite a step it has, so the
step's exact total is logged beside the on-time value, plotted against ``step`` like it."""
_LOG_COLUMNS: list[str | int] = ["step", "time", "severity", "process", "body", "trace_id"]
_ANOMALY_COLUMNS: list[str | int] = ["step", "type", "process", "what"]


def run_id_for(experiment: str, run: str = "") -> str:
    """A W&B run id that is stable for an experiment id (and run id) and valid whatever they hold.

    W&B names the run's directory after it, so it is a safe path component too: at most 57
    characters of ``[A-Za-z0-9_-]`` ending in a hash of the whole id. It keeps this formula
    rather than ``safe_component``: a sink upgraded mid-experiment must resume the same run.
    """
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", experiment).strip("-")[:48]
    whole = experiment if not run else f"{experiment}\x00{run}"
    return f"{readable}-{hashlib.sha1(whole.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def series_prefix(process: Any) -> str:
    """``trainer/r0`` or ``generator/1/r0``: one series per process in the experiment's run."""
    replica = getattr(process, "replica", None)
    middle = "" if replica is None else f"/{replica}"
    return f"{process.role}{middle}/r{process.rank}"


class WandbBackend(LoggerBackend):
    run: Any = None
    """The W&B run; None when ``init`` failed (the backend is then off: every call is a no-op)."""
    descriptors = 4
    """A run's files and its connection to W&B's service process (an estimate: the sink's budget)."""

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover - wandb is a dependency
            raise ImportError("the wandb backend needs wandb: pip install wandb") from exc
        c = self.logger_backend_config
        experiment = str(kwargs.get("experiment") or c.get("name") or "rankscope")
        run_name = str(kwargs.get("run") or "")
        self._rewound_warned = False
        self._rewound_to: int | None = None
        self._corrections = 0
        mode = c.get("per_rank_series", "auto")
        if mode not in (True, False, "auto"):
            raise ValueError(f'wandb backend: per_rank_series must be true, false or "auto", got {mode!r}')
        self.per_rank_series: bool | str = mode
        self.per_rank_max_processes = int(c.get("per_rank_max_processes", 64))
        self.per_rank_keys = [str(p) for p in c.get("per_rank_keys", [])]
        self._capped_warned = False
        self.max_log_rows = int(c.get("max_log_rows", 1000))
        self._log_rows: list[list[Any]] = []
        self._log_rows_dropped = 0
        self._anomaly_rows: list[list[Any]] = []
        try:
            run = wandb.init(
                id=c.get("id") or run_id_for(experiment, run_name),
                resume="allow",
                name=c.get("name") or (f"{experiment} · {short_run(run_name)}" if run_name else experiment),
                project=c.get("project"),
                entity=c.get("entity"),
                group=c.get("group") or (experiment if run_name else None),
                mode=c.get("mode"),
                dir=c.get("dir"),
                config={attr.EXPERIMENT_ID: experiment, attr.RUN_ID: run_name},
                reinit="create_new",  # the sink holds one run per experiment, side by side
                settings=wandb.Settings(console="off", silent=True, disable_git=True),
            )
            run.define_metric(STEP_METRIC)
            run.define_metric("*", step_metric=STEP_METRIC)
        except Exception as exc:
            # Off, with one error that names the fix; every later call is a no-op (not an error per step).
            self.off_reason = (
                f"wandb.init failed ({type(exc).__name__}: {str(exc)[:300]}). Fix: give W&B an API key "
                "(WANDB_API_KEY, or `wandb login`), or log offline with WANDB_MODE=offline (or the backend "
                'option "mode": "offline") and upload later with `wandb sync`'
            )
            logging.getLogger("rankscope").error(
                "rankscope: the wandb backend is off for experiment %r: %s", experiment[:64], self.off_reason
            )
            return
        self.run = run
        self.location = getattr(run, "url", None) or getattr(run, "dir", None)

    def _row(self, metrics: list[Metric], prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{m.key}": m.value for m in metrics}

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        if self.logging_mode is LoggingMode.PER_RANK_REDUCE and kwargs.get("process") is not None:
            row = self._row(metrics, series_prefix(kwargs["process"]) + "/")
        else:
            row = self._row(metrics)
            for process, values in self._per_rank(kwargs.get("per_process", {})).items():
                row.update(self._row(values, series_prefix(process) + "/"))
        if kwargs.get("late"):  # W&B cannot rewrite a past step: the correction goes beside it
            row = {LATE_PREFIX + key: value for key, value in row.items()}
            row[attr.LATE_UPDATE] = 1.0
            self._corrections += 1
            self.run.summary[attr.CORRECTIONS] = self._corrections
        if global_step is not None:
            row[STEP_METRIC] = global_step
        if self._rewound_to is not None:
            row[attr.REWOUND_TO] = float(self._rewound_to)
            self._rewound_to = None
        if self._anomaly_rows:
            import wandb

            row["anomalies"] = wandb.Table(columns=_ANOMALY_COLUMNS, data=self._anomaly_rows)  # type: ignore[assignment]
            self._anomaly_rows = []
        if self._log_rows:
            import wandb

            row["logs"] = wandb.Table(columns=_LOG_COLUMNS, data=self._log_rows)  # type: ignore[assignment]
            if self._log_rows_dropped:
                row[attr.LOG_ROWS_DROPPED] = float(self._log_rows_dropped)
            self._log_rows, self._log_rows_dropped = [], 0
        self.run.log(row)

    def log_record(self, record: dict[str, Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        if len(self._log_rows) >= self.max_log_rows:
            self._log_rows_dropped += 1
            return
        who = kwargs.get("process_name") or ""
        values = (record["time"], record["severity"], who, record["body"], record.get("trace_id") or "")
        self._log_rows.append([global_step, *values])

    def _per_rank(self, per_process: dict[Any, list[Metric]]) -> dict[Any, list[Metric]]:
        """The per-process series this step adds (see the module docstring)."""
        mode = self.per_rank_series
        if mode is False or not per_process:
            return {}
        if mode is True or len(per_process) <= self.per_rank_max_processes:
            return per_process
        if not self._capped_warned:
            self._capped_warned = True
            logging.getLogger("rankscope").warning(
                "rankscope: %d processes in one step: W&B per-rank series only for the keys in per_rank_keys "
                "(%s) beyond per_rank_max_processes=%d",
                len(per_process),
                ", ".join(self.per_rank_keys) or "none",
                self.per_rank_max_processes,
            )
        if not self.per_rank_keys:
            return {}
        patterns = self.per_rank_keys
        chosen = {
            p: [m for m in values if any(fnmatch.fnmatchcase(m.key, pat) for pat in patterns)]
            for p, values in per_process.items()
        }
        return {p: values for p, values in chosen.items() if values}

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> None:
        """One W&B Table per sample table and step: the provenance columns, then the row's fields."""
        if self.run is None or not rows:
            return
        import wandb

        fields: dict[str, None] = {}
        for entry in rows:
            fields.update(dict.fromkeys(entry["row"]))
        names = [f"row.{f}" if f in PROVENANCE_COLUMNS else f for f in fields]
        data = [[entry[c] for c in PROVENANCE_COLUMNS] + [entry["row"].get(f) for f in fields] for entry in rows]
        columns: list[str | int] = [*PROVENANCE_COLUMNS, *names]
        name = table if table != STEP_METRIC else f"samples/{table}"  # the step axis keeps its name
        logged: dict[str, Any] = {name: wandb.Table(columns=columns, data=data, allow_mixed_types=True)}
        if global_step is not None:
            logged[STEP_METRIC] = global_step
        self.run.log(logged)

    def log_anomaly(self, record: Anomaly, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        """A W&B alert (offline runs keep none) and a row of the ``anomalies`` table logged with the
        step's values (at most ``max_log_rows`` per step, like the logs table)."""
        if self.run is None:
            return
        from .console import describe

        text = f"step {global_step}: {describe(record)}"
        try:
            self.run.alert(title=f"rankscope: {record.KIND}", text=text[:1000], level="WARN")
        except Exception as exc:  # an alert is a courtesy: the record is in the table either way
            logging.getLogger("rankscope").debug("W&B alert failed: %r", exc)
        if isinstance(record, Capture) and record.path:  # a captured profiler trace: one of the run's files
            path = record.path
            try:
                self.run.save(str(path), base_path=str(Path(path).parents[3]), policy="now")
            except Exception as exc:
                logging.getLogger("rankscope").warning("rankscope: W&B did not take capture file %s (%r)", path, exc)
        if len(self._anomaly_rows) < self.max_log_rows:
            who = record.process if isinstance(record, Located) else None
            self._anomaly_rows.append([global_step, record.KIND, who or "", text])

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        prefix = series_prefix(kwargs["process"]) + "/" if kwargs.get("process") is not None else ""
        row: dict[str, float] = {f"{prefix}{metric.key}": metric.value}
        if global_step is not None:
            row[STEP_METRIC] = global_step
        self.run.log(row)

    def rewind(self, step: int) -> None:
        if self.run is None:
            return
        self._rewound_to = step
        if not self._rewound_warned:
            self._rewound_warned = True
            logging.getLogger("rankscope").warning(
                "rankscope: W&B run %s rewound to step %d: W&B keeps the rows it holds, so the steps from %d "
                "are logged again (the first with rankscope/rewound_to); the later row of a step is the final one",
                getattr(self.run, "id", "?"),
                step,
                step,
            )

    def finish(self) -> None:
        if self.run is not None:
            if self._log_rows or self._anomaly_rows:
                self.log_batch([], None)
            self.run.finish()
