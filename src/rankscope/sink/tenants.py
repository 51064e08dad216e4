"""The sink's run registry: one ``Tenant`` per open run of an experiment, and which run data goes to.

``Tenants`` resolves each Resource to its run (``book.runs``: a launch is a run, a resuming
launch continues its run), opens a run's tenant on its first data (its step book, its
write-ahead log, its capture book) or reopens it where an eviction or a crash left it
(``durable.replay``), opens its views on first use, keeps the view configs the experiments'
processes post, and closes runs: those the upkeep says are done (``upkeep``: ended, idle) and
those admission chose to make room (``quotas``). A closed run's tenant is out of the registry
at once, its views and log are closed after (``finish_closing``; a reopening of the same run
closes them first); the run book, a tombstone (where its steps go on) and its last status remember
it. Its lock guards the registry only and is never held while a run merges; each tenant's own
lock guards that run.

A run's file descriptors (``durable.descriptors``) are held by its tenant (its log's segment,
its span file: ``hold`` before they are used) and by its view writer (its views' files, held as
they open): each lets go when the run goes quiet or another run needs them, and opens again on
next use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from ..backends.base import LoggerBackend, get_backend_class
from ..core import names as attr
from ..core.paths import safe_component
from .book.experiment import Experiment
from .book.runs import ENDED, RESUME, Refused, Resolved, Run, RunBook, RunKey
from .book.traces import SpanFile, TraceStore
from .checked import Refusals, ResourceBatch
from .config import DEFAULT_BACKENDS, SinkConfig
from .durable.descriptors import Descriptors, Plan, nofile_limit, out_of_descriptors
from .durable.replay import replay
from .durable.wal import ExperimentLog, WriteAheadLog
from .edge.ports import LOCAL, Client
from .edge.validate import check_posted_views, root_posted_views
from .quotas import Quotas
from .tally import Notes, Tally
from .views.captures import CaptureBook
from .views.writer import ViewPool, ViewWriter

log = logging.getLogger("rankscope.sink")

OnError = Callable[[str, BaseException], None]

RECENT_STEPS = 64
"""Finalized steps a run keeps for people watching live (``/rankscope/v1/recent``)."""
CLOSED_STATUSES = 1000
"""Closed runs whose last status the status route still answers (the most recently closed)."""
TOMBSTONES = 100_000
"""Closed runs whose last step is remembered, so their steps go on where they were on new data."""


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
        self.meta_lock = threading.Lock()
        self.meta_version = -1
        """The run record's version last saved (``Tenants.save_meta``): an older one is never written over it."""
        self.client = ""
        """The client that opened it (``edge.ports.Client.quota_key``): whose quota it counts against."""
        self.need = 0
        """File descriptors its files hold while it takes data: its log's segment, its span file."""
        self.releases = 0
        """Times it gave its descriptors back (quiet, or another run needed them)."""
        self.closed = False
        """Out of the registry: a request that finds it so resolves its run again."""
        self.closing_deadline = 0.0
        """When its log closes even if its views have not finished (``Tenants.finish_closing``)."""
        self._on_error = on_error

    @property
    def key(self) -> RunKey:
        return (self.experiment.id, self.experiment.run)

    @property
    def name(self) -> str:
        """How logs name the run (``Experiment.name``)."""
        return self.experiment.name

    @property
    def ended(self) -> bool:
        """The run's current attempt is over: every process of it said goodbye and every rank slot it
        declared was held (``Roster.finished``; a rank that never reported may still come, late)."""
        return self.experiment.roster.finished

    @property
    def closable(self) -> bool:
        """It may close without losing anything: every step it took finalized and handed to its
        views (which write them before they close, and its log closes after them)."""
        return not self.dirty and self.experiment.settled

    def release(self) -> bool:
        """Close the run's files now: its log's segment, its span file (its views are a holder of
        their own, ``views.writer.ViewWriter``); each opens again on next use. Never waits for a
        lock: False when the run is in use (``durable.descriptors.Holder``)."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.closed:
                return True
            if self.log is not None and not self.log.release():
                return False
            if self.experiment.traces.file is not None:
                self.experiment.traces.file.release()
            self.releases += 1
            return True
        finally:
            self.lock.release()

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
        *,
        tally: Tally | None = None,
        descriptors: Descriptors | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wal = wal
        self.on_error = on_error
        self.tally = tally if tally is not None else Tally()
        """The sink-wide counts: what every run's views dropped goes there (``Tally.view_drop``)."""
        self.open: dict[RunKey, Tenant] = {}
        self.runs = RunBook(
            resume_window=config.resume_window,
            max_runs=config.max_runs,
            linger=config.grace,
            live_window=config.live_window,
        )
        self.notes = Notes()
        """What the run book said (resumes mapped, resumes refused, logs set aside): one entry per
        kind, each kind logged at most once per ``tally.NOTE_INTERVAL`` (the status route's ``run_notes``)."""
        self.posted_backends: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        self.evicted = 0
        """Runs closed (ended, idle, or to make room), all told."""
        self.views: ViewPool | None = None
        """The threads that write every run's views; the sink starts them (``Sink.start``)."""
        self.descriptors = descriptors or Descriptors(Plan.of(nofile_limit(), None, view_workers=config.view_workers))
        """The runs' share of the process's file descriptors (``durable.descriptors``)."""
        self.quotas = Quotas(config.runs)
        """Who may open another run, and which run makes room (``quotas``)."""
        self.final_status: Callable[[Tenant], dict[str, Any]] | None = None
        """A closing run's status (``Queries.status_of``): its report page's last, and what the
        status route answers for it once closed."""
        self.closed_status: OrderedDict[RunKey, dict[str, Any]] = OrderedDict()
        self.lock = threading.Lock()  # the registry only; never held while merging
        self._gantt_backends: dict[str, bool] = {}
        self._tombstones: OrderedDict[RunKey, tuple[int, int]] = OrderedDict()
        self._closing: list[Tenant] = []
        """Runs out of the registry whose views and log are not closed yet (``finish_closing``)."""
        self._closing_now: dict[RunKey, Tenant] = {}
        """The same, and those being closed, by run: a reopening closes them first."""
        self._to_close = threading.Event()

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
        first data; None when it is refused: an experiment outside the ``client``'s scope, another
        scope's run, a finished run, a resume refused, past a bound on runs (``quotas``). The Resource is
        rewritten to the run and attempt it counts as, so the write-ahead log holds them."""
        scope = client.scope
        if not scope.allows(experiment_id):
            refused.add(n, f"experiment {experiment_id[:64]!r} is not among those of this token's {scope.label}")
            return None
        with self.lock:  # one section: the run resolved is the run opened
            resolved = self.runs.resolve(experiment_id, resource, scope.name)
            if isinstance(resolved, Refused):
                counted = self._refused(resolved, refused, n)
            else:
                taken = self._open_run(experiment_id, resource, resolved, refused, n, client)
        if isinstance(resolved, Refused):
            if counted is not None:  # in the run's own status: whose data it refused, and why
                with counted.lock:
                    if resolved.kind == ENDED:
                        counted.experiment.counts.reused_points += n
                    elif resolved.kind != RESUME:
                        counted.experiment.counts.scope_refused += n
            return None
        tenant, record = taken
        if tenant is not None and record is not None:  # outside the registry lock: it fsyncs
            self.save_meta(tenant, record)
        return tenant

    def _refused(self, resolved: Refused, refused: Refusals, n: int) -> Tenant | None:
        """A refusal of the run book, answered and noted (under the registry lock); the open run
        whose status counts it, if any."""
        refused.add(n, resolved.reason)
        if resolved.kind == RESUME:
            self.note(resolved.reason)
        counted = self.open.get(resolved.key) if resolved.key is not None else None
        self._count_closed(resolved, n, counted)  # a closed run's last status counts it too
        return counted

    def _open_run(
        self, experiment: str, resource: dict[str, Any], resolved: Resolved, refused: Refusals, n: int, client: Client
    ) -> tuple[Tenant | None, dict[str, Any] | None]:
        """The tenant of a run the book resolved, opened on first data, and the run's record to
        save when it changed (under the registry lock)."""
        key = resolved.key
        resource[attr.RUN_ID] = key[1]
        resource[attr.EXPERIMENT_ATTEMPT] = resolved.attempt
        tenant = self.open.get(key)
        if tenant is None:
            full = self._admit(experiment, client.quota_key)
            if full is not None:
                if resolved.created:
                    self.runs.forget(key)
                refused.add(n, full)
                return None, None
            try:
                tenant = self._new(key, client.quota_key)
            except OSError as exc:  # its write-ahead log cannot be opened (disk full, permissions)
                if resolved.created:
                    self.runs.forget(key)
                refused.add(n, self._open_failed(key, exc))
                return None, None
            self.open[key] = tenant
        self.quotas.touched(key, tenant.client)
        if resolved.note is not None:
            self.note(resolved.note)
        return tenant, resolved.changed.record() if resolved.changed is not None else None

    def settle(self, tenant: Tenant, ended: bool, attempt: int) -> None:
        """Tell the run book what the run's step book says after a request (``RunBook.settle``):
        its ``attempt`` is over (``ended``: ``Roster.finished``), or not any more. Written with the
        run's record, without an fsync (a flood of runs that end costs none per goodbye): a finished
        run stays finished across its closing and the sink's crash or restart, not the machine's."""
        run = self.runs.get(tenant.key)  # a look without the lock; any change is made under it
        if run is None:
            return
        if ended:
            if run.ended is not None and run.ended[0] >= attempt:
                return  # known
        elif run.ended is None or run.ended[0] != attempt:
            return  # nothing to take back
        with self.lock:
            changed = self.runs.settle(tenant.key, attempt, ended)
            record = changed.record() if changed is not None else None
        if record is not None:
            self.save_meta(tenant, record, sync=False)

    def save_meta(self, tenant: Tenant, record: dict[str, Any], *, sync: bool = True) -> None:
        """Persist a run's record (a snapshot ``Run.record`` took under the registry lock) outside
        that lock, since it fsyncs; a record older than the one saved already is not written."""
        if tenant.log is None:
            return
        with tenant.meta_lock:
            if record["version"] < tenant.meta_version:
                return
            tenant.meta_version = record["version"]
            tenant.log.save_meta(record, sync=sync)

    def _admit(self, experiment_id: str, client: str) -> str | None:
        """Why another run of ``experiment_id`` from ``client`` may not open now, or None once the
        runs admission chose to make room are out of the registry (``quotas``; under the registry
        lock). A run chosen that is in use by now is passed over (three tries)."""
        busy: frozenset[RunKey] = frozenset()
        for _ in range(3):
            admission = self.quotas.admit(experiment_id, client, self.open, busy)
            if admission.refused is not None:
                return admission.refused
            retired = [key for key in admission.victims if self._retire(self.open[key])]
            self.quotas.made(len(retired))
            if len(retired) == len(admission.victims):
                return None
            busy |= frozenset(key for key in admission.victims if key in self.open)
        return f"the sink holds {len(self.open)} runs open and those that could make room are in use (limit); retry"

    def _open_failed(self, key: RunKey, exc: OSError) -> str:
        """Why a run whose write-ahead log could not be opened is refused (logged: see the sink's log)."""
        if out_of_descriptors(exc):  # counted and logged now and then, not once per request
            self.descriptors.exhausted("open", exc)
            return "the sink is out of file descriptors; retry"
        log.error("rankscope sink: run %r of %r not opened: %r", key[1][:64], key[0][:64], exc)
        return "the sink cannot open this run's write-ahead log (see the sink's log)"

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

    def note(self, note: str) -> None:
        """A run-book event worth a line: logged (at most once per interval per kind) and kept for the status route."""
        self.notes.add(note)

    def _new(self, key: RunKey, client: str = "") -> Tenant:
        """A fresh tenant for a run (under the registry lock); a closing of the same run finishes first."""
        experiment_id, run = key
        closing = self._closing_now.pop(key, None)
        if closing is not None:  # data came back for a run being closed: its files close first, here
            # (not waiting for the closer: it may be waiting for the registry's lock, held here)
            if closing in self._closing:
                self._closing.remove(closing)
                self._close_views(closing, final=False)  # its status would need the registry's lock
            if closing.writer is not None:  # a moment for its views, not their whole finish
                closing.writer.join(1.0)
            self._close_log(closing)
        c = self.config
        experiment = Experiment(
            experiment_id,
            run=run,
            grace=c.grace,
            start_hold=c.start_hold,
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
        elif key in self._tombstones:  # closed before: steps go on where they were
            experiment.restore(*self._tombstones.pop(key))
        tenant = Tenant(experiment, run_log, CaptureBook(self.clock, auto_interval=c.capture_interval), self.on_error)
        tenant.client = client
        tenant.need = (run_log is not None) + (experiment.traces.file is not None)
        return tenant

    def _views_config(self, experiment_id: str) -> Mapping[str, Mapping[str, Any]]:
        """The views an experiment gets: the sink's, else the ones its processes posted, else the
        console; with the report view when the sink adds it to every experiment."""
        config = self.config.backends or self.posted_backends.get(experiment_id) or DEFAULT_BACKENDS
        if self.config.report and not any(str(v.get("backend", k)) == "report" for k, v in config.items()):
            config = {**config, "report": {"logging_mode": "global_reduce"}}
        return config

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
            self.quotas.touched(tenant.key, tenant.client)

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
            config = self._views_config(experiment_id)
            if self.views is None:
                raise RuntimeError("the sink's views run once it is started (Sink.start)")
            on_written = tenant.log.written_view if tenant.log is not None else None
            tenant.writer = ViewWriter(
                experiment_id,
                config,
                self.on_error,
                self.views,
                on_written=on_written,
                on_drop=self.tally.view_drop,
                on_open=lambda views: self.descriptors.hold(views, views.descriptors, refusable=False),
                on_closed=self.descriptors.forget,
                run=tenant.experiment.run,
            )
            tenant.experiment.keep_spans = any(
                type(v.backend).report is not LoggerBackend.report for v in tenant.writer.views
            )
        return tenant.writer

    def close(self, tenant: Tenant) -> bool:
        """Close a run that is done (``upkeep``: ended, idle): out of the registry now, its views
        and log closed by the closer thread (``run_closer``). False if it is busy again (or closed)."""
        with self.lock:
            return self._retire(tenant)

    @property
    def closing(self) -> int:
        """Runs out of the registry whose views and log are still being closed."""
        return len(self._closing_now)

    def run_closer(self, stop: threading.Event) -> None:
        """The closer thread's loop (started and supervised by the sink): closing a log fsyncs it, and
        a flood of runs that end must not hold up the finalizer that every run's steps wait for."""
        while not stop.is_set():
            if self._to_close.wait(0.5):
                self._to_close.clear()
                self.finish_closing()

    def _retire(self, tenant: Tenant) -> bool:
        """Take a run that may close out of the registry (under the registry lock; never waits for
        the run's own lock): its steps go on where they were if it comes back. ``finish_closing``
        closes its files."""
        if not tenant.lock.acquire(blocking=False):
            return False
        try:
            if tenant.closed or not tenant.closable:
                return False
            tenant.closed = True
            key = tenant.key
            del self.open[key]
            self.quotas.closed(key)
            self.evicted += 1
            self._tombstones[key] = (tenant.experiment.last_finalized, tenant.experiment.attempt)
            while len(self._tombstones) > TOMBSTONES:
                self._tombstones.popitem(last=False)
            self._closing.append(tenant)
            self._closing_now[key] = tenant
            self._to_close.set()
            return True
        finally:
            tenant.lock.release()

    def finish_closing(self) -> None:
        """Close what the runs taken out of the registry hold: each run's views and descriptors
        first (its views finish after what they have queued), then, once its views finished, its
        log (a checkpoint: it fsyncs), one at a time, closing the views of runs taken out
        meanwhile in between: a flood of runs that end waits on the disk holding no descriptor."""
        logs: deque[Tenant] = deque()
        waiting = 0
        while True:
            with self.lock:
                fresh, self._closing = self._closing, []
            for tenant in fresh:
                self._close_views(tenant)
            logs.extend(fresh)
            if not logs:
                return
            tenant = logs.popleft()
            writer = tenant.writer
            if writer is not None and not writer.closed.is_set() and time.monotonic() < tenant.closing_deadline:
                logs.append(tenant)  # its views still write: its log's journal must cover what they wrote
                waiting += 1
                if waiting >= len(logs):  # every one waits for its views: give them a moment
                    writer.closed.wait(0.05)
                    waiting = 0
                continue
            waiting = 0
            self._close_log(tenant)
            with self.lock:
                if self._closing_now.get(tenant.key) is tenant:
                    del self._closing_now[tenant.key]

    def _close_views(self, tenant: Tenant, final: bool = True) -> None:
        """A closed run's views finish after their page (with the run's last status), its span file
        and log segment close: its descriptors go back. ``final``: keep that status for the status
        route (it reads the registry: not under its lock)."""
        try:
            status = self.final_status(tenant) if final and self.final_status is not None else None
            if status is not None:
                with self.lock:
                    self.closed_status[tenant.key] = {**status, "open": False}
                    while len(self.closed_status) > CLOSED_STATUSES:
                        self.closed_status.popitem(last=False)
            if tenant.writer is not None:
                tenant.writer.report(status, None)
                tenant.writer.request_close(self.config.stop_timeout)
            tenant.closing_deadline = time.monotonic() + self.config.stop_timeout
            with tenant.lock:
                if tenant.experiment.traces.file is not None:
                    tenant.experiment.traces.file.close()
                if tenant.log is not None:
                    tenant.log.release(wait=True)
        except Exception as exc:  # a bug (or a failing disk): this run's, nobody else's
            tenant.failed("closing its views", exc)
        finally:
            self.descriptors.forget(tenant)

    def _close_log(self, tenant: Tenant) -> None:
        """A closed run's log is checkpointed and closed; then a reopening of the run may go on."""
        try:
            with tenant.lock:
                if tenant.log is not None:
                    tenant.log.close()
        except Exception as exc:
            tenant.failed("closing its log", exc)

    def _count_closed(self, refused: Refused, n: int, counted: Tenant | None) -> None:
        """Points refused for a run that is closed (``counted`` None), in its kept status (under the
        registry lock)."""
        status = self.closed_status.get(refused.key) if counted is None and refused.key is not None else None
        field = {ENDED: "reused_run_points", RESUME: None}.get(refused.kind, "scope_refused_points")
        if status is not None and field is not None:
            status[field] = status.get(field, 0) + n

    def status_of_closed(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """The last status of a closed run (run None: the experiment's latest run), if still kept."""
        with self.lock:
            if run is None:
                run = self.runs.latest(experiment_id)
                if run is None:
                    return None
            found = self.closed_status.get((experiment_id, self.runs.target(experiment_id, run)))
            return None if found is None else dict(found)

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
                if len(self.posted_backends) >= self.config.runs.max_open and not self._forget_a_config():
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
