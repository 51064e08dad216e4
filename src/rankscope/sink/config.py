"""How a sink listens, what it writes and what one client may make it hold: ``SinkConfig``.

CLI flags and ``RANKSCOPE_SINK_*`` map here. What travels together is nested, each part declared
and validated where it is used: ``transport`` (``edge.ports.Transport``: what the servers read),
``limits`` (``checked.Limits``: what one request may carry), ``book`` (``book.config.BookConfig``:
one run's step book, with its ``ExperimentLimits`` and detector ``Thresholds``), ``runs``
(``RunLimits``: the runs the sink holds) and ``disk`` (``DiskLimits``: what their views may write).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .book.config import BookConfig
from .checked import Limits
from .edge.ports import Transport

DEFAULT_BACKENDS: dict[str, dict[str, Any]] = {"console": {"logging_mode": "global_reduce"}}
"""The views of an experiment when neither the sink nor the experiment's processes chose any."""

REPORT_VIEW: dict[str, dict[str, Any]] = {"report": {"logging_mode": "global_reduce"}}
"""What ``rankscope sink --report`` adds to every run's views: its HTML page."""

KEPT_BACKENDS: dict[str, dict[str, Any]] = {
    **REPORT_VIEW,
    "metrics": {
        "backend": "jsonl",
        "logging_mode": "global_reduce",
        "path": "rankscope_logs/{experiment}/{run}/metrics.jsonl",
    },
}
"""What a job's sink adds to every run's views so that the run is kept on disk (``SinkConfig.added_views``):
its report page and its global values as JSONL, in ``rankscope_logs/EXPERIMENT/RUN/``."""


GiB = 1 << 30

JOB_START_HOLD = 2.0
"""``start_hold`` of the sink of one job, whose processes start together (embedded, ``rankscope run``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """How many runs the sink holds open, who may open them, and when an open run lets go."""

    max_open: int = 4096
    """Runs of every experiment open at once; when full, an ended or quiet run closes to make room."""
    per_experiment: int = 256
    """Runs of one experiment open at once, not counting those that ended."""
    per_client: int = 0
    """Runs one client (its token's scope, else its address: an IPv6 one by its /64) opened that
    are open and have not ended. 0: an eighth of ``max_open`` (512), so that fewer than eight
    clients cannot fill the sink, tokens or not. A Collector gateway is one client: give it a token of its own,
    or raise this."""
    quiet_after: float = 60.0
    """Seconds without data after which a run gives its file descriptors back (its log's segment,
    its views' files; reopened on new data)."""
    idle_timeout: float = 300.0
    """Seconds without data after which a run with nothing open is closed (reopened on new data)."""
    close_ended: bool = True
    """Whether a run all of whose processes said goodbye closes once its views wrote everything
    (``grace`` seconds after the last goodbye). The sink of one job (``rankscope run``, the
    embedded sink) keeps it open until it stops: it asks for the run's spans and report then."""

    def __post_init__(self) -> None:
        if self.per_client == 0:
            object.__setattr__(self, "per_client", max(1, self.max_open // 8))
        if min(self.max_open, self.per_experiment, self.per_client) < 1:
            raise ValueError("run limits must be at least 1 (per_client 0: an eighth of max_open)")
        if not (self.quiet_after > 0 and self.idle_timeout > 0):
            raise ValueError("quiet_after and idle_timeout must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskLimits:
    """What the views of the sink's runs may write (``SinkConfig.disk``)."""

    per_client_bytes: int = 0
    """Bytes one client's runs' views may hold on disk; a new run past it is refused. 0: an
    eighth of the free space when the sink starts, at least 1 GiB."""
    min_free_bytes: int = 0
    """Free space the sink leaves on the views' file system: under it, new runs are refused. 0: 1 %
    of the file system, at least 1 GiB and at most 10 GiB (a 5 % floor refused every run of a job
    on a 250 GB disk with 13 GB free)."""
    where: Path = Path(".")
    """A path on the file system the views write to (the sink's working directory)."""

    def __post_init__(self) -> None:
        if self.per_client_bytes < 0 or self.min_free_bytes < 0:
            raise ValueError("disk: per_client_bytes and min_free_bytes must be >= 0 (0: derived)")

    def resolved(self) -> DiskLimits:
        """With the derived defaults filled in from the file system as it is now."""
        usage = shutil.disk_usage(self.where)
        per_client = self.per_client_bytes or max(GiB, usage.free // 8)
        floor = self.min_free_bytes or min(10 * GiB, max(GiB, usage.total // 100))
        return DiskLimits(per_client_bytes=per_client, min_free_bytes=floor, where=self.where)


@dataclass(kw_only=True)
class SinkConfig:
    """How a sink listens, what it writes and what one client may make it hold (the module docstring)."""

    grpc_port: int | None = 4317
    http_port: int | None = 4318
    transport: Transport = field(default_factory=Transport)
    """How the servers listen and whom they take (host, tokens, connection and body bounds)."""
    backends: Mapping[str, Mapping[str, Any]] | None = None
    """Views for every experiment; None: each experiment's posted config, else console."""
    added_views: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Views every run gets beside its own, each unless the run's views have one of its backend:
    ``REPORT_VIEW`` (``--report``: the HTML page), ``KEPT_BACKENDS`` (a job's own sink, embedded
    or ``rankscope run``, unless ``RANKSCOPE_KEEP=0``: the run kept on disk)."""
    trust_posted_paths: bool = False
    """Whether a posted view config's paths are used as given: the sink of one job (embedded,
    ``rankscope run``) takes its own job's. A shared sink holds them to relative paths without
    ``..`` (``edge.validate.check_posted_views``)."""
    book: BookConfig = field(default_factory=BookConfig)
    """One run's step book: its grace, start hold, retained steps, late updates, time buckets,
    ``ExperimentLimits`` and detector thresholds (``book.config``)."""
    state_dir: Path | None = None
    """Write-ahead log directory: acknowledged data survives a crash. None: memory only."""
    max_in_flight: int = 64
    """Requests being taken at once, both transports together; more are answered retry-later."""
    max_points_in_flight: int = 1 << 21
    """Points being taken at once (a span or log record weighs ``edge.cost.RECORD_WEIGHT``), counted
    before a request is decoded (``edge.gate``): a request within its share (this divided by
    ``max_in_flight``: 32,768) always passes; larger ones share it, and one that does not fit is
    answered retry-later (one larger than all of it passes alone). Twice ``Limits.max_points``: four
    of a Collector gateway's largest requests (about 4 s of work on one core) fit at once. 0: unbounded."""
    retained_bytes: int = 1 << 30
    """Bytes all runs' finalized steps kept for late data may hold packed together
    (``book.retained``; each run's own bound: ``book.retain_bytes``)."""
    trace_retain_steps: int = 64
    """Steps whose spans an experiment keeps (``rankscope gantt``, straggler views)."""
    max_spans: int = 200_000
    """Spans an experiment keeps at most; the oldest steps go first."""
    spans_dir: Path | None = None
    """Where each experiment's spans are also written as they arrive (the whole run's Gantt)."""
    max_span_file_bytes: int = 1 << 30
    artifacts_dir: Path = Path("rankscope_artifacts")
    """Where captured profiler traces are written (``ARTIFACTS/<experiment>/captures/<id>/``)."""
    auto_capture_steps: int = 2
    """Steps a straggler's process profiles when a detector names it (0: detectors never capture)."""
    capture_interval: float = 300.0
    """Seconds between two detector-asked captures of one experiment (a flapping detector)."""
    limits: Limits = field(default_factory=Limits)
    """What one request may carry (``edge.validate``, the edge)."""
    disk: DiskLimits = field(default_factory=DiskLimits)
    """What the runs' views may write: per client, and a floor of free space (``runs.disk``)."""
    runs: RunLimits = field(default_factory=RunLimits)
    """How many runs the sink holds open, per experiment and per client, and when an open run
    gives back its descriptors or closes (``runs.quotas``, ``runs.upkeep``)."""
    resume_window: float = 7 * 86400.0
    """Seconds after a run was last seen during which a launch may resume it (``rankscope.run.resume``)."""
    live_window: float = 60.0
    """A run that sent data within this many seconds, and not all of whose processes said goodbye,
    is still sending: ``resume=latest`` starts a new run rather than continue it (name the run)."""
    max_runs: int = 1000
    """Runs of one experiment the sink remembers per token scope (for listing and resume); the
    oldest are forgotten, a scope's runs only by its own new ones."""
    view_workers: int = 4
    """Threads that write every run's views (``views.writer.ViewPool``), however many runs are open."""
    tick: float = 0.05
    stop_timeout: float = 10.0
    """How long ``stop`` waits for the views; with a state directory, the rest is replayed on start."""

    def __post_init__(self) -> None:
        if self.view_workers < 1 or min(self.max_in_flight, self.max_points_in_flight) < 0:
            raise ValueError("view_workers must be >= 1, max_in_flight and max_points_in_flight >= 0")
        if not (self.tick > 0 and self.stop_timeout >= 0):
            raise ValueError("tick must be > 0 and stop_timeout >= 0")
        if isinstance(self.retained_bytes, bool) or not isinstance(self.retained_bytes, int) or self.retained_bytes < 0:
            raise ValueError(f"retained_bytes must be an int >= 0, got {self.retained_bytes!r}")
