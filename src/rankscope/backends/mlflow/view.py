"""The MLflow view: one MLflow run per rankscope run, in the MLflow experiment of the same name.

Config keys: ``tracking_uri`` (default: MLflow's own ``MLFLOW_TRACKING_URI``; ``http://`` or
``https://``: a tracking server), ``timeout`` (seconds one request may take, default 10),
``max_buffered`` (entries held while the server does not take them, default 600,000: a
10-minute outage at 1 step/s of 1,000 keys), ``max_backoff`` (seconds between tries at most,
default 30), ``artifact_seconds`` (how often changed files are uploaded, default 30),
``finish_timeout`` (seconds ``finish`` waits for the buffer to drain, default 8: under the
sink's stop timeout), ``run_name`` (default: the rankscope run id, which says when the run
started and its short id: ``20261127-101500-abf76e7e``).

What goes where (docs/mlflow.md):

* the global view's keys are metrics at their step (``keys.mlflow_key`` maps the keys MLflow
  would refuse; the map is the artifact ``rankscope/keys.json``); in ``per_rank_reduce`` mode
  each process's values go to a child run of its own;
* the run's configuration (the Resource attributes ``report.summary.config_of`` keeps, the same
  as the compare page's) are params ``ROLE/ATTRIBUTE``;
* tags: ``rankscope.experiment.id``, ``rankscope.run.id``, ``rankscope.experiment.attempt``,
  ``rankscope.world_size.ROLE`` (each role's world size), ``rankscope.processes``, and counts:
  ``rankscope.anomalies``, ``rankscope.late_updates``, ``rankscope.rewound_to``,
  ``rankscope.keys_mapped``;
* anomaly records are the artifact ``rankscope/anomalies.jsonl``, sample tables
  ``rankscope/samples/TABLE.jsonl`` (one JSON object per row, with its provenance), the report
  page (when the run has a report view) ``rankscope/report.html`` and the sink's last status of
  the run ``rankscope/status.json``.

A late update or a rewound step is logged again at its step with a later timestamp: of a step's
values in a metric's history, the latest is the final one.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ...core import names as attr
from ...core.anomalies import Anomaly
from ...core.paths import safe_component
from ...report.summary import config_of
from ..base import LoggerBackend, LoggingMode, Metric
from .batches import Entry, MetricPoint, param, tag
from .keys import KeyMap

log = logging.getLogger("rankscope")

ARTIFACT_DIR = "rankscope"
FINISH_TIMEOUT = 8.0
"""Seconds ``finish`` waits for the buffer to drain by default: under the sink's 10 s stop timeout."""
VARIES = "(varies)"
"""A param whose processes disagree (``config_of``'s None)."""


class MlflowBackend(LoggerBackend):
    descriptors = 2
    """The connection to the server and a file being appended to (an estimate: the sink's budget)."""

    def __init__(self, logger_backend_config: dict[str, Any] | None = None) -> None:
        config = {"logging_mode": LoggingMode.GLOBAL_REDUCE.value, **(logger_backend_config or {})}
        super().__init__(config)
        if importlib.util.find_spec("mlflow") is None:
            raise ImportError("the mlflow backend needs MLflow's client: pip install 'rankscope[mlflow]'")
        c = self.logger_backend_config
        self.timeout = float(c.get("timeout", 10.0))
        self.max_buffered = int(c.get("max_buffered", 600_000))
        self.max_backoff = float(c.get("max_backoff", 30.0))
        self.artifact_seconds = float(c.get("artifact_seconds", 30.0))
        self.finish_timeout = float(c.get("finish_timeout", FINISH_TIMEOUT))
        if min(self.timeout, self.max_buffered, self.max_backoff, self.finish_timeout) <= 0:
            raise ValueError("mlflow backend: timeout, max_buffered, max_backoff and finish_timeout must be > 0")
        self.sender: Any = None
        """The ``sender.Sender``; None while the view is off."""
        self.keys = KeyMap()
        self._dir: Path | None = None
        self._files: dict[str, IO[str]] = {}
        self._config: dict[str, dict[str, str | None]] = {}
        self._processes_seen: set[Any] = set()
        self._tags: dict[str, str] = {}
        self._pending: list[Entry] = []
        """Params and tags to send with the next values."""
        self._final: dict[str, Any] | None = None
        self._last_ms = 0
        self._anomalies = 0
        self._late_updates = 0

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().init(process_name)
        c = self.logger_backend_config
        self.experiment = str(kwargs.get("experiment") or process_name or "rankscope")
        self.run = str(kwargs.get("run") or "")
        uri = str(c.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "")
        if not uri.startswith(("http://", "https://")):
            self.off_reason = _why_no_server(
                uri, "the view's tracking_uri" if c.get("tracking_uri") else "MLFLOW_TRACKING_URI"
            )
            log.error("rankscope: the mlflow view is off for experiment %r: %s", self.experiment[:64], self.off_reason)
            return
        from mlflow import MlflowClient

        from .rest import Rest
        from .runs import MlflowRuns
        from .sender import Sender

        client = MlflowClient(tracking_uri=uri)

        def upload(run_id: str, path: str, artifact_dir: str) -> None:
            client.log_artifact(run_id, path, artifact_dir)

        tags = {attr.EXPERIMENT_ID: self.experiment, "mlflow.source.name": "rankscope"}
        if self.run:
            tags[attr.RUN_ID] = self.run
        rest = Rest(uri, self.timeout)
        run_name = str(c.get("run_name") or self.run or self.experiment)
        runs = MlflowRuns(rest, self.experiment, self.run, run_name=run_name, tags=tags)
        who = f"{self.experiment[:64]!r}" + (f" run {self.run[:64]!r}" if self.run else "")
        self.sender = Sender(
            rest,
            runs,
            upload,
            name=who,
            max_buffered=self.max_buffered,
            max_backoff=self.max_backoff,
            artifact_seconds=self.artifact_seconds,
        )
        self._dir = Path(tempfile.mkdtemp(prefix="rankscope-mlflow-"))
        self.location = f"{rest.uri} (experiment {self.experiment[:64]!r})"

    def health(self) -> dict[str, Any] | None:
        """The sender's counts (``sender.Sender.status``) and the keys mapped, for the sink's status route."""
        sender = self.sender  # read once: ``finish`` may clear it on the view's thread meanwhile
        if sender is None:
            return self._final
        return {**sender.status(), "keys_mapped": len(self.keys.mapped) + self.keys.overflow}

    # Values.

    def _now_ms(self) -> int:
        """Milliseconds, strictly later than the last call's: a step logged again is the later one."""
        self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        return self._last_ms

    def _target(self, kwargs: Mapping[str, Any]) -> str:
        if self.logging_mode is LoggingMode.GLOBAL_REDUCE:
            return ""
        return str(kwargs.get("process_name") or self.process_name or "")

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> None:
        if self.sender is None or global_step is None:
            return
        target = self._target(kwargs)
        stamp = self._now_ms()
        entries: list[Entry] = [MetricPoint(self.keys(m.key), m.value, stamp, global_step, target) for m in metrics]
        if kwargs.get("late"):
            self._late_updates += 1
            self._tag(attr.NAMESPACE + "late_updates", self._late_updates)
        per_process: Mapping[Any, Any] = kwargs.get("per_process") or {}
        if per_process and not kwargs.get("late"):
            self._processes(per_process)
        elif kwargs.get("process") is not None:
            self._processes({kwargs["process"]: ()})
        entries.extend(self._pending)
        self._pending = []
        self.sender.put(entries)
        if self.keys.changed:
            self._write_json("keys.json", self.keys.taken())
            self._tag(attr.NAMESPACE + "keys_mapped", len(self.keys.mapped) + self.keys.overflow)

    def _tag(self, key: str, value: Any) -> None:
        if self._tags.get(key) != str(value):
            self._tags[key] = str(value)
            self._pending.append(tag(key, value))

    def _most(self, key: str, value: int) -> None:
        """Tag ``key`` with ``value`` if it is more than the tag says."""
        if value > int(self._tags.get(key, -1)):
            self._tag(key, value)

    def _processes(self, per_process: Mapping[Any, Any]) -> None:
        """Params and tags from the processes new in this step (their Resources)."""
        new = [p for p in per_process if getattr(p, "id", p) not in self._processes_seen]
        if not new or len(self._processes_seen) >= 100_000:
            return
        self._processes_seen.update(getattr(p, "id", p) for p in new)
        for p in new:
            self._most(attr.EXPERIMENT_ATTEMPT, int(getattr(p, "attempt", 0) or 0))
            self._most(f"{attr.WORLD_SIZE}.{getattr(p, 'role', '')}", int(getattr(p, "world_size", 0) or 0))
        self._tag(attr.NAMESPACE + "processes", len(self._processes_seen))
        found = config_of((str(p.role), p.resource) for p in new if isinstance(getattr(p, "resource", None), Mapping))
        for role, values in found.items():
            seen = self._config.setdefault(role, {})
            for key, value in values.items():
                if key in seen and seen[key] == value:
                    continue
                merged = value if key not in seen else None  # processes that disagree: "(varies)"
                seen[key] = merged
                self._pending.append(param(self.keys(f"{role}/{key}"), VARIES if merged is None else merged))

    def rewind(self, step: int) -> None:
        if self.sender is None:
            return
        self._tag(attr.NAMESPACE + "rewound_to", step)

    # Files: anomalies, sample tables, the key map, the report page and the sink's status.

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        if self._dir is None or self.sender is None:
            return
        out = self._files.get(name)
        if out is None:
            path = self._dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            out = self._files[name] = path.open("a", encoding="utf-8")
        for row in rows:
            out.write(json.dumps(row, default=str) + "\n")
        out.flush()
        self.sender.changed(str(self._dir / name), str(Path(ARTIFACT_DIR, name).parent))

    def _write_json(self, name: str, data: Any) -> None:
        if self._dir is None or self.sender is None:
            return
        path = self._dir / name
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data, default=str, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        self.sender.changed(str(path), ARTIFACT_DIR)

    def log_anomaly(self, record: Anomaly, global_step: int | None, *args: Any, **kwargs: Any) -> None:
        self._anomalies += 1
        self._append("anomalies.jsonl", [{**record.to_json(), "step": global_step}])
        self._tag(attr.NAMESPACE + "anomalies", self._anomalies)

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> None:
        extra = {"late": True} if kwargs.get("late") else {}
        self._append(f"samples/{safe_component(table)}.jsonl", [{**entry, **extra} for entry in rows])

    def keep_files(self, paths: list[str], status: dict[str, Any] | None = None) -> None:
        """The report page the run's report view wrote, and the sink's status of the run."""
        if self.sender is None:
            return
        for path in paths:
            if Path(path).suffix == ".html" and Path(path).is_file():
                self.sender.changed(path, ARTIFACT_DIR)
        if status:
            self._write_json("status.json", status)

    def finishing(self) -> None:
        if self.sender is not None:
            if self._pending:
                self.sender.put(self._pending)
                self._pending = []
            self.sender.begin_close(self.finish_timeout)

    def finish(self) -> None:
        if self.sender is None:
            return
        if self._pending:
            self.sender.put(self._pending)
            self._pending = []
        try:
            self.sender.close(self.finish_timeout)
            self._final = self.health()
        finally:
            for out in self._files.values():
                out.close()
            self._files.clear()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
            self.sender = None


_HOST_PORT = re.compile(r"^[\w.-]+:\d+(/.*)?$")
"""``127.0.0.1:5000``, ``mlflow.lab:443/path``: a server's address without its scheme."""


def _why_no_server(uri: str, source: str) -> str:
    """Why a tracking URI (from ``source``) names no server this view sends to (only ``http(s)://``
    does), and the fix."""
    if _HOST_PORT.match(uri):
        scheme = "https" if uri.split("/", 1)[0].endswith(":443") else "http"
        return f"the tracking URI {uri!r} has no scheme. Fix: {source}={scheme}://{uri}"
    return (
        f"no MLflow tracking server to send to (tracking URI {uri!r}). Fix: start one "
        "(`mlflow server --port 5000`) and set MLFLOW_TRACKING_URI=http://127.0.0.1:5000, "
        'or give the view the option "tracking_uri"'
    )
