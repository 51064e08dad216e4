"""A run's views: which ones an experiment gets (the sink's, else those its processes posted, else
the console), and its view writer, opened on first use on the sink's pool of view threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ...backends.base import LoggerBackend, get_backend_class
from ..checked import OnError
from ..config import DEFAULT_BACKENDS, SinkConfig
from ..edge.ports import Spawn
from ..edge.validate import check_posted_views, root_posted_views
from ..tally import Tally
from ..views.writer import ViewPool, ViewWriter
from .registry import Tenants
from .tenant import Tenant


class ViewConfigs:
    """The views of every run: their configs, and their writers on one pool of threads."""

    def __init__(self, config: SinkConfig, registry: Tenants, tally: Tally, on_error: OnError, spawn: Spawn) -> None:
        self._config = config
        self._registry = registry
        self._tally = tally
        self._on_error = on_error
        self._spawn = spawn
        self.posted_backends: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        """The views each experiment's processes asked for (used when the sink has none)."""
        self.pool: ViewPool | None = None
        """The threads that write every run's views (``start``: the sink's threads start with it)."""
        self._gantt_backends: dict[str, bool] = {}
        self._bytes_of: dict[str, int] = {}
        self._pool_lock = threading.Lock()

    def configure(self, experiment_id: str, backends: Mapping[str, Mapping[str, Any]]) -> str:
        """An experiment's processes say which views they want (used when the sink has none)."""
        if self._config.backends is not None:
            return "ignored: this sink's views are fixed by its configuration"
        if not self._config.trust_posted_paths:
            why = check_posted_views(backends)
            if why is not None:
                return f"refused: {why}"
            backends = root_posted_views(experiment_id, backends)
        registry = self._registry
        with registry.lock:
            known = self.posted_backends.get(experiment_id)
            tenants = [t for k, t in registry.open.items() if k[0] == experiment_id]
            if known is None and all(t.writer is None for t in tenants):
                if len(self.posted_backends) >= self._config.runs.max_open and not self._forget_a_config():
                    return "ignored: this sink holds too many experiments"
                self.posted_backends[experiment_id] = {k: dict(v) for k, v in backends.items()}
                for tenant in tenants:
                    with tenant.lock:  # the views open under it: the flag and the views agree
                        if tenant.writer is None:
                            tenant.book.keep_spans = self.draws_gantt(experiment_id)
                return "ok"
            if known == backends:
                return "ok"
            return "ignored: this experiment's views are already configured"

    def draws_gantt(self, experiment_id: str) -> bool:
        """Whether the views this experiment will get include one that draws a Gantt (the report):
        then its step views carry their spans, from the first step."""
        if any(self._gantt_backend(str(o.get("backend", name))) for name, o in self._config.added_views.items()):
            return True
        return any(self._gantt_backend(str(o.get("backend", name))) for name, o in self._of(experiment_id).items())

    def run_bytes(self, experiment_id: str) -> int:
        """Bytes a run of this experiment's views writes at least (``LoggerBackend.run_bytes``):
        what the disk budget reserves for it (``runs.disk``)."""
        config = self._with_kept(self._of(experiment_id))
        return sum(self._backend_bytes(str(o.get("backend", name))) for name, o in config.items())

    def writer(self, tenant: Tenant) -> ViewWriter:
        """The tenant's views, opened on first use. Caller holds ``tenant.lock``."""
        if tenant.writer is None:
            experiment_id = tenant.book.id
            descriptors = self._registry.descriptors
            on_written = tenant.log.written_view if tenant.log is not None else None
            tenant.writer = ViewWriter(
                experiment_id,
                self._with_kept(self._of(experiment_id)),
                self._on_error,
                self._started_pool(),
                on_written=on_written,
                on_drop=self._tally.view_drop,
                on_open=lambda views: descriptors.hold(views, views.descriptors, refusable=False),
                on_closed=descriptors.forget,
                run=tenant.book.run,
                client=tenant.client,
            )
            tenant.book.keep_spans = any(
                type(v.backend).report is not LoggerBackend.report for v in tenant.writer.views
            )
        return tenant.writer

    def start(self) -> None:
        """The view threads start (``Sink.start``)."""
        with self._pool_lock:
            if self.pool is None:
                self.pool = ViewPool(self._config.view_workers, self._spawn)

    def stop(self, timeout: float) -> None:
        """The view threads end (the sink is stopping), after what they have queued."""
        with self._pool_lock:
            pool = self.pool
        if pool is not None:
            pool.stop(timeout)

    def _started_pool(self) -> ViewPool:
        pool = self.pool
        if pool is None:
            raise RuntimeError("a run's views are written once the sink is started (Sink.start)")
        return pool

    def _of(self, experiment_id: str) -> Mapping[str, Mapping[str, Any]]:
        """The views an experiment gets: the sink's, else the ones its processes posted, else the console."""
        return self._config.backends or self.posted_backends.get(experiment_id) or DEFAULT_BACKENDS

    def _with_kept(self, config: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
        """With the views the sink adds to every run (``SinkConfig.added_views``), each unless the
        run's views have one of its backend writing to the same ``path`` already (a ``jsonl`` view
        of the user's own writes where it says: the run's ``metrics.jsonl`` is kept beside it)."""
        added = self._config.added_views
        if not added:
            return config
        have = {(str(v.get("backend", k)), str(v.get("path"))) for k, v in config.items()}  # a posted path: any JSON
        extra = {
            (k if k not in config else f"kept_{k}"): v  # a view of the user's own named alike keeps its name
            for k, v in added.items()
            if (str(v.get("backend", k)), str(v.get("path"))) not in have
        }
        return {**config, **extra} if extra else config

    def _backend_bytes(self, name: str) -> int:
        """``run_bytes`` of backend ``name`` (0: unknown, named when its views open; cached as
        ``_gantt_backend``)."""
        found = self._bytes_of.get(name)
        if found is None:
            try:
                found = int(get_backend_class(name).run_bytes)
            except Exception:
                found = 0
            if len(self._bytes_of) < 256:
                self._bytes_of[name] = found
        return found

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

    def _forget_a_config(self) -> bool:
        """Make room for a posted config: the oldest one of an experiment with no run open goes
        (configs of experiments never seen again must not fill the sink for its lifetime)."""
        open_experiments = {e for e, _ in self._registry.open}
        for experiment_id in self.posted_backends:
            if experiment_id not in open_experiments:
                del self.posted_backends[experiment_id]
                return True
        return False
