"""JSONL backend: one JSON object per value, one file per process.

Config: ``path`` (default ``rankscope_logs/{experiment}/{process}.jsonl``). The template is
the operator's and used as given; the names put into it (``experiment``, ``run``, ``process``,
``role``, ``replica``, ``rank``) are the client's, so each becomes a ``safe_component`` while
the rows keep the original names. Each row carries its experiment and run; a rewound run (a
restart or resume that executes steps again) writes ``{"kind": "rewind", "step": N}`` first,
so a reader keeps, of each step from N, the rows after that line. Non-finite numbers are
written as ``NaN``/``Infinity``, which Python's json module reads back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from ..core.anomalies import Anomaly
from ..core.paths import safe_component
from .base import LoggerBackend, Metric


def _component(value: Any) -> Any:
    """Ints stay ints (a template may say ``{rank:03d}``); anything else becomes a safe name."""
    return value if isinstance(value, int) and not isinstance(value, bool) else safe_component(str(value))


class JsonlBackend(LoggerBackend):
    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        self.identity = {k: kwargs[k] for k in ("experiment", "role", "replica", "rank") if kwargs.get(k) is not None}
        if kwargs.get("run"):
            self.identity["run"] = kwargs["run"]
        template = self.logger_backend_config.get("path", "rankscope_logs/{experiment}/{process}.jsonl")
        fields = {k: _component(v) for k, v in {"process": process_name, "run": "run", **self.identity}.items()}
        path = Path(str(template).format(pid=os.getpid(), **fields))
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.location = str(path.resolve())
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def _write(self, kind: str, metric: Metric, step: int | None, extra: dict[str, Any]) -> None:
        row = {
            "kind": kind,
            "step": step,
            "key": metric.key,
            "value": metric.value,
            "reduce": metric.reduction.value,
            "time": metric.timestamp,
            **self.identity,
        }
        if extra.get("process_name"):  # at the sink: whose value this is
            row.update(process=extra["process_name"], role=extra.get("role"), rank=extra.get("rank"))
            if extra.get("replica") is not None:
                row["replica"] = extra["replica"]
        if extra.get("late"):
            row["late"] = True
        self._file.write(json.dumps(row) + "\n")

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        for metric in metrics:
            self._write(self.logging_mode.value, metric, global_step, kwargs)
        self._file.flush()

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        self._write("stream", metric, global_step, kwargs)

    def log_record(self, record: dict[str, Any], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        row = {"kind": "log", "step": global_step, **record, **self.identity}
        if kwargs.get("process_name"):
            row.update(process=kwargs["process_name"], role=kwargs.get("role"), rank=kwargs.get("rank"))
        self._file.write(json.dumps(row, default=str) + "\n")
        self._file.flush()

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> None:
        """One line per kept row: ``{"kind": "sample", "table", "step", "row", ...provenance}``."""
        extra: dict[str, Any] = {"late": True} if kwargs.get("late") else {}
        for k in ("experiment", "run"):  # not the view's role/rank: the row's own provenance says whose it is
            if k in self.identity:
                extra[k] = self.identity[k]
        for entry in rows:
            self._file.write(json.dumps({"kind": "sample", **entry, **extra}, default=str) + "\n")
        self._file.flush()

    def log_anomaly(self, record: Anomaly, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        """``{"kind": "anomaly", "type": ..., "step": ..., ...}``."""
        row = {"kind": "anomaly", **record.to_json()}
        for k in ("experiment", "run"):
            if k in self.identity:
                row[k] = self.identity[k]
        self._file.write(json.dumps(row, default=str) + "\n")
        self._file.flush()

    def rewind(self, step: int) -> None:
        """``{"kind": "rewind", "step": N}``: a reader keeps, of each step from N, the rows after this line."""
        self._file.write(json.dumps({"kind": "rewind", "step": step, **self.identity}) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()
