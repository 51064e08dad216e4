"""Opening runs: each Resource resolved to its run (``runbook``: a launch is a run, a resuming launch
continues its run), a run's tenant opened on its first data (its step book, its write-ahead log,
its capture book) or reopened where an eviction or a crash left it (``durable.replay``), and what
the run book says of a run saved with its log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...core import names as attr
from ...core.paths import safe_component
from ..book.step_book import StepBook
from ..book.traces import SpanFile, TraceStore
from ..checked import OnError, Refusals
from ..config import SinkConfig
from ..durable.descriptors import out_of_descriptors
from ..durable.replay import replay
from ..durable.wal import WriteAheadLog
from ..edge.ports import LOCAL, Client
from ..views.captures import CaptureBook
from .closed import ClosedRuns
from .closing import Closer
from .registry import Tenants
from .runbook import ENDED, RESUME, Refused, Resolved, Run, RunKey
from .tenant import Tenant
from .view_configs import ViewConfigs

log = logging.getLogger("rankscope.sink")


class Opener:
    """Resolves data to its run and opens (or reopens) the run's tenant."""

    def __init__(
        self,
        config: SinkConfig,
        registry: Tenants,
        closer: Closer,
        closed: ClosedRuns,
        view_configs: ViewConfigs,
        wal: WriteAheadLog | None,
        clock: Callable[[], float],
        on_error: OnError,
    ) -> None:
        self.config = config
        self._registry = registry
        self._closer = closer
        self._closed = closed
        self._view_configs = view_configs
        self.wal = wal
        self.clock = clock
        self.on_error = on_error

    def resolve(
        self, experiment_id: str, resource: dict[str, Any], refused: Refusals, n: int, client: Client = LOCAL
    ) -> Tenant | None:
        """The tenant of the run this Resource's data belongs to (``runbook``), created (or reopened) on
        first data; None when it is refused: an experiment outside the ``client``'s scope, another
        scope's run, a finished run, a resume refused, past a bound on runs (``quotas``). The Resource is
        rewritten to the run and attempt it counts as, so the write-ahead log holds them."""
        scope = client.scope
        if not scope.allows(experiment_id):
            refused.add(n, f"experiment {experiment_id[:64]!r} is not among those of this token's {scope.label}")
            return None
        with self._registry.lock:  # one section: the run resolved is the run opened
            resolved = self._registry.runs.resolve(experiment_id, resource, scope.name)
            if isinstance(resolved, Refused):
                counted = self._refused(resolved, refused, n)
            else:
                taken = self._open_run(experiment_id, resource, resolved, refused, n, client)
        if isinstance(resolved, Refused):
            if counted is not None:  # in the run's own status: whose data it refused, and why
                with counted.lock:
                    if resolved.kind == ENDED:
                        counted.book.counts.reused_points += n
                    elif resolved.kind != RESUME:
                        counted.book.counts.scope_refused += n
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
            self._registry.note(resolved.reason)
        counted = self._registry.open.get(resolved.key) if resolved.key is not None else None
        if counted is None:  # a closed run's last status counts it
            self._closed.count_refused(resolved, n)
        return counted

    def _open_run(
        self, experiment: str, resource: dict[str, Any], resolved: Resolved, refused: Refusals, n: int, client: Client
    ) -> tuple[Tenant | None, dict[str, Any] | None]:
        """The tenant of a run the book resolved, opened on first data, and the run's record to
        save when it changed (under the registry lock)."""
        key = resolved.key
        resource[attr.RUN_ID] = key[1]
        resource[attr.EXPERIMENT_ATTEMPT] = resolved.attempt
        tenant = self._registry.open.get(key)
        if tenant is None:
            full = self._admit(experiment, client.quota_key)
            if full is not None:
                if resolved.created:
                    self._registry.runs.forget(key)
                refused.add(n, full)
                return None, None
            try:
                tenant = self._new(key, client.quota_key)
            except OSError as exc:  # its write-ahead log cannot be opened (disk full, permissions)
                if resolved.created:
                    self._registry.runs.forget(key)
                refused.add(n, self._open_failed(key, exc))
                return None, None
            self._registry.add(tenant)
        else:
            self._registry.quotas.touched(key, tenant.client)
        if resolved.note is not None:
            self._registry.note(resolved.note)
        return tenant, resolved.changed.record() if resolved.changed is not None else None

    def settle(self, tenant: Tenant, ended: bool, attempt: int) -> None:
        """Tell the run book what the run's step book says after a request (``RunBook.settle``):
        its ``attempt`` is over (``ended``: ``Roster.finished``), or not any more. Written with the
        run's record, without an fsync (a flood of runs that end costs none per goodbye): a finished
        run stays finished across its closing and the sink's crash or restart, not the machine's."""
        run = self._registry.runs.get(tenant.key)  # a look without the lock; any change is made under it
        if run is None:
            return
        if ended:
            if run.ended is not None and run.ended[0] >= attempt:
                return  # known
        elif run.ended is None or run.ended[0] != attempt:
            return  # nothing to take back
        with self._registry.lock:
            changed = self._registry.runs.settle(tenant.key, attempt, ended)
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
            admission = self._registry.quotas.admit(experiment_id, client, self._registry.open, busy)
            if admission.refused is not None:
                return admission.refused
            retired = [key for key in admission.victims if self._closer.retire(self._registry.open[key])]
            self._registry.quotas.made(len(retired))
            if len(retired) == len(admission.victims):
                return None
            busy |= frozenset(key for key in admission.victims if key in self._registry.open)
        held = len(self._registry.open)
        return f"the sink holds {held} runs open and those that could make room are in use (limit); retry"

    def _open_failed(self, key: RunKey, exc: OSError) -> str:
        """Why a run whose write-ahead log could not be opened is refused (logged: see the sink's log)."""
        if out_of_descriptors(exc):  # counted and logged now and then, not once per request
            self._registry.descriptors.exhausted("open", exc)
            return "the sink is out of file descriptors; retry"
        log.error("rankscope sink: run %r of %r not opened: %r", key[1][:64], key[0][:64], exc)
        return "the sink cannot open this run's write-ahead log (see the sink's log)"

    def _new(self, key: RunKey, client: str = "") -> Tenant:
        """A fresh tenant for a run (under the registry lock); a closing of the same run finishes first."""
        experiment_id, run = key
        self._closer.take_back(key)  # a closing of the same run finishes first
        c = self.config
        book = StepBook(
            experiment_id,
            c.book,
            run=run,
            traces=TraceStore(retain_steps=c.trace_retain_steps, max_spans=c.max_spans, file=self._span_file(key)),
            on_error=self.on_error,
            clock=self.clock,
        )
        book.keep_spans = self._view_configs.draws_gantt(experiment_id)
        run_log = self.wal.open(experiment_id, run) if self.wal is not None else None
        if run_log is not None:
            book.restore(run_log.last_finalized, run_log.attempt)
        elif (tombstone := self._closed.exhume(key)) is not None:  # closed before: steps go on where they were
            book.restore(*tombstone)
        captures = CaptureBook(self.clock, auto_interval=c.capture_interval)
        return Tenant(book, run_log, captures, self.on_error, client=client)

    def _reopen(self, meta: dict[str, Any], attempt: int, seen: float) -> Tenant:
        """A run found in the write-ahead log, back in the run book, with a fresh tenant to replay into."""
        run = Run.restored(meta, attempt, seen)
        self._registry.runs.add(run)
        return self._new((run.experiment, run.run))

    def replay(self) -> None:
        """Re-merge every record the views had not written when the last sink stopped or died."""
        assert self.wal is not None
        for tenant in replay(self.wal, self._reopen, self._registry.note):
            tenant.dirty = True
            self._registry.add(tenant)

    def _span_file(self, key: RunKey) -> SpanFile | None:
        if self.config.spans_dir is None:
            return None
        directory = self.config.spans_dir / safe_component(key[0])
        if key[1]:  # a run id never meets the run-less run's files
            directory = directory / "runs" / safe_component(key[1])
        return SpanFile(directory / "spans.jsonl", self.config.max_span_file_bytes)
