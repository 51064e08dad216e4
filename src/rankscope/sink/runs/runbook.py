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

Whose runs (``checked.Scope``): a run belongs to the scope of the token that created it
(``owner``, persisted with the run). Data, a goodbye, a higher attempt or a resume from another
scope is refused; ``resume=latest`` looks only at the scope's own runs, and never takes one
that is still sending (``sending``: data within ``live_window`` seconds and not every process
said goodbye): it starts a new run and says so. A resume whose attempt would pass
``MAX_ATTEMPT`` is refused.

A finished run (every process of its attempt said goodbye and every rank slot it declared was
held, ``roster.Roster.finished``, more than ``linger`` seconds ago: ``ended``) refuses every
later point of that attempt, whoever sends it: the same instance id, another rank, a later step
(``checked.ended_reason``). Only a higher attempt of its own scope (a restart, a requeue, a
resume) opens it again. Within ``linger`` the step book decides
(a process that starts late is taken, a second launch starting over is refused). A byte-identical
retry of a goodbye the run took (its digest is kept with the run, ``goodbyes``) is no later point:
it is answered as taken (``Retried``), whenever it comes, also after the run closed or the sink
restarted.

Pure bookkeeping: no I/O, wall clock injected. A run stays resumable for ``resume_window``
seconds after it was last seen; the book forgets a scope's oldest runs of an experiment past
``max_runs`` (views and logs are the sink's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core import names as attr
from ..checked import ended_reason

RunKey = tuple[str, str]
"""(experiment id, run id): one tenant of the sink. Data without a run id (a plain OTel client,
an older rankscope) has run ``""``: one run per experiment, as before runs."""

LATEST = "latest"
MAX_ATTEMPT = 2**31 - 1
MAX_LAUNCHES = 1000
"""Resuming launches a run keeps mapped (the oldest are forgotten: each is one restart of the run)."""
MAX_GOODBYES = 16
"""Digests of the goodbyes a run took that it keeps (the newest): their retries are answered as taken."""


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
    owner: str = ""
    """The name of the scope whose token created the run (``checked.Scope``): only it may write it."""
    ended: tuple[int, float] | None = None
    """(attempt, wall time) when every process of that attempt had said goodbye; None: not ended."""
    goodbyes: list[str] = field(default_factory=list)
    """Digests (hex) of the requests with a goodbye the run took, the newest ``MAX_GOODBYES``: a
    client's retry of one is answered as taken, also once the run has ended."""
    version: int = 0
    """Moves whenever the persisted record changes (a later record is never overwritten by an earlier one)."""

    def record(self) -> dict[str, Any]:
        """What the sink persists of the run (``Run.restored`` reads it back): a snapshot, taken
        under the registry's lock, that the sink writes after releasing it."""
        return {
            "experiment": self.experiment,
            "run": self.run,
            "started": self.started,
            "launches": dict(self.launches),
            "owner": self.owner,
            "ended": list(self.ended) if self.ended is not None else None,
            "goodbyes": list(self.goodbyes),
            "version": self.version,
        }

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
        owner = meta.get("owner")
        ended = meta.get("ended")
        said = meta.get("goodbyes")
        goodbyes = [d for d in said if _digest(d)][-MAX_GOODBYES:] if isinstance(said, list) else []
        return cls(
            experiment=str(meta["experiment"]),
            run=str(meta.get("run", "")),
            started=float(started) if isinstance(started, (int, float)) else last_seen,
            last_seen=last_seen,
            attempt=max(attempt, *launches.values()) if launches else attempt,
            launches=launches,
            owner=owner if isinstance(owner, str) else "",
            ended=_ended(ended),
            goodbyes=goodbyes,
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
    """A run whose persisted record changed (created, a launch mapped onto it, restarted after it ended)."""


SCOPE, ENDED, RESUME = "scope", "ended", "resume"


@dataclass(frozen=True, slots=True)
class Retried:
    """A byte-identical retry of a goodbye the run took: answered as taken, nothing taken again."""

    key: RunKey


@dataclass(frozen=True, slots=True)
class Refused:
    """Why one Resource's data is refused, and which run it was for (its status counts it)."""

    reason: str
    kind: str
    """``SCOPE`` (another scope's run or experiment), ``ENDED`` (a finished run) or ``RESUME``."""
    key: RunKey | None = None


class RunBook:
    """Every experiment's runs, in the order they started; resolves resumes."""

    def __init__(
        self,
        *,
        resume_window: float = 7 * 86400.0,
        max_runs: int = 1000,
        linger: float = 10.0,
        live_window: float = 60.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.resume_window = resume_window
        self.max_runs = max_runs
        self.linger = linger
        """Seconds after its last goodbye during which a run is not finished yet (the sink's grace)."""
        self.live_window = live_window
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
        self._trim(runs, run.owner)

    def restore(self, known: list[Run]) -> None:
        """Runs known from before a restart that left no log (retired: ``runs.closed``), in one go: a
        run the book has already (its log was found) stays as it is; then each experiment's runs are
        in the order they started, and each scope's oldest past ``max_runs`` forgotten (once per
        experiment and scope, not once per run)."""
        touched: set[str] = set()
        for run in known:
            runs = self._runs.setdefault(run.experiment, {})
            if run.run in runs:
                continue
            runs[run.run] = run
            for launch in run.launches:
                self._launches.setdefault((run.experiment, launch), run.run)
            touched.add(run.experiment)
        for experiment in touched:
            runs = self._runs[experiment] = {r.run: r for r in sorted(self._runs[experiment].values(), key=_started)}
            for owner in {r.owner for r in runs.values()}:
                self._trim(runs, owner)

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

    def resolve(
        self, experiment: str, resource: Mapping[str, Any], scope: str = "", digest: bytes = b""
    ) -> Resolved | Refused | Retried:
        """Where data with this (checked) Resource, sent with a token of ``scope`` (its name), goes,
        or why it is refused; ``Retried`` when its ``digest`` (``checked.ResourceBatch.digest``) is
        that of a goodbye the run took."""
        run_id = str(resource.get(attr.RUN_ID) or "")
        own = _attempt(resource)
        now = self.wall()
        resuming = bool(resource.get(attr.RUN_RESUME))
        mapped = self._launches.get((experiment, run_id))
        if mapped is not None:  # a process of a launch that resumed ``mapped``
            target = self._runs[experiment][mapped]
            return self._seen(target, target.launches[run_id] + own, now, scope, resuming, digest)
        known = self.get((experiment, run_id))
        if known is not None:
            return self._seen(known, own, now, scope, resuming, digest)
        resume = str(resource.get(attr.RUN_RESUME) or "") if run_id else ""  # run-less data resumes nothing
        if not resume or resume == run_id:
            return self._new(experiment, run_id, own, now, scope)
        return self._resume(experiment, run_id, resume, own, now, scope)

    def sending(self, run: Run, now: float) -> bool:
        """Whether ``run`` is still sending: data within ``live_window`` seconds, and not every
        process said goodbye. ``resume=latest`` never continues such a run."""
        return run.ended is None and now - run.last_seen < self.live_window

    def settle(self, key: RunKey, attempt: int, all_ended: bool, goodbye: bytes = b"") -> Run | None:
        """What the step book says of a run now: its ``attempt`` is over (every process said goodbye,
        every declared rank slot was held: it has ended), or a process came back or joined (it has
        not); ``goodbye``: the digest of a request with a goodbye that the run took. Returns the run
        when its record changed."""
        run = self.get(key)
        if run is None:
            return None
        changed = False
        if goodbye and goodbye.hex() not in run.goodbyes:
            run.goodbyes.append(goodbye.hex())
            del run.goodbyes[:-MAX_GOODBYES]
            changed = True
        if all_ended:
            if run.ended is None or run.ended[0] < attempt:
                run.ended = (attempt, self.wall())
                changed = True
        elif run.ended is not None and run.ended[0] == attempt:
            run.ended = None
            changed = True
        if not changed:
            return None
        run.version += 1
        return run

    def _resume(
        self, experiment: str, run_id: str, resume: str, own: int, now: float, scope: str
    ) -> Resolved | Refused | Retried:
        runs = self._runs.get(experiment, {})
        if resume == LATEST:
            fresh = [r for r in runs.values() if now - r.last_seen <= self.resume_window]
            ours = [r for r in fresh if r.owner == scope]
            if not ours and fresh:
                why = f"resume: the runs of experiment {experiment[:64]!r} are another token scope's; none to continue"
                return Refused(why, SCOPE)
            if not ours:
                found = self._new(experiment, run_id, own, now, scope)
                found.note = (
                    f"resume: experiment {experiment[:64]!r} has no run to continue; run {run_id[:64]!r} is new"
                )
                return found
            target = ours[-1]  # the one started (or resumed) last
            if self.sending(target, now):
                found = self._new(experiment, run_id, own, now, scope)
                found.note = (
                    f"resume: run {target.run[:64]!r} of experiment {experiment[:64]!r} is still sending (data "
                    f"within {self.live_window:g} s, not every process said goodbye); run {run_id[:64]!r} is new "
                    "(to continue a run that is still sending, name it: resume=RUN_ID)"
                )
                return found
        else:
            found_run = runs.get(resume)
            if found_run is None:
                return Refused(f"resume: experiment {experiment[:64]!r} has no run {resume[:64]!r}", RESUME)
            if found_run.owner != scope:
                return Refused(_foreign(found_run), SCOPE, (experiment, found_run.run))
            if now - found_run.last_seen > self.resume_window:
                why = f"resume: run {resume[:64]!r} was last seen over {self.resume_window:.0f}s ago (resume_window)"
                return Refused(why, RESUME)
            target = found_run
        base = target.attempt + 1
        if base + own > MAX_ATTEMPT:
            why = f"resume: run {target.run[:64]!r} is at attempt {target.attempt}; one more would pass {MAX_ATTEMPT}"
            return Refused(why, RESUME, (experiment, target.run))
        target.launches[run_id] = base
        while len(target.launches) > MAX_LAUNCHES:
            oldest = next(iter(target.launches))
            del target.launches[oldest]
            self._launches.pop((experiment, oldest), None)
        self._launches[(experiment, run_id)] = target.run
        runs.pop(target.run)  # the continued run is the experiment's latest again
        runs[target.run] = target
        resolved = self._seen(target, base + own, now, scope)
        if isinstance(resolved, Resolved):
            target.version += 1
            resolved.created = False
            resolved.note = f"run {target.run[:64]!r} resumed by launch {run_id[:64]!r} (attempt {base})"
            resolved.changed = target
        return resolved

    def _new(self, experiment: str, run_id: str, own: int, now: float, scope: str) -> Resolved:
        runs = self._runs.setdefault(experiment, {})
        run = runs[run_id] = Run(experiment, run_id, started=now, last_seen=now, attempt=own, owner=scope)
        self._trim(runs, scope)
        return Resolved((experiment, run_id), own, changed=run, created=True)

    def _seen(
        self, run: Run, attempt: int, now: float, scope: str, resuming: bool = False, digest: bytes = b""
    ) -> Resolved | Refused | Retried:
        key = (run.experiment, run.run)
        if run.owner != scope:
            return Refused(_foreign(run), SCOPE, key)
        if attempt > MAX_ATTEMPT:  # a resuming launch's base plus its own restarts
            return Refused(f"attempt {attempt} of run {run.run[:64]!r} is past {MAX_ATTEMPT}", RESUME, key)
        changed = None
        if run.ended is not None:
            if attempt <= run.ended[0]:
                if now - run.ended[1] >= self.linger:  # finished: every later point alike
                    if digest and digest.hex() in run.goodbyes:  # but what it took already, sent again
                        return Retried(key)
                    return Refused(ended_reason(run.run, resuming), ENDED, key)
            else:  # its own scope restarts it (torchelastic, a requeue): it is open again
                run.ended = None
                run.version += 1
                changed = run
        run.last_seen = now
        run.attempt = max(run.attempt, attempt)
        return Resolved(key, attempt, changed=changed)

    def _trim(self, runs: dict[str, Run], owner: str) -> None:
        """Forget ``owner``'s oldest runs of an experiment past ``max_runs``: a scope inventing run ids
        pushes out its own runs only, never another scope's (whose ids would then be free to take)."""
        ours = [r for r in runs.values() if r.owner == owner] if len(runs) > self.max_runs else []
        for oldest in ours[: max(0, len(ours) - self.max_runs)]:
            del runs[oldest.run]
            for launch in oldest.launches:
                self._launches.pop((oldest.experiment, launch), None)


def _attempt(resource: Mapping[str, Any]) -> int:
    try:
        return max(0, int(resource.get(attr.EXPERIMENT_ATTEMPT) or 0))
    except (TypeError, ValueError):
        return 0


def _foreign(run: Run) -> str:
    return (
        f"run {run.run[:64]!r} of experiment {run.experiment[:64]!r} belongs to another token scope: "
        "only the scope that created a run may send to it, resume it, restart it or end it"
    )


def _started(run: Run) -> float:
    return run.started


def _digest(found: Any) -> bool:
    """A persisted goodbye digest: 32 hex digits."""
    return isinstance(found, str) and _HEX32.fullmatch(found) is not None


_HEX32 = re.compile("[0-9a-f]{32}")


def _ended(found: Any) -> tuple[int, float] | None:
    """A persisted ``ended`` ([attempt, wall time]); anything else is taken as absent."""
    if isinstance(found, list) and len(found) == 2:
        attempt, at = found
        if isinstance(attempt, int) and not isinstance(attempt, bool) and isinstance(at, (int, float)):
            return (attempt, float(at))
    return None
