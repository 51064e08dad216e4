"""The sink's coordinator: checked OTLP in, one tenant per run of an experiment, finished steps out to views.

``Sink`` wires the parts, each built whole in its constructor, and owns their lifecycle: it
starts the transports (``edge``) on its ``Ingest`` side and its ``Control`` parts (``queries``
read, ``commands`` change), takes each request in (``export_*``), and runs the finalizer. Its
parts: a run's life (``runs``: the registry ``tenants``, ``opener``, ``views``, ``upkeep``,
``closer``, ``closed``), the configuration (``config``), the sink-wide counts (``tally``).

One request, in order: the transport decodes it; the edge checks it (``edge.validate``) and
splits it by experiment; the opener resolves each part's run (``runs.runbook``: a launch is a run,
a resuming launch continues its run); under *that run's* lock the step book takes it (its steps
resolved and admitted), its write-ahead log appends each step's part (``durable.wal``) and the
book merges it: runs never wait for each other. With a state directory the client is answered
only once the log is on disk.

Threads, all supervised (``/healthz`` answers 503 naming a thread that died): the finalizer
(every ``tick`` seconds it visits the runs with work, ``runs.upkeep``: closes the steps that are
complete or past their grace, writes late updates once per ``book.late_interval``, gives back the
file descriptors of quiet runs and takes runs that ended or idle out of the registry), the
closer (their views and logs closed: ``runs.closing.Closer.run``), the write-ahead log's syncer, the
HTTP server's loop, and ``view_workers`` view threads that write every run's
views (``views.writer.ViewPool``). A failure inside one experiment is logged once, counted in the
status route and in its ``rankscope/internal_errors`` metric, and the experiment keeps going.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ..backends.base import Metric
from ..core.anomalies import NonFinite
from ..metrics.reduce import Reduce
from .book.traces import StoredSpan
from .checked import Refusals, ResourceBatch, SpanQuery
from .commands import Commands
from .config import SinkConfig
from .durable.descriptors import Descriptors, Plan, nofile_limit, open_descriptors, out_of_descriptors
from .durable.wal import ExperimentLog, WriteAheadLog, encode_record
from .edge.backlog import Backlog
from .edge.connections import Counts
from .edge.errors import Kind, OverloadedError
from .edge.gate import Gate
from .edge.grpc_server import start_grpc
from .edge.http_server import start_http
from .edge.ports import LOCAL, Client, Control, Result
from .edge.validate import logs_batches, metrics_batches, traces_parts
from .queries import Queries, corrected, recent_of
from .runs.closed import ClosedRuns
from .runs.closing import Closer
from .runs.opening import Opener
from .runs.registry import Tenants
from .runs.status import RunStatus
from .runs.tenant import Tenant
from .runs.upkeep import Upkeep
from .runs.view_configs import ViewConfigs
from .supervisor import Supervisor
from .tally import Tally
from .views.captures import ask_outliers, ask_stragglers
from .views.step import StepView
from .views.viewset import SaidLines

log = logging.getLogger("rankscope.sink")


class Sink:
    """Receives OTLP from every process of every experiment and writes per-step views."""

    def __init__(
        self, config: SinkConfig | None = None, *, clock: Callable[[], float] = time.monotonic, plan: Plan | None = None
    ) -> None:
        self.config = config or SinkConfig()
        self.clock = clock
        c = self.config
        self.plan = plan or Plan.of(
            nofile_limit(),
            open_descriptors(),
            view_workers=c.view_workers,
            max_connections=c.transport.max_connections or None,
        )
        """How the process's descriptor limit is split (``durable.descriptors``); ``plan``: a test's own."""
        self.internal_errors: list[str] = []
        self.tally = Tally()
        """Refusals by kind, plain OTel points and spans received, across experiments."""
        self._failure_lines = SaidLines()
        """This sink's bound on "failed" lines (a process an exception ended): its run's records name each."""
        self._stop = threading.Event()
        self.supervisor = Supervisor(self._internal_error, self._stop)
        self.gate = Gate(self.config.max_in_flight, self._stop, self.config.max_points_in_flight)
        self.backlog = Backlog(clock)
        self.wal = WriteAheadLog(self.config.state_dir) if self.config.state_dir is not None else None
        self.tenants = Tenants(self.config, Descriptors(self.plan))
        """The open runs (``runs.registry``)."""
        self.closed = ClosedRuns(self.tenants, state_dir=c.state_dir)
        self.statuses = RunStatus(self.tenants, self.closed)
        self.views = ViewConfigs(self.config, self.tenants, self.tally, self._internal_error, self.supervisor.spawn)
        """Every run's views and the threads that write them (``runs.view_configs``)."""
        self.connections = Counts()
        """What the HTTP transport's connection rules did (``edge.connections``), for the status route."""
        self.grpc_connections = Counts()
        """...and the gRPC transport's (``edge.front``)."""
        self.closer = Closer(
            self.tenants, self.closed, self.config, final_status=self.statuses.of, on_error=self._internal_error
        )
        self.queries = Queries(
            self.config,
            self.tenants,
            self.tally,
            closed=self.closed,
            statuses=self.statuses,
            closer=self.closer,
            health=self.supervisor.health,
            internal_errors=self.internal_errors,
            connections=lambda: {"http": self.connections.status(), "grpc": self.grpc_connections.status()},
        )
        """What the control routes read (``edge.ports.ControlQueries``): status, spans, recent steps."""
        self.commands = Commands(self.queries, self.tenants, self.views, self.gate, self._finalize)
        """What the control routes change (``edge.ports.ControlCommands``): view configs, reports, captures."""
        self.opener = Opener(
            self.config, self.tenants, self.closer, self.closed, self.views, self.wal, clock, self._internal_error
        )
        """Which run data goes to, opened on its first data (``runs.opening``)."""
        self.upkeep = Upkeep(self.tenants, self.closer, self._finalize, limits=c.runs, grace=c.book.grace, clock=clock)
        """The finalizer's rounds over the runs with work (``runs.upkeep``)."""
        self._servers: list[Any] = []
        self.grpc_port: int | None = None
        self.http_port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Sink:
        spawn = self.supervisor.spawn
        self.views.start()
        if self.wal is not None:
            spawn("wal-syncer", self.wal.run_syncer)
            self.opener.replay()
            for tenant in self.tenants.all():
                self.upkeep.wake(tenant)
        c = self.config
        transport = replace(c.transport, max_connections=self.plan.connections)  # derived when not set
        if self.plan.short:
            log.warning(
                "rankscope sink: a descriptor limit of %d (ulimit -n) leaves its runs %d descriptors after %d "
                "connections per transport; raise it",
                self.plan.limit,
                self.plan.runs,
                self.plan.connections,
            )
        if c.grpc_port is not None:
            server, self.grpc_port = start_grpc(
                self,
                transport,
                c.grpc_port,
                spawn,
                counts=self.grpc_connections,
                on_exhausted=self.tenants.descriptors.exhausted,
                backlog=self.backlog,
            )
            self._servers.append(server)
        if c.http_port is not None:
            exhausted = self.tenants.descriptors.exhausted
            server, self.http_port = start_http(
                self,
                Control(self.queries, self.commands),
                transport,
                c.http_port,
                spawn,
                exhausted,
                max_id_chars=c.limits.max_id_chars,
                counts=self.connections,
                backlog=self.backlog,
            )
            self._servers.append(server)
        spawn("finalizer", self._run_finalizer)
        spawn("closer", lambda: self.closer.run(self._stop))
        return self

    @property
    def endpoint(self) -> str:
        """``host:port`` of the gRPC receiver (what ``RANKSCOPE_ENDPOINT`` should say)."""
        host = self.config.transport.host
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"{host}:{self.grpc_port}"

    def stop(self, timeout: float | None = None) -> None:
        """Stop receiving, finalize every open step (naming what is missing), close the views."""
        if self._stop.is_set():
            return
        timeout = self.config.stop_timeout if timeout is None else timeout
        self._stop.set()
        for server in self._servers:
            server.stop()
        self.supervisor.join(("finalizer", "closer"), timeout)
        self.closer.finish_closing()
        tenants = self.tenants.all()
        for tenant in tenants:
            self._finalize(tenant, force=True)
        for tenant in tenants:  # all experiments' views finish side by side
            if tenant.writer is not None:
                tenant.writer.report(self.statuses.of(tenant), None)  # the page, with the final counts
                tenant.writer.request_close(timeout)
        deadline = time.monotonic() + timeout
        for tenant in tenants:
            if tenant.writer is not None and not tenant.writer.join(deadline - time.monotonic()):
                log.warning(
                    "rankscope sink: the views of %s did not finish within %.0fs%s",
                    tenant.book.name[:96],
                    timeout,
                    "; the write-ahead log keeps what they missed" if self.wal is not None else "",
                )
        self.views.stop(max(0.0, deadline - time.monotonic()))
        for tenant in tenants:
            if tenant.book.traces.file is not None:
                with tenant.lock:
                    tenant.book.traces.file.close()
        if self.wal is not None:
            for tenant in tenants:
                if tenant.log is not None:
                    with tenant.lock:
                        tenant.log.close()
            self.wal.close()

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, problems): every supervised thread that should run is running."""
        return self.supervisor.health()

    # -- ingest (``edge.ports.Ingest``: called by the transports) ---------------------------

    def export_metrics(self, request: Any, client: Client = LOCAL) -> Result:
        with self.gate as call:
            refused, opens = Refusals(), self.opener.openings(client)
            batches = metrics_batches(request, self.config.limits, refused, self.tally.refusal, call)
            waits: dict[ExperimentLog, int] = {}
            for batch in batches:
                self.tally.foreign(batch.foreign)
                n = batch.point_count + len(batch.markers) + int(batch.goodbye)  # a refused goodbye counts
                tenant = self.opener.resolve(batch.experiment, batch.resource, refused, n, client, batch.digest, opens)
                if tenant is None:
                    continue
                with tenant.lock:
                    self._apply(tenant, batch, refused)
                    if tenant.log is not None and tenant.log.seq > tenant.log.durable:
                        waits[tenant.log] = tenant.log.seq
                    ended, attempt = tenant.book.roster.finished, tenant.book.attempt
                self.opener.settle(tenant, ended, attempt, batch)  # a last goodbye ends the run (``runs.runbook``)
            self.tally.refusal(refused)
            if waits and self.wal is not None and not self.wal.wait(waits):
                raise OverloadedError(Kind.NOT_DURABLE, "the sink could not make the data durable; retry")
            opens.check()  # runs not opened (past ``max_new_runs``, the client gone): for the retry
            return Result.of(refused.received, refused)

    def _apply(self, tenant: Tenant, batch: ResourceBatch, refused: Refusals) -> None:
        """One checked batch into its run, under ``tenant.lock``: take (steps resolved, admitted),
        log each step's part ahead (its descriptor held, ``durable.descriptors``), merge."""
        book = tenant.book
        _check_open(tenant)
        if batch.digest and batch.digest in book.seen:
            return  # a client's retry of something already taken: acknowledged again, merged once
        if tenant.log is not None and not self.tenants.hold(tenant):
            refused.add(
                batch.point_count + len(batch.markers),
                "the sink's file descriptors are all held by runs writing now (its descriptor budget); retry",
            )
            return
        book.counts.refused += batch.refused
        try:
            taken = book.take(batch, refused)
            if taken is not None:
                failed = taken.exit_error is not None and taken.process.exit_error is None  # said once
                seqs = {}
                if tenant.log is not None:
                    for step, part in taken.parts.items():
                        record = encode_record(batch.digest, part.resource, part.states, part.markers, part.samples)
                        seqs[step] = tenant.log.append(step, record)
                book.merge(taken, refused, seqs)
                if failed and (unsaid := self._failure_lines.say()) is not None:
                    _say_failed(tenant, taken.process.label, taken.exit_error, unsaid)
        except Exception as exc:  # a bug: this experiment's trouble, nobody else's
            if out_of_descriptors(exc):  # not a bug: counted and said now and then, not once per request
                self.tenants.descriptors.exhausted("open", exc)
                refused.add(batch.point_count, "the sink is out of file descriptors; retry")
                return
            tenant.failed("ingest", exc)
            refused.add(batch.point_count, f"internal error: {type(exc).__name__}")
            return
        book.remember(batch.digest)
        tenant.dirty = True
        self.upkeep.wake(tenant)

    def export_logs(self, request: Any, client: Client = LOCAL) -> Result:
        """Streamed values and ordinary log records go to the views at once; sample rows are merged
        into their steps like points (logged first, so an acknowledged row survives a crash). Its runs
        are all opened before any record is taken (``Opener.resolve_first``)."""
        with self.gate as call:
            refused = Refusals()
            batches = logs_batches(request, self.config.limits, refused, self.tally.refusal, call)
            wanted = [(b.experiment, b.resource, refused, b.record_count) for b in batches]
            tenants = self.opener.resolve_first(wanted, client, self.tally.refusal)
            waits: dict[ExperimentLog, int] = {}
            for batch, tenant in zip(batches, tenants, strict=True):
                if tenant is None:
                    continue
                streamed = [row for row in batch.samples if row.side == "stream"]
                if streamed:
                    batch.samples = [row for row in batch.samples if row.side != "stream"]
                self.upkeep.wake(tenant)
                with tenant.lock:
                    _check_open(tenant)
                    tenant.book.counts.refused += batch.refused  # refused at the edge
                    batch.refused = 0
                    process = tenant.book.stream_process(batch, refused, len(streamed))
                    if process is None:
                        continue
                    records = tenant.book.logs(batch, refused) if batch.logs else []
                    if batch.samples:
                        self._apply(tenant, batch, refused)
                        if tenant.log is not None and tenant.log.seq > tenant.log.durable:
                            waits[tenant.log] = tenant.log.seq
                    writer = self.views.writer(tenant)
                stamp = time.time()
                for key, value, step in batch.streams:
                    writer.stream(process, Metric(key, value, Reduce.MEAN, stamp), step)
                for step, record in records:
                    writer.log(process, record, step)
                for row in streamed:
                    writer.row(process, row)
            self.tally.refusal(refused)
            if waits and self.wal is not None and not self.wal.wait(waits):
                raise OverloadedError(Kind.NOT_DURABLE, "the sink could not make the data durable; retry")
            return Result.of(refused.received, refused)

    def export_traces(self, request: Any, client: Client = LOCAL) -> Result:
        """Store spans per experiment. Spans not kept (no experiment id, malformed ids, older than the
        retained steps or over ``max_spans``) are answered as rejected, with the reason. Its runs are
        all opened before any span is taken (``Opener.resolve_first``)."""
        with self.gate as call:
            edge = Refusals()  # spans of Resources refused at the edge
            parts = traces_parts(request, self.config.limits, edge, self.tally.refusal, call)
            wanted = [(p.experiment, p.resource, Refusals(), p.n) for p in parts]
            tenants = self.opener.resolve_first(wanted, client, self.tally.refusal)
            self.tally.spans(edge.received)
            self.tally.refusal(edge)
            result = Result(0, edge.count, edge.reasons)
            for (_, resource, refused, n), tenant, part in zip(wanted, tenants, parts, strict=True):
                if tenant is None:
                    result.rejected += n
                    result.errors.extend(refused.reasons)
                    self.tally.refusal(refused)
                    continue
                self.upkeep.wake(tenant)
                with tenant.lock:
                    _check_open(tenant)
                    if tenant.book.traces.file is not None and not self.tenants.hold(tenant):
                        result.rejected += n
                        result.errors.append(f"{n} spans: the sink's file descriptors are all held by runs writing now")
                        continue
                    try:
                        process = tenant.book.process_for(resource)
                        if process is None or process.reused:
                            accepted, rejected = 0, n
                            tenant.book.traces.refused += n
                        else:
                            e = tenant.book
                            limits = self.config.limits
                            accepted, rejected = e.traces.ingest(
                                process, part.scope_spans, e.step_at, refused, limits, horizon=e.horizon
                            )
                    except Exception as exc:
                        tenant.failed("trace ingest", exc)
                        result.rejected += n
                        continue
                dropped = n - accepted - rejected
                result.accepted += accepted
                result.rejected += rejected + dropped
                result.errors.extend(refused.reasons)
                self.tally.refusal(refused)
                if process is None or process.reused:
                    result.errors.append(f"{n} spans from too many processes, or from a run that ended")
                if dropped:
                    result.errors.append(f"{dropped} spans older than the retained steps or over max_spans")
            return result

    # -- the finalizer ------------------------------------------------------------------

    def finalize(self, experiment_id: str | None = None) -> None:
        """Finalize open steps of every run (of ``experiment_id``) now, naming what is missing: the job has ended."""
        for tenant in self.tenants.all(experiment_id):
            self._finalize(tenant, force=True)

    def _finalize(self, tenant: Tenant, force: bool = False) -> None:
        """The tenant's finished steps and due late updates: finalized, acted on, to its views.
        A step whose view fails to build is counted and skipped; the steps after it still go."""
        try:
            with tenant.lock:
                if tenant.closed:
                    return
                book = tenant.book
                finished = book.finished(force=force, until=self.backlog.heard_until()) + book.late(force=force)
                tenant.dirty = False
                for done in finished:
                    try:
                        view = book.view(done)
                        _act(tenant, view, self.config.auto_capture_steps)
                    except Exception as exc:  # a bug: logged once, counted, this step only
                        tenant.failed(f"finalizing step {done.step}", exc)
                        continue
                    self.views.writer(tenant).step(view)
                    if not view.late:
                        if tenant.recent:  # the rank x phase map of the last step only
                            tenant.recent[-1].pop("phases", None)
                        tenant.recent.append(recent_of(view))
                    elif view.global_metrics:  # a correction: the recent route shows the exact total
                        corrected(tenant.recent, view)
        except Exception as exc:  # a bug: logged once, counted, this experiment only
            tenant.failed("finalizing", exc)

    def _run_finalizer(self) -> None:
        while not self._stop.wait(self.config.tick):
            self.upkeep.round()

    def _internal_error(self, where: str, exc: BaseException) -> None:
        message = f"rankscope sink: internal error in {where}: {exc!r}"
        self.internal_errors.append(message)
        del self.internal_errors[:-100]
        log.error("%s\n%s", message, "".join(traceback.format_exception(exc)))

    # -- what people and ``rankscope run`` ask (the parts answer: ``queries``) ----------------

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """A run's status (``Queries.status``)."""
        return self.queries.status(experiment_id, run)

    def overview(self) -> dict[str, Any]:
        """The sink as a whole (``Queries.overview``)."""
        return self.queries.overview()

    def spans(self, experiment_id: str, run: str | None = None) -> list[StoredSpan] | None:
        """Stored spans of a run (``Queries.spans``; ``SpanQuery`` for steps and ranks)."""
        return self.queries.spans(SpanQuery(experiment_id, run=run))

    def span_rows(self, experiment_id: str, run: str | None = None) -> Iterator[str] | None:
        """JSONL rows of a run's spans (``Queries.span_rows``)."""
        return self.queries.span_rows(SpanQuery(experiment_id, run=run))

    def wait_written(self, experiment_id: str, timeout: float = 10.0, run: str | None = None) -> bool:
        """Block until a run's views wrote everything finalized so far (``Commands.wait_written``)."""
        return self.commands.wait_written(experiment_id, timeout, run)

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | str:
        """Write a run's report page now (``Commands.report``)."""
        return self.commands.report(experiment_id, timeout, run)


def _check_open(tenant: Tenant) -> None:
    """Under ``tenant.lock``: a run closed since it was resolved is answered "retry" (it reopens then)."""
    if tenant.closed:
        raise OverloadedError(Kind.CLOSING, f"{tenant.name[:96]} was closing; retry")


def _act(tenant: Tenant, view: StepView, auto_capture_steps: int) -> None:
    """What a finished step calls for beyond its views: a straggler's process (and an outlier's,
    where asked) is asked to profile its next steps (rate-limited), a run's first non-finite value
    is logged."""
    ask_stragglers(tenant.captures, view, auto_capture_steps)
    ask_outliers(tenant.captures, view, auto_capture_steps)
    for first in (a for a in view.anomalies if isinstance(a, NonFinite) and a.first):
        log.warning(
            "rankscope sink: %s: first non-finite value: %r at step %d from %r",
            tenant.book.name[:96],
            first.key[:128],
            view.step,
            first.process,
        )


def _say_failed(tenant: Tenant, label: str, error: str | None, unsaid: int) -> None:
    """A process's goodbye said an exception ended it: one line at once, naming it and the error."""
    who = "".join(c if c.isprintable() else "?" for c in label[:96])
    more = f" (and {unsaid} more failures not said)" if unsaid else ""
    log.warning("rankscope sink: %s of %s failed: %s%s", who, tenant.book.name[:96], error, more)
