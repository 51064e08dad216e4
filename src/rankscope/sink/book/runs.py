"""Which run of its experiment a process's data belongs to: an experiment groups runs.

Each launch is a run (``rankscope.run.id`` on the Resource, ``core.identity.detect_run``), so
a second launch under a name already used gets its own steps: never merged into another
run's, never late. A restart within a run (torchelastic, a Slurm requeue) keeps the run id
and raises the attempt (``rankscope.experiment.attempt``): its steps replace the earlier ones.

A launch that *resumes* (``rankscope.run.resume``: ``latest`` or a run id) is its target
run's next attempt: the book maps the launch's own run id to the target and adds a base to
each process's attempt (the target's highest attempt so far, plus one), the same base for
every process of the launch. The map is kept with the target (``launches``; the sink
persists it in the run's write-ahead-log directory), so a sink restarted mid-launch maps the
launch the same way again.

Pure bookkeeping: no I/O, wall clock injected. A run stays resumable for ``resume_window``
seconds after it was last seen; the book forgets the oldest runs of an experiment past
``max_runs`` (views and logs are the sink's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core import names as attr

RunKey = tuple[str, str]
"""(experiment id, run id): one tenant of the sink. Data without a run id (a plain OTel client,
an older rankscope) has run ``""``: one run per experiment, as before runs."""

LATEST = "latest"
MAX_LAUNCHES = 1000
"""Resuming launches a run keeps mapped (the oldest are forgotten: each is one restart of the run)."""


@dataclass(slots=True)
class Run:
    """One run of an experiment, as the book knows it."""

    experiment: str
    run: str
    started: float
    """Wall-clock time the sink first saw the run."""
    last_seen: float
    attempt: int = 0
    """The highest attempt any of its processes reported (after the launch base)."""
    launches: dict[str, int] = field(default_factory=dict)
    """Launches that resumed this run: their own run id -> the base added to their attempts."""

    def record(self) -> dict[str, Any]:
        """What the sink persists of the run (``Run.restored`` reads it back)."""
        return {"experiment": self.experiment, "run": self.run, "started": self.started, "launches": self.launches}

    @classmethod
    def restored(cls, meta: Mapping[str, Any], attempt: int, last_seen: float) -> Run:
        """A run from its persisted record; a malformed field is taken as absent. Its attempt is at
        least every launch mapped onto it (one may have been mapped before a crash, unwritten)."""
        found = meta.get("launches")
        launches: dict[str, int] = {}
        if isinstance(found, dict):
            for k, v in list(found.items())[:MAX_LAUNCHES]:
                if isinstance(v, int) and not isinstance(v, bool):
                    launches[str(k)] = v
        started = meta.get("started")
        return cls(
            experiment=str(meta["experiment"]),
            run=str(meta.get("run", "")),
            started=float(started) if isinstance(started, (int, float)) else last_seen,
            last_seen=last_seen,
            attempt=max(attempt, *launches.values()) if launches else attempt,
            launches=launches,
        )


@dataclass(slots=True)
class Resolved:
    """Where one Resource's data goes: the run, the attempt its process counts as, and what the
    book learned that the sink should say (a resume that found nothing, a launch it mapped)."""

    key: RunKey
    attempt: int
    note: str | None = None
    created: bool = False
    """The run is new to the book (the sink forgets it again if it cannot take it)."""
    changed: Run | None = None
    """A run whose persisted record changed (a launch was mapped onto it)."""


class RunBook:
    """Every experiment's runs, in the order they started; resolves resumes."""

    def __init__(
        self, *, resume_window: float = 7 * 86400.0, max_runs: int = 1000, wall: Callable[[], float] = time.time
    ) -> None:
        self.resume_window = resume_window
        self.max_runs = max_runs
        self.wall = wall
        self._runs: dict[str, dict[str, Run]] = {}
        """Experiment -> run id -> run, oldest first (dicts keep insertion order)."""
        self._launches: dict[RunKey, str] = {}
        """(experiment, a resuming launch's own run id) -> the run it continues."""

    def add(self, run: Run) -> None:
        """A run known from before (a restarted sink's write-ahead log)."""
        runs = self._runs.setdefault(run.experiment, {})
        runs[run.run] = run
        for launch in run.launches:
            self._launches[(run.experiment, launch)] = run.run
        self._trim(runs)

    def forget(self, key: RunKey) -> None:
        """Drop a run the sink did not take after all (refused past its limits)."""
        runs = self._runs.get(key[0], {})
        run = runs.pop(key[1], None)
        if run is not None:
            for launch in run.launches:
                self._launches.pop((key[0], launch), None)
        if not runs:
            self._runs.pop(key[0], None)

    def runs(self, experiment: str) -> list[Run]:
        """The experiment's runs, oldest first."""
        return list(self._runs.get(experiment, {}).values())

    def latest(self, experiment: str) -> str | None:
        runs = self._runs.get(experiment)
        return next(reversed(runs)) if runs else None

    def target(self, experiment: str, run: str) -> str:
        """The run ``run`` stands for: the run it resumed when it is a resuming launch, else itself."""
        return self._launches.get((experiment, run), run)

    def get(self, key: RunKey) -> Run | None:
        return self._runs.get(key[0], {}).get(key[1])

    def resolve(self, experiment: str, resource: Mapping[str, Any]) -> Resolved | str:
        """Where data with this (checked) Resource goes, or why it is refused."""
        run_id = str(resource.get(attr.RUN_ID) or "")
        own = _attempt(resource)
        now = self.wall()
        mapped = self._launches.get((experiment, run_id))
        if mapped is not None:  # a process of a launch that resumed ``mapped``
            target = self._runs[experiment][mapped]
            return self._seen(target, target.launches[run_id] + own, now)
        known = self.get((experiment, run_id))
        if known is not None:
            return self._seen(known, own, now)
        resume = str(resource.get(attr.RUN_RESUME) or "") if run_id else ""  # run-less data resumes nothing
        if not resume or resume == run_id:
            return self._new(experiment, run_id, own, now)
        return self._resume(experiment, run_id, resume, own, now)

    def _resume(self, experiment: str, run_id: str, resume: str, own: int, now: float) -> Resolved | str:
        runs = self._runs.get(experiment, {})
        if resume == LATEST:
            fresh = [r for r in runs.values() if now - r.last_seen <= self.resume_window]
            if not fresh:
                found = self._new(experiment, run_id, own, now)
                found.note = (
                    f"resume: experiment {experiment[:64]!r} has no run to continue; run {run_id[:64]!r} is new"
                )
                return found
            target = fresh[-1]  # the one started (or resumed) last
        else:
            found_run = runs.get(resume)
            if found_run is None:
                return f"resume: experiment {experiment[:64]!r} has no run {resume[:64]!r}"
            if now - found_run.last_seen > self.resume_window:
                return f"resume: run {resume[:64]!r} was last seen over {self.resume_window:.0f}s ago (resume_window)"
            target = found_run
        base = target.attempt + 1
        target.launches[run_id] = base
        while len(target.launches) > MAX_LAUNCHES:
            oldest = next(iter(target.launches))
            del target.launches[oldest]
            self._launches.pop((experiment, oldest), None)
        self._launches[(experiment, run_id)] = target.run
        runs.pop(target.run)  # the continued run is the experiment's latest again
        runs[target.run] = target
        resolved = self._seen(target, base + own, now)
        resolved.created = False
        resolved.note = f"run {target.run[:64]!r} resumed by launch {run_id[:64]!r} (attempt {base})"
        resolved.changed = target
        return resolved

    def _new(self, experiment: str, run_id: str, own: int, now: float) -> Resolved:
        runs = self._runs.setdefault(experiment, {})
        run = runs[run_id] = Run(experiment, run_id, started=now, last_seen=now, attempt=own)
        self._trim(runs)
        return Resolved((experiment, run_id), own, changed=run, created=True)

    def _seen(self, run: Run, attempt: int, now: float) -> Resolved:
        run.last_seen = now
        run.attempt = max(run.attempt, attempt)
        return Resolved((run.experiment, run.run), attempt)

    def _trim(self, runs: dict[str, Run]) -> None:
        while len(runs) > self.max_runs:
            oldest = runs.pop(next(iter(runs)))
            for launch in oldest.launches:
                self._launches.pop((oldest.experiment, launch), None)


def _attempt(resource: Mapping[str, Any]) -> int:
    try:
        return max(0, int(resource.get(attr.EXPERIMENT_ATTEMPT) or 0))
    except (TypeError, ValueError):
        return 0
