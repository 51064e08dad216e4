"""The open runs of every experiment (``Tenants``), and the run book that says which run data belongs to.

The registry is a lookup: which runs are open, by run and by process, and the books every part of
a run's life shares (``runbook``: which run a launch is; ``quotas``: who opened which; the
descriptor and disk budgets). Opening a run is ``opening``'s job, closing it ``closing``'s, its views
``view_configs``'. Its lock guards the registry only and is never held while a run merges; each
tenant's own lock guards that run.
"""

from __future__ import annotations

import threading

from ..book.step_book import StepBook
from ..config import SinkConfig
from ..durable.descriptors import Descriptors
from ..tally import Notes
from .disk import DiskBudget
from .quotas import Quotas
from .runbook import RunBook, RunKey
from .tenant import Tenant


class Tenants:
    """Every open run of every experiment, by run."""

    def __init__(self, config: SinkConfig, descriptors: Descriptors) -> None:
        self.open: dict[RunKey, Tenant] = {}
        self.lock = threading.Lock()  # the registry only; never held while merging
        self.runs = RunBook(
            resume_window=config.resume_window,
            max_runs=config.max_runs,
            linger=config.book.grace,
            live_window=config.live_window,
        )
        self.quotas = Quotas(config.runs)
        """Who may open another run, and which run makes room (``quotas``)."""
        self.descriptors = descriptors
        """The runs' share of the process's file descriptors (``durable.descriptors``)."""
        self.disk = DiskBudget(config.disk)
        """What each client's runs' views may write, and the floor of free disk (``disk``)."""
        self.notes = Notes()
        """What the run book said (resumes mapped, resumes refused, logs set aside): one entry per
        kind, each kind logged at most once per ``tally.NOTE_INTERVAL`` (the status route's ``run_notes``)."""

    @property
    def experiments(self) -> dict[str, StepBook]:
        """Each experiment's latest open run."""
        with self.lock:
            return {k[0]: t.book for k, t in sorted(self.open.items(), key=lambda kv: kv[1].book.started)}

    def all(self, experiment_id: str | None = None) -> list[Tenant]:
        """The open runs (of ``experiment_id``), as they are now."""
        with self.lock:
            return [t for k, t in self.open.items() if experiment_id is None or k[0] == experiment_id]

    def find(self, experiment_id: str, run: str | None = None) -> Tenant | None:
        """The open tenant of a run; run None: the experiment's latest open run."""
        with self.lock:
            if run is None:
                open_runs = [r.run for r in self.runs.runs(experiment_id) if (experiment_id, r.run) in self.open]
                if not open_runs:
                    return None
                run = open_runs[-1]
            return self.open.get((experiment_id, self.runs.target(experiment_id, run)))

    def of_process(self, experiment_id: str, process_id: str) -> Tenant | None:
        """The open run of an experiment that holds this process (processes poll by their own id)."""
        for tenant in reversed(self.all(experiment_id)):
            with tenant.lock:
                if process_id in tenant.book.roster.processes:
                    return tenant
        return None

    def add(self, tenant: Tenant) -> None:
        """A run opened (or reopened): in the registry, counted for its client (under the lock)."""
        self.open[tenant.key] = tenant
        self.quotas.touched(tenant.key, tenant.client)

    def remove(self, key: RunKey) -> None:
        """A run closed: out of the registry and its client's count (under the lock)."""
        del self.open[key]
        self.quotas.closed(key)

    def note(self, note: str, owner: str = "") -> None:
        """A run-book event worth a line: logged (at most once per interval per kind) and kept for the
        status route, as ``owner``'s (the name of the scope whose request it is about: ``tally.Notes``)."""
        self.notes.add(note, owner)

    def hold(self, tenant: Tenant) -> bool:
        """The run is about to use its descriptors (``Descriptors.hold``); False: the sink has none
        to spare (every run holding some is in use)."""
        return self.descriptors.hold(tenant, tenant.need)

    def release(self, tenant: Tenant) -> bool:
        """A quiet run gives its descriptors back: its files now (if not in use), its views after
        what they have queued."""
        if tenant.writer is not None and self.descriptors.holds(tenant.writer):
            tenant.writer.request_release()
        return self.descriptors.let_go(tenant)
