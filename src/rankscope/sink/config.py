"""How a sink listens, what it writes and what one client may make it hold: ``SinkConfig``.

CLI flags and ``RANKSCOPE_SINK_*`` map here. The servers get their part of it as a frozen
``edge.ports.Transport``; the bounds that travel together are nested (``limits`` at the edge,
``experiment_limits`` per run, ``detectors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .book.admission import ExperimentLimits
from .checked import Limits
from .edge.ports import Transport
from .views.anomalies import Detectors

DEFAULT_BACKENDS: dict[str, dict[str, Any]] = {"console": {"logging_mode": "global_reduce"}}
"""The views of an experiment when neither the sink nor the experiment's processes chose any."""


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
    ``..`` (``edge.validate.check_posted_views``)."""
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
    """Per-step anomaly detectors' thresholds (``views.anomalies``)."""
    artifacts_dir: Path = Path("rankscope_artifacts")
    """Where captured profiler traces are written (``ARTIFACTS/<experiment>/captures/<id>/``)."""
    auto_capture_steps: int = 2
    """Steps a straggler's process profiles when a detector names it (0: detectors never capture)."""
    capture_interval: float = 300.0
    """Seconds between two detector-asked captures of one experiment (a flapping detector)."""
    grpc_workers: int = 8
    limits: Limits = field(default_factory=Limits)
    """What one request may carry (``edge.validate``, the edge)."""
    experiment_limits: ExperimentLimits = field(default_factory=ExperimentLimits)
    """What one run may make the sink hold (``book.admission``)."""
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
    """Threads that write every run's views (``views.writer.ViewPool``), however many runs are open."""
    tick: float = 0.05
    stop_timeout: float = 10.0
    """How long ``stop`` waits for the views; with a state directory, the rest is replayed on start."""

    def transport(self) -> Transport:
        """What the servers read of this configuration (``edge.ports.Transport``)."""
        return Transport(
            host=self.host,
            token=self.token,
            max_body_bytes=self.max_body_bytes,
            max_connections=self.max_connections,
            idle_connection_timeout=self.idle_connection_timeout,
            body_timeout=self.body_timeout,
            grpc_workers=self.grpc_workers,
        )
