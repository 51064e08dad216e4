"""Which MLflow experiment and runs a rankscope run is: found by their tags, else created.

A rankscope experiment is the MLflow experiment of the same name (created if missing, restored
if deleted). A rankscope run is one MLflow run tagged ``rankscope.run.id`` and
``rankscope.view=global``; in ``per_rank_reduce`` mode each process is a child run of it
(``mlflow.parentRunId``) tagged ``rankscope.process``. Finding them by their tags first means a
view opened again (a quiet run's views are released and reopened, a sink restarts) continues
the same MLflow runs instead of starting new ones. The global and the per-process view of one run
in one sink make it under one lock (the second finds it); views of two sinks that make it at once
settle on the first made (each looks again ``SETTLE`` seconds after making its own).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from ...core import names as attr
from .rest import RefusedError, Rest

MAX_EXPERIMENT_NAME = 500
SETTLE = 0.5
"""Seconds a view that made a run waits before it looks again for others made at once."""
_MAKING: dict[tuple[str, str, str], threading.Lock] = {}
"""(server, experiment, run) -> the lock its views of this process make the run under: the
global and the per-process view of one run, in one sink, find the one made first."""
_MAKING_LOCK = threading.Lock()
PROCESS_TAG = attr.MLFLOW_PROCESS_TAG
VIEW_TAG = attr.MLFLOW_VIEW_TAG
PARENT_TAG = "mlflow.parentRunId"


def experiment_name(experiment: str) -> str:
    """The MLflow experiment's name: the rankscope experiment's, cut with a hash past 500 characters."""
    if len(experiment) <= MAX_EXPERIMENT_NAME:
        return experiment
    digest = hashlib.blake2b(experiment.encode("utf-8", "surrogatepass"), digest_size=5).hexdigest()
    return f"{experiment[: MAX_EXPERIMENT_NAME - 11]}-{digest}"


def _quoted(value: str) -> str | None:
    """``value`` as a string in an MLflow search filter; None when it cannot be written there."""
    return None if "'" in value or "\\" in value else f"'{value}'"


class MlflowRuns:
    """The experiment's id and the run ids of one rankscope run (``""``: the run, else a child run's
    process label), looked up or created on first need, on the sender's thread."""

    def __init__(self, rest: Rest, experiment: str, run: str, *, run_name: str, tags: Mapping[str, str]) -> None:
        self._rest = rest
        self.experiment = experiment
        self.run = run
        self.run_name = run_name
        self._tags = dict(tags)
        self.experiment_id: str | None = None
        self.run_ids: dict[str, str] = {}

    def ensure(self, target: str) -> str:
        """The MLflow run id of ``target``; raises ``rest.UnreachableError`` or ``rest.RefusedError``."""
        found = self.run_ids.get(target)
        if found is not None:
            return found
        experiment_id = self._experiment()
        if target == "":
            tags = {**self._tags, VIEW_TAG: "global"}
            with _MAKING_LOCK:
                making = _MAKING.setdefault((self._rest.uri, self.experiment, self.run), threading.Lock())
            with making:
                found = self._find_or_create(experiment_id, {VIEW_TAG: "global"}, self.run_name, tags)
        else:
            parent = self.ensure("")
            tags = {**self._tags, VIEW_TAG: "process", PROCESS_TAG: target, PARENT_TAG: parent}
            found = self._find_or_create(experiment_id, {PROCESS_TAG: target}, f"{self.run_name} {target}", tags)
        self.run_ids[target] = found
        return found

    def _experiment(self) -> str:
        if self.experiment_id is not None:
            return self.experiment_id
        name = experiment_name(self.experiment)
        for _ in range(3):  # another sink may create it between our look and our create
            try:
                found = self._rest.call("GET", "experiments/get-by-name", {"experiment_name": name})
            except RefusedError as exc:
                if exc.code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            else:
                experiment = found.get("experiment") or {}
                experiment_id = str(experiment.get("experiment_id"))
                if experiment.get("lifecycle_stage") == "deleted":
                    self._rest.call("POST", "experiments/restore", {"experiment_id": experiment_id})
                self.experiment_id = experiment_id
                return experiment_id
            try:
                created = self._rest.call("POST", "experiments/create", {"name": name})
            except RefusedError as exc:
                if exc.code != "RESOURCE_ALREADY_EXISTS":
                    raise
                continue
            self.experiment_id = str(created["experiment_id"])
            return self.experiment_id
        raise RefusedError("RESOURCE_DOES_NOT_EXIST", f"experiment {name[:64]!r} neither found nor created")

    def _find_or_create(self, experiment_id: str, marks: Mapping[str, str], name: str, tags: Mapping[str, str]) -> str:
        found = self._find(experiment_id, marks)
        if found is not None:
            run_id, status = found
            if status != "RUNNING":
                self._rest.call("POST", "runs/update", {"run_id": run_id, "status": "RUNNING"})
            return run_id
        body: dict[str, Any] = {
            "experiment_id": experiment_id,
            "run_name": name[:250],
            "start_time": int(time.time() * 1000),
            "tags": [{"key": k, "value": v[:8000]} for k, v in tags.items()],
        }
        created = str(self._rest.call("POST", "runs/create", body)["run"]["info"]["run_id"])
        time.sleep(SETTLE)  # another sink's view making it at this moment has made it by now
        settled = self._find(experiment_id, marks)
        if settled is not None and settled[0] != created:  # another view made it too: the first one stays
            self._rest.call("POST", "runs/delete", {"run_id": created})
            return settled[0]
        return created

    def _find(self, experiment_id: str, marks: Mapping[str, str]) -> tuple[str, str] | None:
        """The run tagged with this rankscope run's ids and ``marks``, and its status; None: none is.
        Of several (two views of one sink, or two sinks, made it at once), the first made (by start
        time, then id): each view that made one settles on it, and deletes its own."""
        clauses = []
        for key, value in {attr.EXPERIMENT_ID: self.experiment, attr.RUN_ID: self.run, **marks}.items():
            if not value:  # data without a run id: the experiment's one run
                continue
            quoted = _quoted(value)
            if quoted is None:
                return None  # not searchable: a new MLflow run
            clauses.append(f"tags.`{key}` = {quoted}")
        body = {
            "experiment_ids": [experiment_id],
            "filter": " and ".join(clauses),
            "max_results": 50,
            "order_by": ["attributes.start_time ASC"],
        }
        runs = [r.get("info") or {} for r in self._rest.call("POST", "runs/search", body).get("runs") or []]
        if not runs:
            return None
        info = min(runs, key=lambda i: (int(i.get("start_time") or 0), str(i.get("run_id"))))
        return str(info.get("run_id")), str(info.get("status"))

    def end(self, status: str = "FINISHED") -> None:
        """Mark the runs this view has as ended (they run again if the view opens again)."""
        now = int(time.time() * 1000)
        for run_id in self.run_ids.values():
            self._rest.call("POST", "runs/update", {"run_id": run_id, "status": status, "end_time": now})
