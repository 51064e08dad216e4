"""What the control routes read of the sink: ``Queries`` is the edge's ``ControlQueries`` port.

The status of a run and of the sink as a whole, a run's last finalized steps and its spans.
Nothing here changes the sink: what does (also finalizing steps now, or marking a capture request
taken) is ``commands``. Every answer is read under the run's own lock, never while holding the
registry's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..core import names as attr
from .book.traces import StoredSpan
from .checked import ALL, Scope, SpanQuery
from .config import SinkConfig
from .runs.closed import ClosedRuns
from .runs.closing import Closer
from .runs.registry import Tenants
from .runs.status import RunStatus
from .tally import Tally
from .views.step import StepView

RECENT_KEYS = 256
"""Values of one step the recent route shows at most."""


def recent_of(view: StepView) -> dict[str, Any]:
    """A finalized step as the recent route shows it (``rankscope top``): ``time`` is when the sink
    finalized it, ``duration`` the job's wall time of the step (``StepView.duration``; None: unknown),
    ``from_start`` whether it counts from the job's start (its first step: set-up and all)."""
    values: dict[str, float] = {}
    for metric in view.global_metrics:
        if len(values) >= RECENT_KEYS:
            break
        values[metric.key] = metric.value
    return {
        "step": view.step,
        "time": time.time(),
        "duration": view.duration,  # job's seconds from the previous step's first close (or the start) to this one's
        "from_start": view.from_start,  # the run's first step: its duration holds the job's set-up
        "values": values,
        "missing": view.missing[:64],
        "anomalies": [a.to_json() for a in view.anomalies[:16]],
        "phases": view.heat,
        "late": _late_in(view),
    }


def _late_in(view: StepView) -> dict[str, str]:
    """Per phase of the step's map, the process the sink judged furthest over the others net of
    its waits (``straggler/{phase}/late_rank``), and per collective the last to arrive: what
    ``rankscope top`` marks. A phase whose furthest process only waited has none."""
    prefix, suffix = attr.STRAGGLER_PREFIX, "/late_rank"
    return {
        key[len(prefix) : -len(suffix)]: label
        for key, label in view.labels.items()
        if key.startswith(prefix) and key.endswith(suffix) and key[len(prefix) : -len(suffix)] in view.heat
    }


def corrected(recent: Iterable[dict[str, Any]], view: StepView) -> None:
    """A late update of a step the recent route still shows: its values are the step's exact total now."""
    for row in recent:
        if row["step"] == view.step:
            row["values"].update(recent_of(view)["values"])
            row["missing"], row["late"] = view.missing[:64], True


class Queries:
    """The sink's answers to what its control routes read (``edge.ports.ControlQueries``)."""

    def __init__(
        self,
        config: SinkConfig,
        tenants: Tenants,
        tally: Tally,
        *,
        closed: ClosedRuns,
        statuses: RunStatus,
        closer: Closer,
        health: Callable[[], tuple[bool, list[str]]],
        internal_errors: list[str],
        connections: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.tally = tally
        self._closed = closed
        self._statuses = statuses
        self._closer = closer
        self._health = health
        self._internal_errors = internal_errors
        self._connections = connections
        """What the HTTP transport's connection rules did (``edge.connections.Counts``)."""

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, problems): every supervised thread that should run is running."""
        return self._health()

    # -- status ---------------------------------------------------------------------------

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """A run's status (None: the experiment's latest run), with the experiment's runs listed."""
        tenant = self.tenants.find(experiment_id, run)
        if tenant is None:  # closed (ended, idle): its last status, while the sink keeps it
            return self._statuses.closed(experiment_id, run)
        return self._statuses.of(tenant)

    def overview(self, scope: Scope = ALL) -> dict[str, Any]:
        """The sink as a whole (the status route without ``?experiment=``); its runs and run notes as
        ``scope`` sees them (its experiments', its own notes), listed before they are cut to 100 (the
        sink-wide counts are the caller's to withhold: ``edge.control.ScopedQueries``)."""
        healthy, problems = self.health()
        registry = self.tenants
        with registry.lock:
            tenants = sorted(kv for kv in registry.open.items() if scope is ALL or scope.allows(kv[0][0]))
            experiments = len({key[0] for key, _ in tenants})
            admission = registry.quotas.status()
        listed = []
        for (experiment_id, run), tenant in tenants[:100]:
            with tenant.lock:
                e = tenant.book
                views = tenant.writer.status() if tenant.writer is not None else {}
                listed.append(
                    {
                        "id": experiment_id,
                        "run": run,
                        "processes": e.roster.counts()[0],
                        "last_finalized_step": e.last_finalized,
                        "views": {name: v["location"] for name, v in views.items()},
                    }
                )
        return {
            "healthy": healthy,
            "problems": problems,
            "experiments": experiments,
            "runs": len(tenants),
            "experiment_list": listed,
            "run_notes": registry.notes.listed(None if scope is ALL else scope.name),
            "evicted_experiments": self._closed.evicted,
            "closing_runs": self._closer.closing,
            "settling_runs": self._closer.settling,
            **self.tally.overview(),
            "internal_errors": len(self._internal_errors),
            "durable": self.config.state_dir is not None,
            "descriptors": registry.descriptors.status(),
            "disk": registry.disk.status(),
            "connections": self._connections(),
            "admission": admission,
        }

    def recent(self, experiment_id: str, run: str | None = None) -> list[dict[str, Any]] | None:
        """A run's last finalized steps (values, missing, anomalies, rank x phase seconds); None: the
        experiment's latest run."""
        tenant = self.tenants.find(experiment_id, run)
        if tenant is None:
            return None
        with tenant.lock:
            return list(tenant.recent)

    def local_pids(self, host: str) -> set[int]:
        """Pids of this machine's client processes (the embedded sink exits when they have)."""
        pids: set[int] = set()
        for tenant in self.tenants.all():
            with tenant.lock:
                pids |= tenant.book.roster.local_pids(host)
        return pids

    # -- spans ----------------------------------------------------------------------------

    def spans(self, query: SpanQuery) -> list[StoredSpan] | None:
        """Stored spans of a run (None: the experiment's latest; see ``book.traces``), or None for an
        unknown experiment or run."""
        tenant = self.tenants.find(query.experiment, query.run)
        if tenant is None:
            return None
        with tenant.lock:
            return tenant.book.traces.select(query.first, query.last, query.ranks)

    def span_rows(self, query: SpanQuery) -> Iterator[str] | None:
        """JSONL rows of a run's spans (None: the experiment's latest run): the whole run from its
        span file when it has one, else the stored (retained) steps; None for an unknown run."""
        tenant = self.tenants.find(query.experiment, query.run)
        if tenant is None:
            return None
        with tenant.lock:
            file = tenant.book.traces.file
            if file is None:
                return iter(
                    [
                        json.dumps(s.row(), default=str) + "\n"
                        for s in tenant.book.traces.select(query.first, query.last, query.ranks)
                    ]
                )
            return file.rows(query.first, query.last, query.ranks)

    # -- views written ----------------------------------------------------------------------

    # -- captures (``views.captures``) ----------------------------------------------------------

    def capture_target(self, experiment_id: str, capture_id: str, process_id: str, size: int) -> Path:
        """Where a process's trace of a capture goes, checked before its body is read. Raises
        ``LookupError`` for a capture, process or experiment that does not ask for this file."""
        tenant = self.tenants.of_process(experiment_id, process_id)
        if tenant is None:
            raise LookupError(f"no process {process_id[:64]!r} in experiment {experiment_id[:200]!r}")
        with tenant.lock:
            book = tenant.book
            process = book.roster.processes.get(process_id)
            if process is None:
                raise LookupError(f"no process {process_id[:64]!r} in this experiment")
            path = tenant.captures.path_for(self.config.artifacts_dir, experiment_id, capture_id, process, size)
        if isinstance(path, str):
            raise LookupError(path)
        return path
