"""What a closed run leaves at the sink: its last status (the status route still answers it) and
its tombstone (its steps go on where they were when data comes back)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .registry import Tenants
from .runbook import ENDED, RESUME, Refused, RunKey

CLOSED_STATUSES = 1000
"""Closed runs whose last status the status route still answers (the most recently closed)."""
TOMBSTONES = 100_000
"""Closed runs whose last step is remembered, so their steps go on where they were on new data."""


class ClosedRuns:
    """The last statuses and tombstones of closed runs, bounded; guarded by the registry's lock."""

    def __init__(self, registry: Tenants) -> None:
        self._registry = registry
        self.evicted = 0
        """Runs closed (ended, idle, or to make room), all told."""
        self._statuses: OrderedDict[RunKey, dict[str, Any]] = OrderedDict()
        self._tombstones: OrderedDict[RunKey, tuple[int, int]] = OrderedDict()

    def keep_status(self, key: RunKey, status: dict[str, Any]) -> None:
        """A closing run's last status, for the status route (takes the registry's lock)."""
        with self._registry.lock:
            self._statuses[key] = {**status, "open": False}
            while len(self._statuses) > CLOSED_STATUSES:
                self._statuses.popitem(last=False)

    def status_of(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """The last status of a closed run (run None: the experiment's latest run), if still kept."""
        runs = self._registry.runs
        with self._registry.lock:
            if run is None:
                run = runs.latest(experiment_id)
                if run is None:
                    return None
            found = self._statuses.get((experiment_id, runs.target(experiment_id, run)))
            return None if found is None else dict(found)

    def count_refused(self, refused: Refused, n: int) -> None:
        """Points refused for a run that is closed, in its kept status (under the registry lock)."""
        status = self._statuses.get(refused.key) if refused.key is not None else None
        field = {ENDED: "reused_run_points", RESUME: None}.get(refused.kind, "scope_refused_points")
        if status is not None and field is not None:
            status[field] = status.get(field, 0) + n

    def bury(self, key: RunKey, last_finalized: int, attempt: int) -> None:
        """Remember where a closed run's steps were (under the registry lock)."""
        self.evicted += 1
        self._tombstones[key] = (last_finalized, attempt)
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    def exhume(self, key: RunKey) -> tuple[int, int] | None:
        """Where a run that opens again had its steps, if it closed before (under the registry lock)."""
        return self._tombstones.pop(key, None)
