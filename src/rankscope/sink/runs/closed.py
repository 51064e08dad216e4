"""What a closed run leaves at the sink: its last status (the status route still answers it), its
tombstone (its steps go on where they were when data comes back) and, once it is retired, its
run book record; with a state directory, all three survive a restart.

A run retired (closed with nothing left to replay: ``closing``) leaves no directory in the state
directory; what it leaves is in the state directory's store of retired runs
(``durable.retired``), bounded as it is here: ``TOMBSTONES`` runs (each its tombstone and run book
record) and ``CLOSED_STATUSES`` statuses. A start reads the store back (``restore``) before it
replays the runs whose logs it finds.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..durable.retired import RetiredStore
from .registry import Tenants
from .runbook import ENDED, RESUME, Refused, Run, RunKey

CLOSED_STATUSES = 1000
"""Closed runs whose last status the status route still answers (the most recently closed)."""
TOMBSTONES = 100_000
"""Closed runs whose last step is remembered, so their steps go on where they were on new data."""
RUNS, STATUSES = "runs", "statuses"
"""The tables of the store of retired runs: a run's tombstone and record; a closed run's last status."""


class ClosedRuns:
    """The last statuses and tombstones of closed runs, bounded; guarded by the registry's lock.

    ``store``: the state directory's store of retired runs (None: memory only). A status is kept
    without the experiment's runs (they change, and would make each status 100 runs long):
    ``status.RunStatus.closed`` adds them when it is read.
    """

    def __init__(
        self,
        registry: Tenants,
        *,
        state_dir: Path | None = None,
    ) -> None:
        self._registry = registry
        self.store = RetiredStore(state_dir, {RUNS: TOMBSTONES, STATUSES: CLOSED_STATUSES}) if state_dir else None
        self.evicted = 0
        """Runs closed (ended, idle, or to make room), all told."""
        self.retired = 0
        """Runs whose directory went, what must survive of them in the store."""
        self._statuses: OrderedDict[RunKey, dict[str, Any]] = OrderedDict()
        self._tombstones: OrderedDict[RunKey, tuple[int, int]] = OrderedDict()

    def keep_status(self, key: RunKey, status: dict[str, Any]) -> None:
        """A closing run's last status, for the status route (takes the registry's lock); durable with
        the next ``save``."""
        kept = {k: v for k, v in status.items() if k != "runs"}
        kept["open"] = False
        with self._registry.lock:
            self._statuses[key] = kept
            while len(self._statuses) > CLOSED_STATUSES:
                self._statuses.popitem(last=False)
            if self.store is not None:
                self.store.put(STATUSES, list(key), kept)

    def status_of(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """The last status of a closed run (run None: the experiment's latest run), if still kept."""
        runs = self._registry.runs
        with self._registry.lock:
            if run is None:
                run = runs.latest(experiment_id)
                if run is None:
                    return None
            found = self._statuses.get((experiment_id, runs.target(experiment_id, run)))
            if found is None:
                return None
            return dict(found)

    def last_step(self, key: RunKey) -> int | None:
        """The last finalized step of a closed run, while its tombstone is kept (under the registry lock)."""
        tombstone = self._tombstones.get(key)
        return tombstone[0] if tombstone is not None else None

    def count_refused(self, refused: Refused, n: int) -> None:
        """Points refused for a run that is closed, in its kept status (under the registry lock)."""
        status = self._statuses.get(refused.key) if refused.key is not None else None
        field = {ENDED: "reused_run_points", RESUME: None}.get(refused.kind, "scope_refused_points")
        if status is not None and field is not None:
            status[field] = status.get(field, 0) + n

    def bury(self, key: RunKey, last_finalized: int, attempt: int, *, closed: bool = True) -> None:
        """Remember where a closed run's steps were (under the registry lock); ``closed``: counted
        (a run found with nothing to replay on start was closed by the sink before)."""
        self.evicted += closed
        self._tombstones[key] = (last_finalized, attempt)
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    def exhume(self, key: RunKey) -> tuple[int, int] | None:
        """Where a run that opens again had its steps, if it closed before (under the registry lock)."""
        return self._tombstones.pop(key, None)

    def retire(self, key: RunKey) -> bool:
        """A closed run whose directory is to go: its tombstone and run book record put in the store
        (under the registry lock; durable with the next ``save``, before the directory goes). False
        when there is nothing to keep it by: no store, or it opened again meanwhile."""
        tombstone = self._tombstones.get(key)
        if self.store is None or tombstone is None:
            return False
        run = self._registry.runs.get(key)
        kept = {**run.record(), "attempt": run.attempt, "last_seen": run.last_seen} if run is not None else None
        self.store.put(RUNS, list(key), {"tombstone": list(tombstone), "run": kept})
        self.retired += 1
        return True

    def save(self) -> None:
        """Make what was kept since durable (one fsync); raises ``OSError`` when the disk refuses."""
        if self.store is not None:
            self.store.save()

    def restore(self) -> list[Run]:
        """On start: the tombstones and statuses the store kept, back; the runs it kept, for the run
        book (``RunBook.restore``). An entry that does not read as one is skipped."""
        if self.store is None:
            return []
        tables = self.store.load()
        runs = []
        with self._registry.lock:
            for key, value in tables[RUNS].items():
                found = _entry(key, value)
                if found is None:
                    continue
                self._tombstones[found[0]] = found[1]
                if found[2] is not None:
                    runs.append(found[2])
            for key, status in tables[STATUSES].items():
                if isinstance(key, tuple) and _key(key) and isinstance(status, dict):
                    self._statuses[(key[0], key[1])] = status
        return runs


def _key(key: Any) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and all(isinstance(part, str) for part in key)


def _entry(key: Any, value: Any) -> tuple[RunKey, tuple[int, int], Run | None] | None:
    """(key, tombstone, run) of an entry of the ``RUNS`` table; None when it is not one."""
    if not isinstance(key, tuple) or not _key(key) or not isinstance(value, dict):
        return None
    try:
        last_finalized, attempt = (int(v) for v in value["tombstone"])
        kept = value.get("run")
        run = None
        if isinstance(kept, dict) and (kept.get("experiment"), kept.get("run")) == key:
            seen = float(kept.get("last_seen", 0.0))
            run = Run.restored(kept, int(kept.get("attempt", 0)), seen if math.isfinite(seen) else 0.0)
    except (KeyError, TypeError, ValueError):
        return None
    return (key[0], key[1]), (last_finalized, attempt), run
