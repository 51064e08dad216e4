"""W&B backend: exactly one run per experiment, every role and process in it.

The run id is derived from the experiment id, and the run is opened with
``resume="allow"``, so a restarted sink continues the same run instead of starting a new
one. Values are plotted against a ``step`` metric declared with ``define_metric``, not
W&B's internal ``_step``: steps of different roles share one axis, and a late update of
an earlier step is a valid log call (W&B's own step only ever increases).

Config keys: ``project`` (``WANDB_PROJECT``), ``entity`` (``WANDB_ENTITY``), ``group``
(``WANDB_RUN_GROUP``), ``mode`` (``WANDB_MODE``: online/offline/disabled), ``dir``,
``name`` (default: the experiment id), ``per_rank_series`` (default true: a global view
also logs each process's values under ``role/replica/rRANK/key``).

A ``wandb.init`` that fails (no API key and not offline, say) turns the backend off with one
error naming the fix, instead of an error at every step: the job and the other views go on.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from .base import LoggerBackend, LoggingMode, Metric

STEP_METRIC = "step"


def run_id_for(experiment: str) -> str:
    """A W&B run id that is stable for an experiment id and valid whatever the id holds.

    W&B names the run's directory after it, so it is a safe path component too: at most 57
    characters of ``[A-Za-z0-9_-]`` ending in a hash of the whole id. It keeps this formula
    rather than ``safe_component``: a sink upgraded mid-experiment must resume the same run.
    """
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", experiment).strip("-")[:48]
    return f"{readable}-{hashlib.sha1(experiment.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def series_prefix(process: Any) -> str:
    """``trainer/r0`` or ``generator/1/r0``: one series per process in the experiment's run."""
    replica = getattr(process, "replica", None)
    middle = "" if replica is None else f"/{replica}"
    return f"{process.role}{middle}/r{process.rank}"


class WandbBackend(LoggerBackend):
    run: Any = None
    """The W&B run; None when ``init`` failed (the backend is then off: every call is a no-op)."""

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover - wandb is a dependency
            raise ImportError("the wandb backend needs wandb: pip install wandb") from exc
        c = self.logger_backend_config
        experiment = str(kwargs.get("experiment") or c.get("name") or "rankscope")
        self.per_rank_series = bool(c.get("per_rank_series", True))
        try:
            run = wandb.init(
                id=c.get("id") or run_id_for(experiment),
                resume="allow",
                name=c.get("name") or experiment,
                project=c.get("project"),
                entity=c.get("entity"),
                group=c.get("group"),
                mode=c.get("mode"),
                dir=c.get("dir"),
                config={"rankscope.experiment.id": experiment},
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

    def _row(self, metrics: list[Metric], prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{m.key}": m.value for m in metrics}

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        if self.logging_mode is LoggingMode.PER_RANK_REDUCE and kwargs.get("process") is not None:
            row = self._row(metrics, series_prefix(kwargs["process"]) + "/")
        else:
            row = self._row(metrics)
            if self.per_rank_series:
                for process, values in kwargs.get("per_process", {}).items():
                    row.update(self._row(values, series_prefix(process) + "/"))
        if global_step is not None:
            row[STEP_METRIC] = global_step
        if kwargs.get("late"):
            row["rankscope/late_update"] = 1.0
        self.run.log(row)

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        prefix = series_prefix(kwargs["process"]) + "/" if kwargs.get("process") is not None else ""
        row: dict[str, float] = {f"{prefix}{metric.key}": metric.value}
        if global_step is not None:
            row[STEP_METRIC] = global_step
        self.run.log(row)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
