"""Opening runs: each Resource resolved to its run (``runbook``: a launch is a run, a resuming launch
continues its run), a run's tenant opened on its first data (its step book, its write-ahead log,
its capture book) or reopened where an eviction or a crash left it (``durable.replay``), and what
the run book says of a run saved with its log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...core import names as attr
from ...core.paths import safe_component
from ..book.retained import Retention
from ..book.step_book import StepBook
from ..book.traces import SpanFile, TraceStore
from ..checked import OnError, Refusals, ResourceBatch
from ..config import SinkConfig
from ..durable.descriptors import out_of_descriptors
from ..durable.kept import KEPT, KeptFile
from ..durable.replay import replay
from ..durable.wal import WriteAheadLog
from ..edge.errors import Kind, OverloadedError
from ..edge.ports import LOCAL, Client
from ..views.captures import CaptureBook
from .closed import ClosedRuns
from .closing import Closer
from .disk import Claim
from .registry import Tenants
from .runbook import ENDED, RESUME, Refused, Resolved, Retried, Run, RunKey
from .tenant import Tenant
from .view_configs import ViewConfigs

log = logging.getLogger("rankscope.sink")

OnRefused = Callable[[Refusals], None]
"""Told of what a request left for its retry (the sink's tally: the status route counts it)."""


class Openings:
    """The runs one request may still open (``Limits.max_new_runs``), while its client waits: made per
    request (``Opener.openings``), handed to each ``Opener.resolve`` of it. Opening a run costs its
    log and its views (milliseconds, an fsync), so a request naming thousands would hold a worker
    for minutes, long after its client gave up: past the bound, or once the client went away, a
    run is not opened, its points wait for the client's retry (``check``), and what the request
    took meanwhile is known by its digests then, not merged twice."""

    def __init__(self, limit: int, client: Client = LOCAL, *, whole: bool = False) -> None:
        self.left = limit
        self.limit = limit
        self.client = client
        self.whole = whole
        """The request takes nothing until all its runs are open (``Opener.resolve_first``)."""
        self.deferred = 0
        """Points whose run was not opened."""
        self.kind: Kind | None = None
        self.reason = ""

    def take(self, points: int) -> str | None:
        """One more run opens (None), or why not: its ``points`` wait for the retry."""
        if not self.client.alive():
            self.kind = Kind.CLIENT_GONE
            self.reason = "the client went away while its request was taken; runs it named were not opened"
        elif self.left > 0:
            self.left -= 1
            return None
        elif self.kind is None:
            self.kind = Kind.OPENING
            self.reason = f"request opening more than {self.limit} runs (limit max_new_runs); " + (
                "nothing taken yet, retry (the runs opened wait for it)"
                if self.whole
                else "those opened took their data, retry for the rest"
            )
        self.deferred += points
        return self.reason

    def check(self) -> None:
        """Raise ``OverloadedError`` (OPENING, CLIENT_GONE) when a run of the request was not opened."""
        if self.kind is not None:
            raise OverloadedError(self.kind, self.reason)


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
        self.retention = Retention(config.retained_bytes)
        """The bytes every run's kept steps share (``book.retained``)."""

    def resolve(
        self,
        experiment_id: str,
        resource: dict[str, Any],
        refused: Refusals,
        n: int,
        client: Client = LOCAL,
        digest: bytes = b"",
        opening: Openings | None = None,
    ) -> Tenant | None:
        """The tenant of the run this Resource's data belongs to (``runbook``), created (or reopened) on
        first data; None when it is refused: an experiment outside the ``client``'s scope, another
        scope's run, a finished run, a resume refused, past a bound on runs (``quotas``), and when it
        is a retry (its ``digest``) of a goodbye the run took (answered as taken); a run to open past
        the request's ``opening`` waits for its retry. The Resource is rewritten to the run and
        attempt it counts as, so the write-ahead log holds them."""
        scope = client.scope
        if not scope.allows(experiment_id):
            refused.add(n, f"experiment {experiment_id[:64]!r} is not among those of this token's {scope.label}")
            return None
        with self._registry.lock:  # one section: the run resolved is the run opened
            resolved = self._registry.runs.resolve(experiment_id, resource, scope.name, digest)
            if isinstance(resolved, Retried):
                return None  # taken before: nothing refused, nothing taken again
            if isinstance(resolved, Refused):
                counted = self._refused(resolved, refused, n, scope.name)
            else:
                taken = self._open_run(experiment_id, resource, resolved, refused, n, client, opening)
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

    def _refused(self, resolved: Refused, refused: Refusals, n: int, owner: str) -> Tenant | None:
        """A refusal of the run book, answered and noted as ``owner``'s (the asking scope's name,
        under the registry lock); the open run whose status counts it, if any."""
        refused.add(n, resolved.reason)
        if resolved.kind == RESUME:
            self._registry.note(resolved.reason, owner)
        counted = self._registry.open.get(resolved.key) if resolved.key is not None else None
        if counted is None:  # a closed run's last status counts it
            self._closed.count_refused(resolved, n)
        return counted

    def _open_run(
        self,
        experiment: str,
        resource: dict[str, Any],
        resolved: Resolved,
        refused: Refusals,
        n: int,
        client: Client,
        opening: Openings | None = None,
    ) -> tuple[Tenant | None, dict[str, Any] | None]:
        """The tenant of a run the book resolved, opened on first data, and the run's record to
        save when it changed (under the registry lock)."""
        key = resolved.key
        resource[attr.RUN_ID] = key[1]
        resource[attr.EXPERIMENT_ATTEMPT] = resolved.attempt
        tenant = self._registry.open.get(key)
        if tenant is None:
            disk = self._registry.disk
            full = opening.take(n) if opening is not None else None  # the request's share of openings
            claim = Claim()
            full = full or disk.admit(claim, client.quota_key, self._view_configs.run_bytes(experiment))
            if full is None and (full := self._admit(experiment, client.quota_key)) is not None:
                disk.forget(claim)
            if full is not None:
                if resolved.created:
                    self._registry.runs.forget(key)
                refused.add(n, full)
                return None, None
            try:
                tenant = self._new(key, client.quota_key, claim)
            except OSError as exc:  # its write-ahead log cannot be opened (disk full, permissions)
                disk.forget(claim)
                if resolved.created:
                    self._registry.runs.forget(key)
                refused.add(n, self._open_failed(key, exc))
                return None, None
            self._registry.add(tenant)
        else:
            self._registry.quotas.touched(key, tenant.client)
        if resolved.note is not None:
            self._registry.note(resolved.note, client.scope.name)
        return tenant, resolved.changed.record() if resolved.changed is not None else None

    def openings(self, client: Client = LOCAL) -> Openings:
        """What one request of ``client`` may open (``Limits.max_new_runs``), for its ``resolve`` calls."""
        return Openings(self.config.limits.max_new_runs, client)

    def resolve_first(
        self, parts: Sequence[tuple[str, dict[str, Any], Refusals, int]], client: Client, on_deferred: OnRefused
    ) -> list[Tenant | None]:
        """The tenant of each part of a traces or logs request ((experiment, resource, where its
        refusals go, its records): ``resolve``), every run it names opened before any of it is taken.
        Spans and log records have no digest to know a retry by, so a request that would open more
        than ``max_new_runs`` runs, or whose client went away meanwhile, raises ``OverloadedError``
        (OPENING, CLIENT_GONE; what waits told to ``on_deferred``) having taken nothing: its retry
        finds open the runs this one opened, and takes it whole."""
        opening = Openings(self.config.limits.max_new_runs, client, whole=True)
        tenants = [self.resolve(e, resource, refused, n, client, opening=opening) for e, resource, refused, n in parts]
        if opening.kind is not None:
            on_deferred(Refusals(opening.deferred, [opening.reason], opening.deferred))
            opening.check()
        return tenants

    def settle(self, tenant: Tenant, ended: bool, attempt: int, batch: ResourceBatch | None = None) -> None:
        """Tell the run book what the run's step book says after a request (``RunBook.settle``):
        its ``attempt`` is over (``ended``: ``Roster.finished``), or not any more; and the digest of
        the request's ``batch`` if it said goodbye and the run took it (its retry is answered as taken).
        Written with the run's record, without an fsync (a flood of runs that end costs none per goodbye):
        a finished run stays finished across its closing and the sink's crash or restart, not the machine's."""
        run = self._registry.runs.get(tenant.key)  # a look without the lock; any change is made under it
        if run is None:
            return
        taken = batch is not None and batch.goodbye and batch.digest in tenant.book.seen  # not refused, not failed
        goodbye = batch.digest if batch is not None and taken else b""
        if not goodbye or goodbye.hex() in run.goodbyes:
            if ended:
                if run.ended is not None and run.ended[0] >= attempt:
                    return  # known
            elif run.ended is None or run.ended[0] != attempt:
                return  # nothing to take back
        with self._registry.lock:
            changed = self._registry.runs.settle(tenant.key, attempt, ended, goodbye)
            record = changed.record() if changed is not None else None
        if record is not None:
            self.save_meta(tenant, record, sync=False)

    def save_meta(self, tenant: Tenant, record: dict[str, Any], *, sync: bool = True) -> None:
        """Persist a run's record (a snapshot ``Run.record`` took under the registry lock) outside
        that lock, since it fsyncs; a record no newer than the one saved already is not written."""
        if tenant.log is None:
            return
        with tenant.meta_lock:
            if record["version"] <= tenant.meta_version:
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

    def _new(self, key: RunKey, client: str = "", claim: Claim | None = None) -> Tenant:
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
            retention=self.retention,
        )
        book.keep_spans = self._view_configs.draws_gantt(experiment_id)
        known = self._registry.runs.get(key)
        record = known.record() if known is not None else None
        run_log = self.wal.open(experiment_id, run, record) if self.wal is not None else None
        where = [] if run_log is None else [(run_log.attempt, run_log.last_finalized)]
        if (tombstone := self._closed.exhume(key)) is not None:  # closed before: steps go on where they were
            where.append((tombstone[1], tombstone[0]))  # a retired run's log starts afresh: the later wins
        if where:
            attempt, last_finalized = max(where)
            book.restore(last_finalized, attempt)
        if run_log is not None:  # its kept steps on disk: a restarted sink corrects them whole
            book.steps.retained.attach(KeptFile(run_log.directory / KEPT), self.clock())
        for digest in known.goodbyes if known is not None else ():  # their retries, taken once (a restart)
            book.remember(bytes.fromhex(digest))
        captures = CaptureBook(self.clock, auto_interval=c.capture_interval)
        tenant = Tenant(book, run_log, captures, self.on_error, client=client, claim=claim)
        if run_log is not None and run_log.fresh and record is not None:  # its log's directory starts with it
            tenant.meta_version = record["version"]
        return tenant

    def _reopen(self, meta: dict[str, Any], attempt: int, seen: float) -> Tenant:
        """A run found in the write-ahead log, back in the run book, with a fresh tenant to replay into."""
        run = Run.restored(meta, attempt, seen)
        self._registry.runs.add(run)
        return self._new((run.experiment, run.run))

    def replay(self) -> None:
        """On start: what retired runs left back (``ClosedRuns.restore``), then every record the views
        had not written when the last sink stopped or died merged again; a run found with nothing
        to replay and no kept steps (``durable.kept``) is closed and retired at once (``Closer.close_found``)."""
        assert self.wal is not None
        retired = self._closed.restore()
        back, quiet = replay(self.wal, self._reopen, self._registry.note)
        with self._registry.lock:
            self._registry.runs.restore(retired)
        for tenant in back:
            tenant.dirty = True
            self._registry.add(tenant)
        waiting = [t for t in quiet if t.book.steps.retained.packed and not self._ended(t)]
        for tenant in waiting:  # its kept steps wait for late data, until it idles (``RunLimits.idle_timeout``)
            self._registry.add(tenant)
        self._closer.close_found([t for t in quiet if t not in waiting])

    def _ended(self, tenant: Tenant) -> bool:
        """Whether the run book says every process of the run said goodbye (no late data can come)."""
        run = self._registry.runs.get(tenant.key)
        return run is not None and run.ended is not None

    def _span_file(self, key: RunKey) -> SpanFile | None:
        if self.config.spans_dir is None:
            return None
        directory = self.config.spans_dir / safe_component(key[0])
        if key[1]:  # a run id never meets the run-less run's files
            directory = directory / "runs" / safe_component(key[1])
        return SpanFile(directory / "spans.jsonl", self.config.max_span_file_bytes)
