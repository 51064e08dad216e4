"""The sink's run registry: one ``Tenant`` per open run of an experiment, and which run data goes to.

``Tenants`` resolves each Resource to its run (``book.runs``: a launch is a run, a resuming
launch continues its run), opens a run's tenant on its first data (its step book, its
write-ahead log, its capture book) or reopens it where an eviction or a crash left it
(``durable.replay``), opens its views on first use, keeps the view configs the experiments'
processes post, and evicts a run idle for ``idle_timeout``. Its lock guards the registry only
and is never held while a run merges; each tenant's own lock guards that run.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from ..backends.base import LoggerBackend, get_backend_class
from ..core import names as attr
from ..core.paths import safe_component
from .book.experiment import Experiment
from .book.runs import Run, RunBook, RunKey
from .book.traces import SpanFile, TraceStore
from .checked import Refusals, ResourceBatch
from .config import DEFAULT_BACKENDS, SinkConfig
from .durable.replay import replay
from .durable.wal import ExperimentLog, WriteAheadLog
from .edge.ports import LOCAL, Client
from .edge.validate import check_posted_views, root_posted_views
from .views.captures import CaptureBook
from .views.writer import ViewPool, ViewWriter

log = logging.getLogger("rankscope.sink")

OnError = Callable[[str, BaseException], None]

RECENT_STEPS = 64
"""Finalized steps a run keeps for people watching live (``/rankscope/v1/recent``)."""


class Tenant:
    """One run of an experiment at the sink: its state, its views, its log, and the lock that guards them."""

    def __init__(
        self, experiment: Experiment, log: ExperimentLog | None, captures: CaptureBook, on_error: OnError
    ) -> None:
        self.experiment = experiment
        self.log = log
        self.captures = captures
        """Profiler captures asked of the run's processes (``views.captures``)."""
        self.lock = threading.Lock()
        self.writer: ViewWriter | None = None
        self.dirty = False
        self.errors = 0
        self.last_error: str | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_STEPS)
        """The last finalized steps, for people watching live (``/rankscope/v1/recent``)."""
        self._on_error = on_error

    @property
    def key(self) -> RunKey:
        return (self.experiment.id, self.experiment.run)

    @property
    def name(self) -> str:
        """How logs name the run (``Experiment.name``)."""
        return self.experiment.name

    def failed(self, where: str, exc: BaseException) -> None:
        """A failure inside this run: counted in its status, logged once (then every 1000th)."""
        self.errors += 1
        self.last_error = f"{where}: {type(exc).__name__}: {exc}"[:500]
        if self.errors == 1 or self.errors % 1000 == 0:
            self._on_error(f"{self.experiment.name[:96]}: {where}", exc)

    def replayed(self, batch: ResourceBatch, refused: Refusals, seq: int) -> None:
        """A record of the run's write-ahead log merged again (``durable.replay``)."""
        self.experiment.apply(batch, refused, seq=seq, replayed=True)
        self.experiment.remember(batch.digest)


class Tenants:
    """Every open run of every experiment, and the run book that says which run data belongs to."""

    def __init__(
        self,
        config: SinkConfig,
        clock: Callable[[], float],
        wal: WriteAheadLog | None,
        on_error: OnError,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wal = wal
        self.on_error = on_error
        self.open: dict[RunKey, Tenant] = {}
        self.runs = RunBook(resume_window=config.resume_window, max_runs=config.max_runs)
        self.run_notes: deque[str] = deque(maxlen=20)
        """What the run book said lately (resumes mapped, resumes that found nothing): the status route."""
        self.posted_backends: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        self.evicted = 0
        self.views: ViewPool | None = None
        """The threads that write every run's views; the sink starts them (``Sink.start``)."""
        self.lock = threading.Lock()  # the registry only; never held while merging
        self._gantt_backends: dict[str, bool] = {}
        self._tombstones: OrderedDict[RunKey, tuple[int, int]] = OrderedDict()

    @property
    def experiments(self) -> dict[str, Experiment]:
        """Each experiment's latest open run."""
        with self.lock:
            return {k[0]: t.experiment for k, t in sorted(self.open.items(), key=lambda kv: kv[1].experiment.started)}

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
                if process_id in tenant.experiment.processes:
                    return tenant
        return None

    def resolve(
        self, experiment_id: str, resource: dict[str, Any], refused: Refusals, n: int, client: Client = LOCAL
    ) -> Tenant | None:
        """The tenant of the run this Resource's data belongs to (``runs``), created (or reopened) on
        first data; None when its resume is refused or past ``max_experiments``. The Resource is
        rewritten to the run and attempt it counts as, so the write-ahead log holds them."""
        with self.lock:
            resolved = self.runs.resolve(experiment_id, resource)
            if isinstance(resolved, str):
                refused.add(n, resolved)
                self.note(resolved)
                return None
            key = resolved.key
            resource[attr.RUN_ID] = key[1]
            resource[attr.EXPERIMENT_ATTEMPT] = resolved.attempt
            tenant = self.open.get(key)
            if tenant is None:
                full = self._full(experiment_id)
                if full is not None:
                    if resolved.created:
                        self.runs.forget(key)
                    refused.add(n, full)
                    return None
                try:
                    tenant = self._new(key)
                except OSError as exc:  # its write-ahead log cannot be opened (disk full, permissions)
                    if resolved.created:
                        self.runs.forget(key)
                    log.error("rankscope sink: run %r of %r not opened: %r", key[1][:64], experiment_id[:64], exc)
                    refused.add(n, "the sink cannot open this run's write-ahead log (see the sink's log)")
                    return None
                self.open[key] = tenant
            if resolved.note is not None:
                self.note(resolved.note)
            record = resolved.changed.record() if resolved.changed is not None else None
        if record is not None and tenant.log is not None:  # outside the registry lock: it fsyncs
            tenant.log.save_meta(record)
        return tenant

    def _full(self, experiment_id: str) -> str | None:
        """Why another run of ``experiment_id`` may not open now, or None (under the registry lock)."""
        c = self.config
        if len(self.open) >= c.max_experiments:
            return f"the sink holds {c.max_experiments} runs (limit)"
        runs = [t for (e, _), t in self.open.items() if e == experiment_id]
        if len(runs) >= c.max_open_runs and sum(not t.experiment.roster.all_ended for t in runs) >= c.max_open_runs:
            return f"this experiment has {c.max_open_runs} runs open (limit; idle ones close in {c.idle_timeout:g} s)"
        return None

    def note(self, note: str) -> None:
        """A run-book event worth a line: logged and kept for the status route."""
        if note not in self.run_notes:
            log.warning("rankscope sink: %s", note)
            self.run_notes.append(note)

    def _new(self, key: RunKey) -> Tenant:
        experiment_id, run = key
        c = self.config
        experiment = Experiment(
            experiment_id,
            run=run,
            grace=c.grace,
            retain_steps=c.retain_steps,
            late_interval=c.late_interval,
            step_window=c.limits.step_window,
            limits=c.experiment_limits,
            time_bucket=c.time_bucket,
            time_bucket_lag=c.time_bucket_lag,
            traces=TraceStore(retain_steps=c.trace_retain_steps, max_spans=c.max_spans, file=self._span_file(key)),
            detectors=c.detectors,
            on_error=self.on_error,
            clock=self.clock,
        )
        experiment.keep_spans = self._draws_gantt(experiment_id)
        run_log = self.wal.open(experiment_id, run) if self.wal is not None else None
        if run_log is not None:
            experiment.restore(run_log.last_finalized, run_log.attempt)
        elif key in self._tombstones:  # evicted before: steps go on where they were
            experiment.restore(*self._tombstones.pop(key))
        return Tenant(experiment, run_log, CaptureBook(self.clock, auto_interval=c.capture_interval), self.on_error)

    def _reopen(self, meta: dict[str, Any], attempt: int, seen: float) -> Tenant:
        """A run found in the write-ahead log, back in the run book, with a fresh tenant to replay into."""
        run = Run.restored(meta, attempt, seen)
        self.runs.add(run)
        return self._new((run.experiment, run.run))

    def replay(self) -> None:
        """Re-merge every record the views had not written when the last sink stopped or died."""
        assert self.wal is not None
        for tenant in replay(self.wal, self._reopen, self.note):
            tenant.dirty = True
            self.open[tenant.key] = tenant

    def _draws_gantt(self, experiment_id: str) -> bool:
        """Whether the views this experiment will get include one that draws a Gantt (the report):
        then its step views carry their spans, from the first step."""
        if self.config.report:
            return True
        config = self.config.backends or self.posted_backends.get(experiment_id) or DEFAULT_BACKENDS
        return any(self._gantt_backend(str(options.get("backend", name))) for name, options in config.items())

    def _gantt_backend(self, name: str) -> bool:
        """Whether backend ``name`` draws a Gantt (cached: looking it up may scan entry points)."""
        found = self._gantt_backends.get(name)
        if found is None:
            try:
                found = get_backend_class(name).report is not LoggerBackend.report
            except Exception:  # unknown or broken: ViewWriter names it when it opens the views
                found = False
            if len(self._gantt_backends) < 256:
                self._gantt_backends[name] = found
        return found

    def _span_file(self, key: RunKey) -> SpanFile | None:
        if self.config.spans_dir is None:
            return None
        directory = self.config.spans_dir / safe_component(key[0])
        if key[1]:  # a run id never meets the run-less run's files
            directory = directory / "runs" / safe_component(key[1])
        return SpanFile(directory / "spans.jsonl", self.config.max_span_file_bytes)

    def writer(self, tenant: Tenant) -> ViewWriter:
        """The tenant's views, opened on first use. Caller holds ``tenant.lock``."""
        if tenant.writer is None:
            experiment_id = tenant.experiment.id
            config = self.config.backends or self.posted_backends.get(experiment_id) or DEFAULT_BACKENDS
            if self.config.report and not any(str(v.get("backend", k)) == "report" for k, v in config.items()):
                config = {**config, "report": {"logging_mode": "global_reduce"}}
            if self.views is None:
                raise RuntimeError("the sink's views run once it is started (Sink.start)")
            on_written = tenant.log.written_view if tenant.log is not None else None
            tenant.writer = ViewWriter(
                experiment_id, config, self.on_error, self.views, on_written=on_written, run=tenant.experiment.run
            )
            tenant.experiment.keep_spans = any(
                type(v.backend).report is not LoggerBackend.report for v in tenant.writer.views
            )
        return tenant.writer

    def evict(self, tenant: Tenant) -> bool:
        """Take an idle run out of the registry (its steps go on where they were if it comes back);
        False if it is not idle any more. The caller closes its views and log."""
        with self.lock, tenant.lock:
            if not tenant.experiment.idle(self.clock(), self.config.idle_timeout) or tenant.dirty:
                return False
            del self.open[tenant.key]
            self.evicted += 1
            self._tombstones[tenant.key] = (tenant.experiment.last_finalized, tenant.experiment.attempt)
            while len(self._tombstones) > 100_000:
                self._tombstones.popitem(last=False)
        return True

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str:
        """An experiment's processes say which views they want (used when the sink has none)."""
        if self.config.backends is not None:
            return "ignored: this sink's views are fixed by its configuration"
        if not self.config.trust_posted_paths:
            why = check_posted_views(backends)
            if why is not None:
                return f"refused: {why}"
            backends = root_posted_views(experiment_id, backends)
        with self.lock:
            known = self.posted_backends.get(experiment_id)
            tenants = [t for k, t in self.open.items() if k[0] == experiment_id]
            if known is None and all(t.writer is None for t in tenants):
                if len(self.posted_backends) >= self.config.max_experiments and not self._forget_a_config():
                    return "ignored: this sink holds too many experiments"
                self.posted_backends[experiment_id] = {k: dict(v) for k, v in backends.items()}
                for tenant in tenants:
                    with tenant.lock:  # the views open under it: the flag and the views agree
                        if tenant.writer is None:
                            tenant.experiment.keep_spans = self._draws_gantt(experiment_id)
                return "ok"
            if known == backends:
                return "ok"
            return "ignored: this experiment's views are already configured"

    def _forget_a_config(self) -> bool:
        """Make room for a posted config: the oldest one of an experiment with no run open goes
        (configs of experiments never seen again must not fill the sink for its lifetime)."""
        open_experiments = {e for e, _ in self.open}
        for experiment_id in self.posted_backends:
            if experiment_id not in open_experiments:
                del self.posted_backends[experiment_id]
                return True
        return False
