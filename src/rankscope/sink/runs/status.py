"""A run's status: what the status route answers for it, and what a closing run leaves as its last."""

from __future__ import annotations

from typing import Any

from ..views.writer import DROP_KINDS
from .closed import ClosedRuns
from .registry import Tenants
from .tenant import Tenant


class RunStatus:
    """Reads a run's status under its own lock (the registry's only for the experiment's runs)."""

    def __init__(self, registry: Tenants, closed: ClosedRuns) -> None:
        self._registry = registry
        self._closed = closed

    def runs_of(self, experiment_id: str) -> list[dict[str, Any]]:
        """The experiment's runs, newest first (at most 100), as the status route lists them."""
        registry = self._registry
        with registry.lock:
            runs = registry.runs.runs(experiment_id)[-100:]
            listed = []
            for r in reversed(runs):
                tenant = registry.open.get((experiment_id, r.run))
                last: int | None
                if tenant is not None:
                    last = tenant.book.last_finalized
                else:  # closed: where its tombstone says its steps ended (None once that is forgotten)
                    last = self._closed.last_step((experiment_id, r.run))
                listed.append(
                    {
                        "run": r.run,
                        "started": r.started,
                        "attempt": r.attempt,
                        "open": tenant is not None,
                        "last_finalized_step": last,
                        "resumed_by": sorted(r.launches)[:16],
                        "scope": r.owner,
                        "ended": r.ended is not None,
                    }
                )
            return listed

    def closed(self, experiment_id: str, run: str | None = None) -> dict[str, Any] | None:
        """A closed run's last status (run None: the experiment's latest run), if still kept, with the
        experiment's runs as they are now."""
        found = self._closed.status_of(experiment_id, run)
        if found is not None:
            found["runs"] = self.runs_of(experiment_id)
        return found

    def of(self, tenant: Tenant) -> dict[str, Any]:
        """The status route's answer for an open run (also a closing run's last, kept by ``closed``)."""
        runs = self.runs_of(tenant.book.id)
        with tenant.lock:
            e, n = tenant.book, tenant.book.counts
            processes, upstreams = e.roster.counts()
            views = tenant.writer.status() if tenant.writer is not None else {}
            written = [v["last_written_step"] for v in views.values() if not v["disabled"]]
            return {
                "experiment": e.id,
                "run": e.run,
                "open": True,
                "client": tenant.client,
                "descriptors": {"held": self._registry.descriptors.holds(tenant), "releases": tenant.releases},
                "attempt": e.attempt,
                "runs": runs,
                "last_finalized_step": e.last_finalized,
                "open_steps": len(e.steps.open),
                "failed": list(e.roster.failed()[0]),  # the attempt's processes an exception ended (first 8)
                "processes": processes,
                "ranks": e.roster.ranks(),
                "unplaced_rank_sets": e.roster.unplaced_rank_sets,
                "merge_upstreams": upstreams,
                "points": n.points,
                "merged_points": n.merged_points,
                "late_points": n.late_points,
                "partial_points": n.partial_points,
                "kept_steps": e.steps.retained.status(),
                "abandoned_steps": n.abandoned_steps,
                "superseded_points": n.superseded_points,
                "attempt_fallbacks": {"count": e.roster.fallback_count, "processes": list(e.roster.fallbacks)},
                "reused_run_points": n.reused_points,
                "scope_refused_points": n.scope_refused,
                "refused_points": n.refused,
                "foreign_points": n.foreign_points,
                "series_overflow": e.streams.overflowed,
                "plain_stale_points": e.streams.stale,
                "plain_streams_forgotten": e.streams.forgotten,
                "log_records": n.log_records,
                "sample_rows": n.sample_rows,
                **e.watch.status(),
                "captures": tenant.captures.status(),
                "time_bucketed": e.windows.bucketed,
                "internal_errors": n.internal_errors + tenant.errors,
                "last_error": tenant.last_error,
                "last_written_step": min(written) if written else -1,
                "views": views,
                "view_drops": dict(tenant.writer.drops) if tenant.writer is not None else dict.fromkeys(DROP_KINDS, 0),
                "spans_stored": e.traces.count,
                "spans_dropped": e.traces.dropped,
                "spans_refused": e.traces.refused,
                "span_attributes_left_out": e.traces.attributes_left_out,
                "span_file": e.traces.file.status() if e.traces.file is not None else None,
            }
