"""The sink: ingest decoded OTLP, align steps per experiment, hand finished steps to views.

Transports (``grpc_server``, ``http_server``) decode and call ``Sink.export_*``; those run
under one lock, so the OTLP response can say exactly how many points were rejected, and a
bounded count of requests in flight turns overload into a retryable answer instead of
an unbounded queue. A timer thread finalizes steps whose grace period ran out.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._internal import attributes as attr
from .._internal.wire import attributes_dict
from .experiment import Experiment, StepView
from .traces import TraceStore
from .views import ViewWriter

log = logging.getLogger("rankscope.sink")

DEFAULT_BACKENDS: dict[str, dict[str, Any]] = {"console": {"logging_mode": "global_reduce"}}


class OverloadedError(Exception):
    """More requests in flight than the sink takes; the client should retry later."""

    retry_after = 1


@dataclass(kw_only=True)
class SinkConfig:
    """How a sink listens and what it writes (CLI flags and ``RANKSCOPE_SINK_*`` map here)."""

    host: str = "127.0.0.1"
    grpc_port: int | None = 4317
    http_port: int | None = 4318
    backends: Mapping[str, Mapping[str, Any]] | None = None
    """Views for every experiment; None: each experiment's posted config, else console."""
    grace: float = 10.0
    token: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    max_in_flight: int = 64
    retain_steps: int = 16
    trace_retain_steps: int = 64
    """Steps whose spans an experiment keeps (``rankscope gantt``, straggler views)."""
    max_spans: int = 200_000
    """Spans an experiment keeps at most; the oldest steps go first."""
    grpc_workers: int = 8


@dataclass
class Result:
    accepted: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return "; ".join(self.errors[:8])


class Sink:
    """Receives OTLP from every process of every experiment and writes per-step views."""

    def __init__(self, config: SinkConfig | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or SinkConfig()
        self.clock = clock
        self.experiments: dict[str, Experiment] = {}
        self.writers: dict[str, ViewWriter] = {}
        self.posted_backends: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        self.spans_received = 0
        self.internal_errors: list[str] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._stop = threading.Event()
        self._servers: list[Any] = []
        self._timer = threading.Thread(target=self._tick, name="rankscope-sink-timer", daemon=True)
        self.grpc_port: int | None = None
        self.http_port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Sink:
        from .grpc_server import start_grpc
        from .http_server import start_http

        c = self.config
        if c.grpc_port is not None:
            server, self.grpc_port = start_grpc(self, c.host, c.grpc_port)
            self._servers.append(server)
        if c.http_port is not None:
            server, self.http_port = start_http(self, c.host, c.http_port)
            self._servers.append(server)
        self._timer.start()
        return self

    @property
    def endpoint(self) -> str:
        """``host:port`` of the gRPC receiver (what ``RANKSCOPE_ENDPOINT`` should say)."""
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"{host}:{self.grpc_port}"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop receiving, finalize every open step (naming what is missing), close the views."""
        if self._stop.is_set():
            return
        self._stop.set()
        for server in self._servers:
            server.stop()
        if self._timer.is_alive():
            self._timer.join(timeout)
        with self._lock:
            for experiment in self.experiments.values():
                self._write(experiment.id, experiment.ready(force=True))
            writers = list(self.writers.values())
        for writer in writers:  # all experiments' views finish side by side
            writer.request_close(timeout)
        deadline = time.monotonic() + timeout
        for writer in writers:
            if not writer.join(deadline - time.monotonic()):
                log.warning("rankscope sink: the views of %s did not finish within %.0fs", writer.experiment, timeout)

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- ingest (called by the transports) ------------------------------------------------

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """One request in flight under the ingest lock; over capacity raises ``OverloadedError``."""
        with self._in_flight_lock:
            if self._in_flight >= self.config.max_in_flight or self._stop.is_set():
                raise OverloadedError("the sink is at capacity" if not self._stop.is_set() else "the sink is stopping")
            self._in_flight += 1
        try:
            with self._lock:
                yield
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    def export_metrics(self, request: Any) -> Result:
        with self._admitted():
            return self._ingest_metrics(request)

    def export_logs(self, request: Any) -> Result:
        with self._admitted():
            return self._ingest_logs(request)

    def export_traces(self, request: Any) -> Result:
        with self._admitted():
            return self._ingest_traces(request)

    def _ingest_traces(self, request: Any) -> Result:
        """Store spans per experiment; spans of resources without an experiment id are accepted, not kept."""
        result = Result()
        for rs in request.resource_spans:
            n = sum(len(ss.spans) for ss in rs.scope_spans)
            self.spans_received += n
            resource = attributes_dict(rs.resource.attributes)
            experiment_id = resource.get(attr.EXPERIMENT_ID)
            if not isinstance(experiment_id, str) or not experiment_id:
                result.accepted += n
                continue
            experiment = self._experiment(experiment_id)
            try:
                accepted, rejected = experiment.traces.ingest(experiment.process_for(resource), rs.scope_spans)
            except Exception as exc:
                self._internal_error("trace ingest", exc)
                result.rejected += n
                continue
            result.accepted += accepted + (n - accepted - rejected)  # over the retention cap: kept count only
            result.rejected += rejected
            if rejected:
                result.errors.append(f"{rejected} spans with malformed trace or span ids")
        return result

    def spans(
        self, experiment_id: str, first: int | None = None, last: int | None = None, ranks: set[int] | None = None
    ) -> list[Any] | None:
        """Stored spans of an experiment (see ``sink.traces``), or None for an unknown experiment."""
        with self._lock:
            experiment = self.experiments.get(experiment_id)
            return None if experiment is None else experiment.traces.select(first, last, ranks)

    def _ingest_metrics(self, request: Any) -> Result:
        result = Result()
        for rm in request.resource_metrics:
            resource = attributes_dict(rm.resource.attributes)
            metrics = [m for sm in rm.scope_metrics for m in sm.metrics]
            experiment_id = resource.get(attr.EXPERIMENT_ID)
            if not isinstance(experiment_id, str) or not experiment_id:
                if any(m.name.startswith("rankscope") or _has_reduce(m) for m in metrics):
                    result.rejected += sum(_point_count(m) for m in metrics)
                    result.errors.append(f"resource without {attr.EXPERIMENT_ID}: points rejected")
                continue
            experiment = self._experiment(experiment_id)
            try:
                ingested, late = experiment.ingest(resource, metrics)
            except Exception as exc:  # a bug must not take the other clients down
                self._internal_error("ingest", exc)
                result.rejected += sum(_point_count(m) for m in metrics)
                continue
            result.accepted += ingested.accepted
            result.rejected += ingested.rejected
            result.errors.extend(ingested.errors)
            self._write(experiment_id, late)
            self._write(experiment_id, experiment.ready())
        return result

    def _ingest_logs(self, request: Any) -> Result:
        result = Result()
        for rl in request.resource_logs:
            resource = attributes_dict(rl.resource.attributes)
            experiment_id = resource.get(attr.EXPERIMENT_ID)
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    a = attributes_dict(record.attributes)
                    key, value = a.get(attr.STREAM_KEY), a.get(attr.STREAM_VALUE)
                    if not isinstance(key, str) or not isinstance(experiment_id, str):
                        result.accepted += 1  # an ordinary log record: accepted, not ours to view
                        continue
                    if not isinstance(value, (int, float)):
                        result.rejected += 1
                        result.errors.append(f"streamed {key!r} has no numeric {attr.STREAM_VALUE}")
                        continue
                    experiment = self._experiment(experiment_id)
                    step = a.get(attr.STEP)
                    experiment.ingest_stream(resource, key, float(value), step if isinstance(step, int) else None)
                    result.accepted += 1
            if isinstance(experiment_id, str) and experiment_id in self.experiments:
                experiment = self.experiments[experiment_id]
                streams, experiment.streams = experiment.streams, []
                writer = self._writer(experiment_id)
                for process, metric, step in streams:
                    writer.stream(process, metric, step)
        return result

    # -- control (HTTP routes used by embedded clients) ------------------------------------

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str:
        """An experiment's processes say which views they want (used when the sink has none)."""
        if self.config.backends is not None:
            return "ignored: this sink's views are fixed by its configuration"
        with self._lock:
            known = self.posted_backends.get(experiment_id)
            if known is None and experiment_id not in self.writers:
                self.posted_backends[experiment_id] = {k: dict(v) for k, v in backends.items()}
                return "ok"
            if known == backends:
                return "ok"
            return "ignored: this experiment's views are already configured"

    def status(self, experiment_id: str) -> dict[str, Any] | None:
        with self._lock:
            experiment = self.experiments.get(experiment_id)
            if experiment is None:
                return None
            return {
                "experiment": experiment_id,
                "last_finalized_step": experiment.last_finalized,
                "processes": len(experiment.processes),
                "late_points": experiment.late_points,
                "last_written_step": writer.written_step if (writer := self.writers.get(experiment_id)) else -1,
                "spans_stored": experiment.traces.count,
                "spans_dropped": experiment.traces.dropped,
            }

    def wait_written(self, experiment_id: str, timeout: float = 10.0) -> bool:
        """Block until the views of ``experiment_id`` wrote everything finalized so far."""
        writer = self.writers.get(experiment_id)
        return True if writer is None else writer.wait_idle(timeout)

    def finalize(self, experiment_id: str | None = None) -> None:
        """Finalize open steps now (naming what is missing) — used when the job has ended."""
        with self._lock:
            for experiment in list(self.experiments.values()):
                if experiment_id is None or experiment.id == experiment_id:
                    self._write(experiment.id, experiment.ready(force=True))

    # -- internals ----------------------------------------------------------------------

    def _experiment(self, experiment_id: str) -> Experiment:
        found = self.experiments.get(experiment_id)
        if found is None:
            found = self.experiments[experiment_id] = Experiment(
                experiment_id,
                grace=self.config.grace,
                retain_steps=self.config.retain_steps,
                clock=self.clock,
                traces=TraceStore(retain_steps=self.config.trace_retain_steps, max_spans=self.config.max_spans),
            )
        return found

    def _writer(self, experiment_id: str) -> ViewWriter:
        writer = self.writers.get(experiment_id)
        if writer is None:
            config = self.config.backends or self.posted_backends.get(experiment_id) or DEFAULT_BACKENDS
            writer = self.writers[experiment_id] = ViewWriter(experiment_id, config, self._internal_error)
        return writer

    def _write(self, experiment_id: str, views: list[StepView]) -> None:
        if views:
            writer = self._writer(experiment_id)
            for view in views:
                writer.step(view)

    def _tick(self) -> None:
        while not self._stop.wait(0.05):
            with self._lock:
                now = self.clock()
                for experiment in self.experiments.values():
                    deadline = experiment.next_deadline()
                    if deadline is not None and now >= deadline:
                        self._write(experiment.id, experiment.ready())

    def _internal_error(self, where: str, exc: BaseException) -> None:
        message = f"rankscope sink: internal error in {where}: {exc!r}"
        self.internal_errors.append(message)
        del self.internal_errors[:-100]
        log.error("%s\n%s", message, "".join(traceback.format_exception(exc)))


def _point_count(metric: Any) -> int:
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


def _has_reduce(metric: Any) -> bool:
    kind = metric.WhichOneof("data")
    if not kind:
        return False
    return any(kv.key == attr.REDUCE for p in getattr(metric, kind).data_points for kv in p.attributes)
