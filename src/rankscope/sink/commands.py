"""What the control routes change at the sink: ``Commands`` is the edge's ``ControlCommands`` port.

An experiment's view config posted by its processes, a run's finished steps finalized and
written now (``wait_written``), a report page written now, a profiler capture asked of a run's
processes (by a person; a detector's go through ``views.captures``), taken by the processes
that poll for it, and a capture's file uploaded and announced. Each acts under the run's own lock; none holds the
registry's while it waits on views (``report``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ..backends.base import LoggerBackend
from ..core.anomalies import Capture
from .edge.errors import Kind, Refusal
from .edge.gate import Gate
from .queries import Queries
from .runs.registry import Tenants
from .runs.tenant import Tenant
from .runs.view_configs import ViewConfigs


class Commands:
    """The sink's answers to what its control routes ask it to do (``edge.ports.ControlCommands``)."""

    def __init__(
        self,
        queries: Queries,
        tenants: Tenants,
        view_configs: ViewConfigs,
        gate: Gate,
        finalize: Callable[[Tenant], None],
    ) -> None:
        self._queries = queries
        self._tenants = tenants
        self._views = view_configs
        self._gate = gate
        """Uploads count against ``max_in_flight`` like exports."""
        self._finalize = finalize
        """Finalize a run's finished steps now (the coordinator's ``Sink._finalize``)."""

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str:
        """An experiment's processes say which views they want (``ViewConfigs.configure``)."""
        return self._views.configure(experiment_id, backends)

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> list[str] | Refusal:
        """Write a run's report page (None: the experiment's latest run) now, after every step
        finalized so far, and return where; a ``Refusal`` says why not (no such experiment, no report
        view, too slow)."""
        tenant = self._tenants.find(experiment_id, run)
        if tenant is None:
            return Refusal(
                Kind.NOT_FOUND, f"no experiment {experiment_id[:200]!r}" + (f" run {run[:64]!r}" if run else "")
            )
        deadline = time.monotonic() + timeout
        run = tenant.book.run
        with tenant.lock:  # asked for now: what is complete is final, the run's first seconds or not
            tenant.book.readiness.end_hold()
        self.wait_written(experiment_id, timeout, run)
        status = self._queries.status(experiment_id, run)
        writer = tenant.writer
        if writer is None or writer.closed.is_set():  # never open its views with a config it did not choose
            return Refusal(
                Kind.CONFLICT, f"no step of experiment {experiment_id[:200]!r} is finalized yet: no view is open"
            )
        paths = writer.report(status, max(0.0, deadline - time.monotonic()))
        if paths:
            return paths
        if not any(type(v.backend).report is not LoggerBackend.report for v in writer.views if not v.disabled):
            names = [v.name for v in writer.views if not v.disabled]
            return Refusal(
                Kind.CONFLICT,
                f"experiment {experiment_id[:200]!r} has no report view (its views: {', '.join(names) or 'none'}); "
                'add {"report": {}} to its backends, or run the sink with --report',
            )
        return Refusal(
            Kind.CONFLICT,
            f"the report of {experiment_id[:200]!r} was not written within {timeout:.0f}s (see the status route)",
        )

    def capture(
        self,
        experiment_id: str,
        reason: str,
        steps: int,
        ranks: frozenset[int] | None = None,
        run: str | None = None,
    ) -> dict[str, Any] | Refusal:
        """Ask a run's processes (``ranks``; None: all; run None: the experiment's latest) to profile
        their next ``steps`` steps; returns the capture, or why not (unknown experiment, rate limit)."""
        tenant = self._tenants.find(experiment_id, run)
        if tenant is None:
            return Refusal(Kind.NOT_FOUND, f"no experiment {experiment_id[:200]!r}")
        with tenant.lock:
            asked = tenant.captures.ask(reason, steps, ranks=ranks)
        return Refusal(Kind.RATE_LIMITED, asked) if isinstance(asked, str) else asked.status()

    def store_capture(self, experiment_id: str, capture_id: str, process_id: str, data: bytes) -> str:
        """Write a process's trace of a capture it picked up (checked again: ``capture_target``),
        then announce it; returns its path."""
        with self._gate:  # uploads count against max_in_flight like exports
            path = self._queries.capture_target(experiment_id, capture_id, process_id, len(data))
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            partial.write_bytes(data)
            partial.replace(path)  # a reader never sees half a file
            tenant = self._tenants.of_process(experiment_id, process_id)
            assert tenant is not None  # capture_target found it; runs are never dropped while a process writes
            with tenant.lock:
                book = tenant.book
                process = book.roster.processes[process_id]
                capture = tenant.captures.stored(capture_id, process, path, len(data))
                record = Capture(
                    capture=capture_id,
                    reason=capture.reason if capture is not None else "",
                    steps=capture.steps if capture is not None else None,
                    process=process.label,
                    role=process.role,
                    replica=process.replica,
                    rank=process.rank,
                    path=str(path.resolve()),
                    bytes=len(data),
                )
                book.watch.note(record)
                step = book.last_finalized if book.last_finalized >= 0 else None
                self._views.writer(tenant).anomaly(record, step)
            return str(path)

    def wait_written(self, experiment_id: str, timeout: float = 10.0, run: str | None = None) -> bool:
        """Block until the views of a run (None: the experiment's latest) wrote everything finalized so far."""
        tenant = self._tenants.find(experiment_id, run)
        if tenant is None:
            return True
        self._finalize(tenant)
        return True if tenant.writer is None else tenant.writer.wait_idle(timeout)

    def pending_captures(self, experiment_id: str, process_id: str) -> list[dict[str, Any]]:
        """The capture requests a process has not picked up yet (it polls for them): marked taken."""
        tenant = self._tenants.of_process(experiment_id, process_id)
        if tenant is None:
            return []
        with tenant.lock:
            process = tenant.book.roster.processes.get(process_id)
            return [] if process is None else tenant.captures.pending(process)
