"""The sink: checked OTLP in, one tenant per run of an experiment, finished steps out to views.

Transports (``grpc_server``, ``http_server``) decode and call ``Sink.export_*``. Each request
is checked at the edge (``validate``), split by experiment, each part's run resolved
(``runs``: a launch is a run, a resuming launch continues its run), and each part is merged
under *that run's* lock: runs never wait for each other. With a state directory the
part is first appended to the experiment's write-ahead log (``wal``), and the client is
answered only once the log is on disk.

Threads, all supervised (``/healthz`` answers 503 naming a thread that died): the
finalizer (every ``tick`` seconds it closes the steps that are complete or past their grace,
writes late updates once per ``late_interval``, and evicts experiments idle for
``idle_timeout``), the write-ahead log's syncer, and ``view_workers`` view threads that write
every run's views (``views.ViewPool``). A
failure inside one experiment is logged once, counted in the status route and in its
``rankscope/internal_errors`` metric, and the experiment keeps going.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import LoggerBackend, Metric, get_backend_class
from ..core import names as attr
from ..core.paths import safe_component
from ..metrics.reduce import Reduce
from ..otlp.markers import Marker
from ..otlp.samples import SampleRow
from .admission import ExperimentLimits
from .anomalies import Detectors
from .bodies import OverloadedError
from .captures import CaptureBook, ask_stragglers
from .experiment import Experiment, StepView
from .grpc_server import start_grpc
from .http_server import start_http
from .runs import Run, RunBook, RunKey
from .tally import Tally
from .traces import SpanFile, TraceStore
from .validate import (
    Limits,
    Refusals,
    ResourceBatch,
    StateRows,
    check_posted_views,
    check_resource,
    logs_batches,
    metrics_batches,
    root_posted_views,
)
from .views import ViewPool, ViewWriter
from .wal import ExperimentLog, WriteAheadLog, decode_record, encode_record

log = logging.getLogger("rankscope.sink")

DEFAULT_BACKENDS: dict[str, dict[str, Any]] = {"console": {"logging_mode": "global_reduce"}}


@dataclass(kw_only=True)
class SinkConfig:
    """How a sink listens, what it writes and what one client may make it hold.

    CLI flags and ``RANKSCOPE_SINK_*`` map here. Flat on purpose, past 25 fields: each is one
    flag a person sets; the bounds that travel together are nested (``limits`` at the edge,
    ``experiment_limits`` per run, ``detectors``)."""

    host: str = "127.0.0.1"
    grpc_port: int | None = 4317
    http_port: int | None = 4318
    backends: Mapping[str, Mapping[str, Any]] | None = None
    """Views for every experiment; None: each experiment's posted config, else console."""
    report: bool = False
    """Every experiment also gets the ``report`` view (its HTML page), whatever its other views."""
    trust_posted_paths: bool = False
    """Whether a posted view config's paths are used as given: the sink of one job (embedded,
    ``rankscope run``) takes its own job's. A shared sink holds them to relative paths without
    ``..`` (``validate.check_posted_views``)."""
    grace: float = 10.0
    token: str | None = None
    state_dir: Path | None = None
    """Write-ahead log directory: acknowledged data survives a crash. None: memory only."""
    max_body_bytes: int = 32 * 1024 * 1024
    max_in_flight: int = 64
    max_connections: int = 1024
    """Open HTTP connections at most; idle ones are closed after ``idle_connection_timeout``."""
    idle_connection_timeout: float = 15.0
    body_timeout: float = 60.0
    """Seconds an OTLP/HTTP body may take to arrive, plus one per 64 KiB received (a trickled one
    would hold its connection and buffer): a slower one is answered 408 and its connection closed."""
    retain_steps: int = 16
    trace_retain_steps: int = 64
    """Steps whose spans an experiment keeps (``rankscope gantt``, straggler views)."""
    max_spans: int = 200_000
    """Spans an experiment keeps at most; the oldest steps go first."""
    spans_dir: Path | None = None
    """Where each experiment's spans are also written as they arrive (the whole run's Gantt)."""
    max_span_file_bytes: int = 1 << 30
    time_bucket: float = 1.0
    """Seconds per step of an experiment none of whose processes steps (``Experiment.step_at``)."""
    time_bucket_lag: float = 2.0
    """How long after a time bucket ends its step is final (late data is merged and rewritten)."""
    detectors: Detectors = field(default_factory=Detectors)
    """Per-step anomaly detectors' thresholds (``sink.anomalies``)."""
    artifacts_dir: Path = Path("rankscope_artifacts")
    """Where captured profiler traces are written (``ARTIFACTS/<experiment>/captures/<id>/``)."""
    auto_capture_steps: int = 2
    """Steps a straggler's process profiles when a detector names it (0: detectors never capture)."""
    capture_interval: float = 300.0
    """Seconds between two detector-asked captures of one experiment (a flapping detector)."""
    grpc_workers: int = 8
    limits: Limits = field(default_factory=Limits)
    """What one request may carry (``sink.validate``, the edge)."""
    experiment_limits: ExperimentLimits = field(default_factory=ExperimentLimits)
    """What one run may make the sink hold (``sink.admission``)."""
    max_experiments: int = 4096
    """Runs (of every experiment) open at once."""
    max_open_runs: int = 256
    """Runs of one experiment open at once, not counting runs that ended (every process said
    goodbye): one client inventing run ids fills no more of ``max_experiments`` than this (an
    idle run closes after ``idle_timeout``)."""
    idle_timeout: float = 300.0
    """Seconds without data after which a run's views are closed (reopened on new data)."""
    resume_window: float = 7 * 86400.0
    """Seconds after a run was last seen during which a launch may resume it (``rankscope.run.resume``)."""
    max_runs: int = 1000
    """Runs of one experiment the sink remembers (for listing and resume); the oldest are forgotten."""
    late_interval: float = 1.0
    """Late updates of a step are merged and written at most this often."""
    view_workers: int = 4
    """Threads that write every run's views (``sink.views.ViewPool``), however many runs are open."""
    tick: float = 0.05
    stop_timeout: float = 10.0
    """How long ``stop`` waits for the views; with a state directory, the rest is replayed on start."""


@dataclass
class Result:
    accepted: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return "; ".join(self.errors[:8])

    @classmethod
    def of(cls, total: int, refused: Refusals) -> Result:
        return cls(max(0, total - refused.count), refused.count, refused.reasons)


class Tenant:
    """One run of an experiment at the sink: its state, its views, its log, and the lock that guards them."""

    def __init__(self, experiment: Experiment, log: ExperimentLog | None, captures: CaptureBook) -> None:
        self.experiment = experiment
        self.log = log
        self.captures = captures
        """Profiler captures asked of the run's processes (``sink.captures``)."""
        self.lock = threading.Lock()
        self.writer: ViewWriter | None = None
        self.dirty = False
        self.errors = 0
        self.last_error: str | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_STEPS)
        """The last finalized steps, for people watching live (``/rankscope/v1/recent``)."""


RECENT_STEPS = 64
RECENT_KEYS = 256


def _recent(view: StepView) -> dict[str, Any]:
    values: dict[str, float] = {}
    for metric in view.global_metrics:
        if len(values) >= RECENT_KEYS:
            break
        values[metric.key] = metric.value
    return {
        "step": view.step,
        "time": time.time(),
        "values": values,
        "missing": view.missing[:64],
        "anomalies": view.anomalies[:16],
        "phases": view.heat,
    }


class Sink:
    """Receives OTLP from every process of every experiment and writes per-step views."""

    def __init__(self, config: SinkConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or SinkConfig()
        self.clock = clock
        self.tenants: dict[RunKey, Tenant] = {}
        self.runs = RunBook(resume_window=self.config.resume_window, max_runs=self.config.max_runs)
        self.run_notes: deque[str] = deque(maxlen=20)
        """What the run book said lately (resumes mapped, resumes that found nothing): the status route."""
        self.posted_backends: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        self._gantt_backends: dict[str, bool] = {}
        self.internal_errors: list[str] = []
        self.tally = Tally()
        """Refusals by kind, plain OTel points and spans received, across experiments."""
        self.evicted = 0
        self._tombstones: OrderedDict[RunKey, tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()  # the tenant registry only; never held while merging
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._stop = threading.Event()
        self._servers: list[Any] = []
        self._threads: dict[str, threading.Thread] = {}
        self.dead_threads: dict[str, str] = {}
        self.wal = WriteAheadLog(self.config.state_dir) if self.config.state_dir is not None else None
        self._views: ViewPool | None = None
        self.grpc_port: int | None = None
        self.http_port: int | None = None

    @property
    def experiments(self) -> dict[str, Experiment]:
        """Each experiment's latest open run."""
        with self._lock:
            return {
                k[0]: t.experiment for k, t in sorted(self.tenants.items(), key=lambda kv: kv[1].experiment.started)
            }

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Sink:
        self._views = ViewPool(self.config.view_workers, self._spawn)
        if self.wal is not None:
            self._spawn("wal-syncer", self.wal.run_syncer)
            self._replay()
        c = self.config
        if c.grpc_port is not None:
            server, self.grpc_port = start_grpc(self, c.host, c.grpc_port)
            self._servers.append(server)
        if c.http_port is not None:
            server, self.http_port = start_http(self, c.host, c.http_port)
            self._servers.append(server)
        self._spawn("finalizer", self._run_finalizer)
        return self

    @property
    def endpoint(self) -> str:
        """``host:port`` of the gRPC receiver (what ``RANKSCOPE_ENDPOINT`` should say)."""
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"{host}:{self.grpc_port}"

    def stop(self, timeout: float | None = None) -> None:
        """Stop receiving, finalize every open step (naming what is missing), close the views."""
        if self._stop.is_set():
            return
        timeout = self.config.stop_timeout if timeout is None else timeout
        self._stop.set()
        for server in self._servers:
            server.stop()
        finalizer = self._threads.get("finalizer")
        if finalizer is not None:
            finalizer.join(timeout)
        with self._lock:
            tenants = list(self.tenants.values())
        for tenant in tenants:
            self._finalize(tenant, force=True)
        for tenant in tenants:  # all experiments' views finish side by side
            if tenant.writer is not None:
                tenant.writer.report(self._status_of(tenant), None)  # the page, with the final counts
                tenant.writer.request_close(timeout)
        deadline = time.monotonic() + timeout
        for tenant in tenants:
            if tenant.writer is not None and not tenant.writer.join(deadline - time.monotonic()):
                log.warning(
                    "rankscope sink: the views of %s did not finish within %.0fs%s",
                    tenant.experiment.name[:96],
                    timeout,
                    "; the write-ahead log keeps what they missed" if self.wal is not None else "",
                )
        if self._views is not None:
            self._views.stop(max(0.0, deadline - time.monotonic()))
        for tenant in tenants:
            if tenant.experiment.traces.file is not None:
                with tenant.lock:
                    tenant.experiment.traces.file.close()
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

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """A supervised thread: if it ever raises, ``health()`` names it and /healthz turns 503."""

        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.dead_threads[name] = f"{type(exc).__name__}: {exc}"
                self._internal_error(f"thread {name}", exc)

        thread = threading.Thread(target=run, name=f"rankscope-sink-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()
        return thread

    def health(self) -> tuple[bool, list[str]]:
        """(healthy, problems): every supervised thread that should run is running."""
        problems = [f"thread {name} died: {why}" for name, why in self.dead_threads.items()]
        if not self._stop.is_set():
            for name in ("finalizer", "wal-syncer"):
                thread = self._threads.get(name)
                if thread is not None and not thread.is_alive() and name not in self.dead_threads:
                    problems.append(f"thread {name} is not running")
        return not problems, problems

    # -- ingest (called by the transports) ------------------------------------------------

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """Count one request in flight; over capacity raises ``OverloadedError``."""
        with self._in_flight_lock:
            if self._in_flight >= self.config.max_in_flight or self._stop.is_set():
                raise OverloadedError("the sink is at capacity" if not self._stop.is_set() else "the sink is stopping")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    def export_metrics(self, request: Any) -> Result:
        with self._admitted():
            refused = Refusals()
            batches = metrics_batches(request, self.config.limits, refused)
            waits: dict[ExperimentLog, int] = {}
            for batch in batches:
                self.tally.foreign(batch.foreign)
                tenant = self._tenant(batch.experiment, batch.resource, refused, batch.point_count + len(batch.markers))
                if tenant is None:
                    continue
                with tenant.lock:
                    self._apply(tenant, batch, refused)
                    if tenant.log is not None and tenant.log.seq > tenant.log.durable:
                        waits[tenant.log] = tenant.log.seq
            self.tally.refusal(refused)
            if waits and self.wal is not None and not self.wal.wait(waits):
                raise OverloadedError("the sink could not make the data durable; retry")
            return Result.of(refused.received, refused)

    def _apply(self, tenant: Tenant, batch: ResourceBatch, refused: Refusals) -> None:
        """One checked batch into its run, under ``tenant.lock``: take (steps resolved, admitted),
        log each step's part ahead, merge."""
        experiment = tenant.experiment
        if batch.digest and batch.digest in experiment.seen:
            return  # a client's retry of something already taken: acknowledged again, merged once
        experiment.counts.refused += batch.refused
        try:
            taken = experiment.take(batch, refused)
            if taken is not None:
                seqs = {}
                if tenant.log is not None:
                    for step, part in taken.parts.items():
                        record = encode_record(batch.digest, part.resource, part.states, part.markers, part.samples)
                        seqs[step] = tenant.log.append(step, record)
                experiment.merge(taken, refused, seqs)
        except Exception as exc:  # a bug: this experiment's trouble, nobody else's
            self._tenant_error(tenant, "ingest", exc)
            refused.add(batch.point_count, f"internal error: {type(exc).__name__}")
            return
        experiment.remember(batch.digest)
        tenant.dirty = True

    def export_logs(self, request: Any) -> Result:
        """Streamed values and ordinary log records go to the views at once; sample rows are merged
        into their steps like points (logged first, so an acknowledged row survives a crash)."""
        with self._admitted():
            refused = Refusals()
            total = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
            waits: dict[ExperimentLog, int] = {}
            for batch in logs_batches(request, self.config.limits, refused):
                n = len(batch.streams) + len(batch.logs) + len(batch.samples)
                tenant = self._tenant(batch.experiment, batch.resource, refused, n)
                if tenant is None:
                    continue
                streamed = [row for row in batch.samples if row.side == "stream"]
                if streamed:
                    batch.samples = [row for row in batch.samples if row.side != "stream"]
                with tenant.lock:
                    tenant.experiment.counts.refused += batch.refused  # refused at the edge
                    batch.refused = 0
                    process = tenant.experiment.stream_process(batch, refused, len(streamed))
                    if process is None:
                        continue
                    records = tenant.experiment.logs(batch, refused) if batch.logs else []
                    if batch.samples:
                        self._apply(tenant, batch, refused)
                        if tenant.log is not None and tenant.log.seq > tenant.log.durable:
                            waits[tenant.log] = tenant.log.seq
                    writer = self._writer(tenant)
                stamp = time.time()
                for key, value, step in batch.streams:
                    writer.stream(process, Metric(key, value, Reduce.MEAN, stamp), step)
                for step, record in records:
                    writer.log(process, record, step)
                for row in streamed:
                    writer.row(process, row)
            self.tally.refusal(refused)
            if waits and self.wal is not None and not self.wal.wait(waits):
                raise OverloadedError("the sink could not make the data durable; retry")
            return Result.of(total, refused)

    def export_traces(self, request: Any) -> Result:
        """Store spans per experiment. Spans not kept (no experiment id, malformed ids, older than the
        retained steps or over ``max_spans``) are answered as rejected, with the reason."""
        with self._admitted():
            result = Result()
            for rs in request.resource_spans:
                n = sum(len(ss.spans) for ss in rs.scope_spans)
                self.tally.spans(n)
                checked = check_resource(rs.resource, self.config.limits)
                if isinstance(checked, str):
                    result.rejected += n
                    result.errors.append(f"{n} spans: {checked}")
                    self.tally.refusal(Refusals(n, [checked]))
                    continue
                refused = Refusals()
                tenant = self._tenant(checked[0], checked[1], refused, n)
                if tenant is None:
                    result.rejected += n
                    result.errors.extend(refused.reasons)
                    self.tally.refusal(refused)
                    continue
                with tenant.lock:
                    try:
                        process = tenant.experiment.process_for(checked[1])
                        if process is None or process.reused:
                            accepted, rejected = 0, n
                            tenant.experiment.traces.refused += n
                        else:
                            e = tenant.experiment
                            limits = self.config.limits
                            accepted, rejected = e.traces.ingest(process, rs.scope_spans, e.step_at, refused, limits)
                    except Exception as exc:
                        self._tenant_error(tenant, "trace ingest", exc)
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

    def spans(
        self,
        experiment_id: str,
        first: int | None = None,
        last: int | None = None,
        ranks: set[int] | None = None,
        run: str | None = None,
    ) -> list[Any] | None:
        """Stored spans of a run (None: the experiment's latest; see ``sink.traces``), or None for an
        unknown experiment or run."""
        tenant = self._find(experiment_id, run)
        if tenant is None:
            return None
        with tenant.lock:
            return tenant.experiment.traces.select(first, last, ranks)

    def span_rows(
        self,
        experiment_id: str,
        first: int | None = None,
        last: int | None = None,
        ranks: set[int] | None = None,
        run: str | None = None,
    ) -> Iterator[str] | None:
        """JSONL rows of a run's spans (None: the experiment's latest run): the whole run from its
        span file when it has one, else the stored (retained) steps; None for an unknown run."""
        tenant = self._find(experiment_id, run)
        if tenant is None:
            return None
        with tenant.lock:
            file = tenant.experiment.traces.file
            if file is None:
                return iter(
                    [
                        json.dumps(s.row(), default=str) + "\n"
                        for s in tenant.experiment.traces.select(first, last, ranks)
                    ]
                )
            return file.rows(first, last, ranks)

    # -- control (HTTP routes used by embedded clients) ------------------------------------

    def recent(self, experiment_id: str, run: str | None = None) -> list[dict[str, Any]] | None:
        """A run's last finalized steps (values, missing, anomalies, rank x phase seconds); None: the
        experiment's latest run."""
        tenant = self._find(experiment_id, run)
        if tenant is None:
            return None
        with tenant.lock:
            return list(tenant.recent)

    # -- captures (``sink.captures``) ----------------------------------------------------

    def capture(
        self,
        experiment_id: str,
        reason: str,
        steps: int,
        ranks: frozenset[int] | None = None,
        run: str | None = None,
    ) -> dict[str, Any] | str:
        """Ask a run's processes (``ranks``; None: all; run None: the experiment's latest) to profile
        their next ``steps`` steps; returns the capture, or why not (unknown experiment, rate limit)."""
        tenant = self._find(experiment_id, run)
        if tenant is None:
            return f"no experiment {experiment_id[:200]!r}"
        with tenant.lock:
            asked = tenant.captures.ask(reason, steps, ranks=ranks)
        return asked if isinstance(asked, str) else asked.status()

    def pending_captures(self, experiment_id: str, process_id: str) -> list[dict[str, Any]]:
        """The capture requests a process has not picked up yet (it polls for them)."""
        tenant = self._tenant_of_process(experiment_id, process_id)
        if tenant is None:
            return []
        with tenant.lock:
            process = tenant.experiment.processes.get(process_id)
            return [] if process is None else tenant.captures.pending(process)

    def capture_target(self, experiment_id: str, capture_id: str, process_id: str, size: int) -> Path:
        """Where a process's trace of a capture goes, checked before its body is read. Raises
        ``LookupError`` for a capture, process or experiment that does not ask for this file."""
        tenant = self._tenant_of_process(experiment_id, process_id)
        if tenant is None:
            raise LookupError(f"no process {process_id[:64]!r} in experiment {experiment_id[:200]!r}")
        with tenant.lock:
            experiment = tenant.experiment
            process = experiment.processes.get(process_id)
            if process is None:
                raise LookupError(f"no process {process_id[:64]!r} in this experiment")
            path = tenant.captures.path_for(self.config.artifacts_dir, experiment_id, capture_id, process, size)
        if isinstance(path, str):
            raise LookupError(path)
        return path

    def store_capture(self, experiment_id: str, capture_id: str, process_id: str, data: bytes) -> str:
        """Write a process's trace of a capture it picked up (checked again: ``capture_target``),
        then announce it; returns its path."""
        with self._admitted():  # uploads count against max_in_flight like exports
            path = self.capture_target(experiment_id, capture_id, process_id, len(data))
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            partial.write_bytes(data)
            partial.replace(path)  # a reader never sees half a file
            tenant = self._tenant_of_process(experiment_id, process_id)
            assert tenant is not None  # capture_target found it; runs are never dropped while a process writes
            with tenant.lock:
                experiment = tenant.experiment
                process = experiment.processes[process_id]
                capture = tenant.captures.stored(capture_id, process, path, len(data))
                record = {
                    "type": "capture",
                    "capture": capture_id,
                    "reason": capture.reason if capture is not None else "",
                    "steps": capture.steps if capture is not None else None,
                    "process": process.label,
                    "role": process.role,
                    "replica": process.replica,
                    "rank": process.rank,
                    "path": str(path.resolve()),
                    "bytes": len(data),
                }
                experiment.watch.note(record)
                step = experiment.last_finalized if experiment.last_finalized >= 0 else None
                self._writer(tenant).anomaly(record, step)
            return str(path)

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str:
        """An experiment's processes say which views they want (used when the sink has none)."""
        if self.config.backends is not None:
            return "ignored: this sink's views are fixed by its configuration"
        if not self.config.trust_posted_paths:
            why = check_posted_views(backends)
            if why is not None:
                return f"refused: {why}"
            backends = root_posted_views(experiment_id, backends)
        with self._lock:
            known = self.posted_backends.get(experiment_id)
            tenants = [t for k, t in self.tenants.items() if k[0] == experiment_id]
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
        open_experiments = {e for e, _ in self.tenants}
        for experiment_id in self.posted_backends:
            if experiment_id not in open_experiments:
                del self.posted_backends[experiment_id]
                return True
        return False

    def status(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """A run's status (None: the experiment's latest run), with the experiment's runs listed."""
        tenant = self._find(experiment_id, run)
        return None if tenant is None else self._status_of(tenant)

    def _runs_of(self, experiment_id: str) -> list[dict[str, Any]]:
        """The experiment's runs, newest first (at most 100), as the status route lists them."""
        with self._lock:
            runs = self.runs.runs(experiment_id)[-100:]
            listed = []
            for r in reversed(runs):
                tenant = self.tenants.get((experiment_id, r.run))
                last = tenant.experiment.last_finalized if tenant is not None else None
                listed.append(
                    {
                        "run": r.run,
                        "started": r.started,
                        "attempt": r.attempt,
                        "open": tenant is not None,
                        "last_finalized_step": last,
                        "resumed_by": sorted(r.launches)[:16],
                    }
                )
            return listed

    def _status_of(self, tenant: Tenant) -> dict[str, Any]:
        runs = self._runs_of(tenant.experiment.id)
        with tenant.lock:
            e, n = tenant.experiment, tenant.experiment.counts
            processes, upstreams = e.roster.counts()
            views = tenant.writer.status() if tenant.writer is not None else {}
            written = [v["last_written_step"] for v in views.values() if not v["disabled"]]
            return {
                "experiment": e.id,
                "run": e.run,
                "attempt": e.attempt,
                "runs": runs,
                "last_finalized_step": e.last_finalized,
                "processes": processes,
                "merge_upstreams": upstreams,
                "points": n.points,
                "merged_points": n.merged_points,
                "late_points": n.late_points,
                "abandoned_steps": n.abandoned_steps,
                "superseded_points": n.superseded_points,
                "reused_run_points": n.reused_points,
                "refused_points": n.refused,
                "foreign_points": n.foreign_points,
                "series_overflow": e.streams.overflowed,
                "plain_stale_points": e.streams.stale,
                "plain_streams_forgotten": e.streams.forgotten,
                "log_records": n.log_records,
                "sample_rows": n.sample_rows,
                **e.watch.status(),
                "captures": tenant.captures.status(),
                "time_bucketed": e.bucketed,
                "internal_errors": n.internal_errors + tenant.errors,
                "last_error": tenant.last_error,
                "last_written_step": min(written) if written else -1,
                "views": views,
                "spans_stored": e.traces.count,
                "spans_dropped": e.traces.dropped,
                "spans_refused": e.traces.refused,
                "span_attributes_left_out": e.traces.attributes_left_out,
                "span_file": e.traces.file.status() if e.traces.file is not None else None,
            }

    def overview(self) -> dict[str, Any]:
        """The sink as a whole (the status route without ``?experiment=``)."""
        healthy, problems = self.health()
        with self._lock:
            tenants = sorted(self.tenants.items())
            experiments = len({key[0] for key in self.tenants})
        listed = []
        for (experiment_id, run), tenant in tenants[:100]:
            with tenant.lock:
                e = tenant.experiment
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
            "run_notes": list(self.run_notes),
            "evicted_experiments": self.evicted,
            **self.tally.overview(),
            "internal_errors": len(self.internal_errors),
            "durable": self.wal is not None,
        }

    def wait_written(self, experiment_id: str, timeout: float = 10.0, run: str | None = None) -> bool:
        """Block until the views of a run (None: the experiment's latest) wrote everything finalized so far."""
        tenant = self._find(experiment_id, run)
        if tenant is None:
            return True
        self._finalize(tenant)
        return True if tenant.writer is None else tenant.writer.wait_idle(timeout)

    def finalize(self, experiment_id: str | None = None) -> None:
        """Finalize open steps of every run (of ``experiment_id``) now, naming what is missing: the job has ended."""
        with self._lock:
            tenants = [t for k, t in self.tenants.items() if experiment_id is None or k[0] == experiment_id]
        for tenant in tenants:
            self._finalize(tenant, force=True)

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | str:
        """Write a run's report page (None: the experiment's latest run) now, after every step
        finalized so far, and return where; a string says why not (no such experiment, no report
        view, too slow)."""
        tenant = self._find(experiment_id, run)
        if tenant is None:
            return f"no experiment {experiment_id[:200]!r}" + (f" run {run[:64]!r}" if run else "")
        deadline = time.monotonic() + timeout
        run = tenant.experiment.run
        self.wait_written(experiment_id, timeout, run)
        status = self.status(experiment_id, run)
        writer = tenant.writer
        if writer is None or writer.closed.is_set():  # never open its views with a config it did not choose
            return f"no step of experiment {experiment_id[:200]!r} is finalized yet: no view is open"
        paths = writer.report(status, max(0.0, deadline - time.monotonic()))
        if paths:
            return paths
        if not any(type(v.backend).report is not LoggerBackend.report for v in writer.views if not v.disabled):
            names = [v.name for v in writer.views if not v.disabled]
            return (
                f"experiment {experiment_id[:200]!r} has no report view (its views: {', '.join(names) or 'none'}); "
                'add {"report": {}} to its backends, or run the sink with --report'
            )
        return f"the report of {experiment_id[:200]!r} was not written within {timeout:.0f}s (see the status route)"

    def local_pids(self, host: str) -> set[int]:
        """Pids of this machine's client processes (the embedded sink exits when they have)."""
        with self._lock:
            tenants = list(self.tenants.values())
        pids: set[int] = set()
        for tenant in tenants:
            with tenant.lock:
                pids |= tenant.experiment.roster.local_pids(host)
        return pids

    # -- internals ----------------------------------------------------------------------

    def _find(self, experiment_id: str, run: str | None = None) -> Tenant | None:
        """The open tenant of a run; run None: the experiment's latest open run."""
        with self._lock:
            if run is None:
                open_runs = [r.run for r in self.runs.runs(experiment_id) if (experiment_id, r.run) in self.tenants]
                if not open_runs:
                    return None
                run = open_runs[-1]
            return self.tenants.get((experiment_id, self.runs.target(experiment_id, run)))

    def _tenant_of_process(self, experiment_id: str, process_id: str) -> Tenant | None:
        """The open run of an experiment that holds this process (processes poll by their own id)."""
        with self._lock:
            tenants = [t for k, t in self.tenants.items() if k[0] == experiment_id]
        for tenant in reversed(tenants):
            with tenant.lock:
                if process_id in tenant.experiment.processes:
                    return tenant
        return None

    def _tenant(self, experiment_id: str, resource: dict[str, Any], refused: Refusals, n: int) -> Tenant | None:
        """The tenant of the run this Resource's data belongs to (``runs``), created (or reopened) on
        first data; None when its resume is refused or past ``max_experiments``. The Resource is
        rewritten to the run and attempt it counts as, so the write-ahead log holds them."""
        with self._lock:
            resolved = self.runs.resolve(experiment_id, resource)
            if isinstance(resolved, str):
                refused.add(n, resolved)
                self._note(resolved)
                return None
            key = resolved.key
            resource[attr.RUN_ID] = key[1]
            resource[attr.EXPERIMENT_ATTEMPT] = resolved.attempt
            tenant = self.tenants.get(key)
            if tenant is None:
                full = self._full(experiment_id)
                if full is not None:
                    if resolved.created:
                        self.runs.forget(key)
                    refused.add(n, full)
                    return None
                try:
                    tenant = self._new_tenant(key)
                except OSError as exc:  # its write-ahead log cannot be opened (disk full, permissions)
                    if resolved.created:
                        self.runs.forget(key)
                    log.error("rankscope sink: run %r of %r not opened: %r", key[1][:64], experiment_id[:64], exc)
                    refused.add(n, "the sink cannot open this run's write-ahead log (see the sink's log)")
                    return None
                self.tenants[key] = tenant
            if resolved.note is not None:
                self._note(resolved.note)
            record = resolved.changed.record() if resolved.changed is not None else None
        if record is not None and tenant.log is not None:  # outside the registry lock: it fsyncs
            tenant.log.save_meta(record)
        return tenant

    def _full(self, experiment_id: str) -> str | None:
        """Why another run of ``experiment_id`` may not open now, or None (under the registry lock)."""
        c = self.config
        if len(self.tenants) >= c.max_experiments:
            return f"the sink holds {c.max_experiments} runs (limit)"
        runs = [t for (e, _), t in self.tenants.items() if e == experiment_id]
        if len(runs) >= c.max_open_runs and sum(not t.experiment.roster.all_ended for t in runs) >= c.max_open_runs:
            return f"this experiment has {c.max_open_runs} runs open (limit; idle ones close in {c.idle_timeout:g} s)"
        return None

    def _note(self, note: str) -> None:
        """A run-book event worth a line: logged and kept for the status route."""
        if note not in self.run_notes:
            log.warning("rankscope sink: %s", note)
            self.run_notes.append(note)

    def _new_tenant(self, key: RunKey) -> Tenant:
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
            on_error=self._internal_error,
            clock=self.clock,
        )
        experiment.keep_spans = self._draws_gantt(experiment_id)
        log_ = self.wal.open(experiment_id, run) if self.wal is not None else None
        if log_ is not None:
            experiment.restore(log_.last_finalized, log_.attempt)
        elif key in self._tombstones:  # evicted before: steps go on where they were
            experiment.restore(*self._tombstones.pop(key))
        return Tenant(experiment, log_, CaptureBook(self.clock, auto_interval=c.capture_interval))

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

    def _replay(self) -> None:
        """Re-merge every record the views had not written when the last sink stopped or died."""
        assert self.wal is not None
        for meta, attempt, seen in self.wal.found():
            run = Run.restored(meta, attempt, seen)
            self.runs.add(run)
            experiment_id, key = run.experiment, (run.experiment, run.run)
            tenant = self._new_tenant(key)
            assert tenant.log is not None
            records = 0
            refused = Refusals()
            for seq, _step, payload in tenant.log.replay():
                try:
                    digest, resource, states, markers, samples = decode_record(payload)
                    batch = ResourceBatch(experiment_id, resource, digest=digest)
                    batch.states = [StateRows(*rows) for rows in states]
                    batch.markers = [Marker(*m) for m in markers]
                    batch.samples = [SampleRow(*row) for row in samples]
                    tenant.experiment.apply(batch, refused, seq=seq, replayed=True)
                    tenant.experiment.remember(digest)
                except Exception as exc:
                    self._tenant_error(tenant, f"replaying record {seq}", exc)
                records += 1
            for note in tenant.log.set_aside:
                self._note(note)
            if refused.count:  # acknowledged once, so never silently: what the run's state refuses now
                self._note(
                    f"replaying {tenant.experiment.name[:96]}: {refused.count} points refused ({refused.message})"
                )
            if records:
                log.warning("rankscope sink: replayed %d records of %s", records, tenant.experiment.name[:96])
                tenant.dirty = True
                self.tenants[key] = tenant
            else:
                tenant.log.close()

    def _writer(self, tenant: Tenant) -> ViewWriter:
        """The tenant's views, opened on first use. Caller holds ``tenant.lock``."""
        if tenant.writer is None:
            experiment_id = tenant.experiment.id
            config = self.config.backends or self.posted_backends.get(experiment_id) or DEFAULT_BACKENDS
            if self.config.report and not any(str(v.get("backend", k)) == "report" for k, v in config.items()):
                config = {**config, "report": {"logging_mode": "global_reduce"}}
            log_ = tenant.log
            experiment = tenant.experiment

            def written(view: StepView) -> None:
                if log_ is not None and view.seq:  # a late update moves neither the frontier nor the attempt
                    late = view.late
                    log_.written_view(view.step, view.seq, -1 if late else view.step, 0 if late else view.attempt)

            if self._views is None:
                raise RuntimeError("the sink's views run once it is started (Sink.start)")
            tenant.writer = ViewWriter(
                experiment_id, config, self._internal_error, self._views, on_written=written, run=experiment.run
            )
            experiment.keep_spans = any(type(v.backend).report is not LoggerBackend.report for v in tenant.writer.views)
        return tenant.writer

    def _finalize(self, tenant: Tenant, force: bool = False) -> None:
        """The tenant's finished steps and due late updates: finalized, acted on, to its views.
        A step whose view fails to build is counted and skipped; the steps after it still go."""
        try:
            with tenant.lock:
                experiment = tenant.experiment
                finished = experiment.finished(force=force) + experiment.late(force=force)
                tenant.dirty = False
                for done in finished:
                    try:
                        view = experiment.view(done)
                        self._act(tenant, view)
                    except Exception as exc:  # a bug: logged once, counted, this step only
                        self._tenant_error(tenant, f"finalizing step {done.step}", exc)
                        continue
                    self._writer(tenant).step(view)
                    if not view.late:
                        if tenant.recent:  # the rank x phase map of the last step only
                            tenant.recent[-1].pop("phases", None)
                        tenant.recent.append(_recent(view))
        except Exception as exc:  # a bug: logged once, counted, this experiment only
            self._tenant_error(tenant, "finalizing", exc)

    def _act(self, tenant: Tenant, view: StepView) -> None:
        """What a finished step calls for beyond its views: a straggler's process is asked to
        profile its next steps (rate-limited), a first non-finite value is logged."""
        ask_stragglers(tenant.captures, view.stragglers, self.config.auto_capture_steps)
        first = tenant.experiment.watch.first_nonfinite
        if first is not None and any(a.get("first") for a in view.anomalies):
            log.warning(
                "rankscope sink: %s: first non-finite value: %r at step %d from %r",
                tenant.experiment.name[:96],
                first["key"][:128],
                view.step,
                first["process"],
            )

    def _run_finalizer(self) -> None:
        while not self._stop.wait(self.config.tick):
            now = self.clock()
            with self._lock:
                tenants = list(self.tenants.values())
            for tenant in tenants:
                deadline = tenant.experiment.next_deadline()
                if tenant.dirty or (deadline is not None and now >= deadline) or tenant.experiment.late_due(now):
                    self._finalize(tenant)
                elif tenant.experiment.idle(now, self.config.idle_timeout):
                    self._evict(tenant)

    def _evict(self, tenant: Tenant) -> None:
        """Close an idle experiment's views and log (threads and files released); reopened on new data."""
        key = (tenant.experiment.id, tenant.experiment.run)
        with self._lock, tenant.lock:
            if not tenant.experiment.idle(self.clock(), self.config.idle_timeout) or tenant.dirty:
                return
            del self.tenants[key]
            self.evicted += 1
            self._tombstones[key] = (tenant.experiment.last_finalized, tenant.experiment.attempt)
            while len(self._tombstones) > 100_000:
                self._tombstones.popitem(last=False)
        if tenant.writer is not None:
            tenant.writer.report(self._status_of(tenant), None)
            tenant.writer.request_close(self.config.stop_timeout)
        if tenant.log is not None:
            tenant.log.close()
        if tenant.experiment.traces.file is not None:
            with tenant.lock:
                tenant.experiment.traces.file.close()

    def _tenant_error(self, tenant: Tenant, where: str, exc: BaseException) -> None:
        tenant.errors += 1
        tenant.last_error = f"{where}: {type(exc).__name__}: {exc}"[:500]
        if tenant.errors == 1 or tenant.errors % 1000 == 0:
            self._internal_error(f"{tenant.experiment.name[:96]}: {where}", exc)

    def _internal_error(self, where: str, exc: BaseException) -> None:
        message = f"rankscope sink: internal error in {where}: {exc!r}"
        self.internal_errors.append(message)
        del self.internal_errors[:-100]
        log.error("%s\n%s", message, "".join(traceback.format_exception(exc)))
