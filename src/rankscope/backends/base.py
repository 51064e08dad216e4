"""The backend interface (Forge's LoggerBackend) and the registry that finds backends.

A backend gets ``init`` once, ``log_batch`` with reduced metrics at each flush (modes
``per_rank_reduce`` and ``global_reduce``), ``log_stream`` with every raw value (mode
``per_rank_no_reduce``) and ``finish`` at shutdown. Methods may be ``async``; rankscope
runs them to completion. Third parties ship one through the ``rankscope.backends`` entry
point group, or call ``register_backend``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ..core.anomalies import Anomaly
from ..metrics.reduce import Reduce


class LoggingMode(str, enum.Enum):
    GLOBAL_REDUCE = "global_reduce"
    PER_RANK_REDUCE = "per_rank_reduce"
    PER_RANK_NO_REDUCE = "per_rank_no_reduce"


@dataclass(frozen=True, slots=True)
class Metric:
    """One value handed to a backend: reduced (log_batch) or raw (log_stream)."""

    key: str
    value: float
    reduction: Reduce
    timestamp: float | None = None


class LoggerBackend:
    """Base class of backends; ``logger_backend_config`` is the backend's config dict.

    A backend that turns itself off in ``init`` instead of raising (so a job's other views go on)
    sets ``off_reason``; the sink then reports the view as off, with that reason, in its status.
    """

    off_reason: str | None = None
    descriptors: int = 1
    """File descriptors an open instance holds (a file it appends to): the sink's descriptor budget
    counts them (``sink.durable.descriptors``)."""
    location: str | None = None
    """Where this view writes (a path, a run directory or URL, ``stdout``), once ``init`` ran: the
    sink prints it for each new experiment and its status route lists it."""
    run_bytes: int = 0
    """Bytes a run of this view writes at least: what a sink reserves of a client's disk budget
    for each of its runs before the first is measured (``sink.runs.disk``)."""

    def __init__(self, logger_backend_config: dict[str, Any] | None = None) -> None:
        self.logger_backend_config = dict(logger_backend_config or {})
        mode = self.logger_backend_config.get("logging_mode", LoggingMode.PER_RANK_REDUCE)
        try:
            self.logging_mode = LoggingMode(mode)
        except ValueError:
            known = ", ".join(m.value for m in LoggingMode)
            raise ValueError(f"{type(self).__name__}: logging_mode {mode!r} is not one of {known}") from None

    def init(self, process_name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        """Called once before any data; ``process_name`` labels this process (role_replica_rRANK)."""
        self.process_name = process_name

    def log_batch(self, metrics: list[Metric], global_step: int | None, *args: Any, **kwargs: Any) -> Any:
        """Reduced metrics of one step (``global_step`` is None for periodic exports)."""

    def rewind(self, step: int) -> Any:
        """Steps from ``step`` on come again (a restarted or resumed run executes them again):
        drop or mark what this view holds of them; the next ``log_batch`` is ``step``'s."""

    def log_stream(self, metric: Metric, global_step: int | None, *args: Any, **kwargs: Any) -> Any:
        """One raw value, as recorded (only in ``per_rank_no_reduce`` mode)."""

    def log_record(self, record: dict[str, Any], global_step: int | None, *args: Any, **kwargs: Any) -> Any:
        """An ordinary OTel log record at a sink (``time``, ``severity``, ``body``, ``attributes``,
        ``trace_id``); ``kwargs`` name its process. Views that do not show logs ignore it."""

    def log_samples(
        self, table: str, rows: list[dict[str, Any]], global_step: int | None, *args: Any, **kwargs: Any
    ) -> Any:
        """A sample table's kept rows of one step (``record_sample``), each a ``sample_entry`` dict:
        the row under ``row`` plus its provenance. Global views get the experiment's selection,
        per-rank views their process's, ``per_rank_no_reduce`` views every row as recorded."""

    def log_anomaly(self, record: Anomaly, global_step: int | None, *args: Any, **kwargs: Any) -> Any:
        """What a sink's detectors found in a step: a typed record (``rankscope.core.anomalies``:
        ``NonFinite``, ``Straggler``, ``SlowStep``, ``Missing``, ``Interrupted``, ``Capture``);
        ``record.to_json()`` is its serialized form. Global views only."""

    def report(self, status: dict[str, Any] | None = None) -> str | None:
        """Write this view's page now and return its path (the ``report`` view; ``status`` is
        the sink's status of the experiment). Views that write as they go return None."""
        return None

    def keep_files(self, paths: list[str], status: dict[str, Any] | None = None) -> Any:
        """The pages the run's views just wrote (``paths``: what their ``report`` returned) and
        the sink's ``status`` of the run, after every view's ``report``: a view that keeps a run's
        files (MLflow's artifacts) keeps them. Views that do not ignore it."""

    def health(self) -> dict[str, Any] | None:
        """What this view says of itself in the sink's status route (``views.NAME.health``): a view
        with a queue of its own (MLflow's sender) says what it holds and dropped. Read from another
        thread than the view's: plain counters only. None: nothing."""
        return None

    def finishing(self) -> Any:
        """The run's views are about to finish (at a sink, each view's before any ``finish``): a view
        that sends from a thread of its own starts its last drain here, so that several drain at
        once within the sink's stop timeout. Views that do not ignore it."""

    def finish(self) -> Any:
        """Called once at shutdown, after the last batch."""


def short_run(run: str) -> str:
    """The part of a run id a person tells runs apart by: generated ids end in 8 random hex digits."""
    return run if len(run) <= 12 else run[-8:]


def sample_entry(
    table: str,
    step: int | None,
    side: str,
    row: dict[str, Any],
    *,
    time_unix_nano: int,
    trace_id: str | None,
    span_id: str | None,
    policy_version: int | None,
    process: str | None,
    role: str | None = None,
    replica: str | None = None,
    rank: int | None = None,
) -> dict[str, Any]:
    """What every backend gets for one sample row: the row and its provenance columns."""
    return {
        "table": table,
        "step": step,
        "side": side,
        "row": row,
        "role": role,
        "replica": replica,
        "rank": rank,
        "process": process,
        "policy_version": policy_version,
        "trace_id": trace_id or None,
        "span_id": span_id or None,
        "time": time_unix_nano / 1e9,
    }


PROVENANCE_COLUMNS = (
    *("step", "side", "role", "replica", "rank", "process"),
    *("policy_version", "trace_id", "span_id", "time"),
)
"""The columns ``sample_entry`` adds to a row, in the order tables show them."""


_BACKENDS: dict[str, type[LoggerBackend]] = {}


def register_backend(name: str, backend_class: type[LoggerBackend]) -> None:
    if not (isinstance(backend_class, type) and issubclass(backend_class, LoggerBackend)):
        raise TypeError(f"register_backend({name!r}): {backend_class!r} is not a LoggerBackend subclass")
    _BACKENDS[name] = backend_class


def make_view(name: str, options: Mapping[str, Any], *, mode: LoggingMode | None = None) -> LoggerBackend:
    """The backend of view ``name`` (its ``backend`` option, else its name), made from its options;
    ``mode``: the logging mode when the options name none. A bad configuration (an unknown backend,
    a bad option) raises ``ValueError`` naming the view; a backend's missing package, ``ImportError``."""
    config = dict(options)
    if mode is not None:
        config.setdefault("logging_mode", mode.value)
    try:
        return get_backend_class(str(config.get("backend", name)))(config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"view {name!r}: {exc}") from None


def check_views(views: Mapping[str, Mapping[str, Any]]) -> None:
    """Make each view once, so that a misspelled backend or a bad option raises ``ValueError`` where
    the views are configured (``init``, a sink's ``--backends``), not later in a sink where the job
    cannot see it. A backend whose package is missing is left for the sink to say (it may differ)."""
    for name, options in views.items():
        if not isinstance(options, Mapping):
            raise ValueError(f"view {name!r}: its options must be a JSON object, got {type(options).__name__}")
        try:
            make_view(name, options)
        except ImportError:
            continue


def get_backend_class(name: str) -> type[LoggerBackend]:
    """Find a backend by name: registered ones first, then ``rankscope.backends`` entry points."""
    found = _BACKENDS.get(name)
    if found is None:
        for ep in entry_points(group="rankscope.backends"):
            if ep.name == name:
                found = ep.load()
                register_backend(name, found)
                break
    if found is None:
        known = sorted({*_BACKENDS, *(ep.name for ep in entry_points(group="rankscope.backends"))})
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(known)}")
    return found
