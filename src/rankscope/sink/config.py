"""How a sink listens, what it writes and what one client may make it hold: ``SinkConfig``.

CLI flags and ``RANKSCOPE_SINK_*`` map here. The servers get their part of it as a frozen
``edge.ports.Transport``; the bounds that travel together are nested (``limits`` at the edge,
``experiment_limits`` per run, ``runs`` for the runs the sink holds, ``detectors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .book.admission import ExperimentLimits
from .checked import Limits, Scope
from .edge.ports import Transport
from .quotas import RunLimits
from .views.anomalies import Detectors

DEFAULT_BACKENDS: dict[str, dict[str, Any]] = {"console": {"logging_mode": "global_reduce"}}
"""The views of an experiment when neither the sink nor the experiment's processes chose any."""


JOB_START_HOLD = 2.0
"""``start_hold`` of the sink of one job, whose processes start together (embedded, ``rankscope run``)."""


@dataclass(kw_only=True)
class SinkConfig:
    """How a sink listens, what it writes and what one client may make it hold.

    CLI flags and ``RANKSCOPE_SINK_*`` map here. Flat on purpose, past 25 fields: each is one
    flag a person sets; the bounds that travel together are nested (``limits`` at the edge,
    ``experiment_limits`` per run, ``runs`` for the runs the sink holds, ``detectors``)."""

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
    start_hold: float = 0.0
    """Seconds from a run's first data in which a step is final only by ``grace`` (or the run's end),
    never for having nothing missing: a process that starts a little after the others (a generator
    rank 0 spawns) is in the run's first step, not late to it. At most ``grace``; until 16 steps
    are open. The sink of one job (embedded, ``rankscope run``) holds ``JOB_START_HOLD``."""
    token: str | None = None
    """The bearer token for every experiment (``--token``); with ``tokens``, one more scope."""
    tokens: Mapping[str, Scope] = field(default_factory=dict)
    """Scoped tokens (``--tokens FILE``, ``edge.auth.load_tokens``): each may write only its scope's
    experiments, and only its scope's runs (``book.runs``). Teams sharing a sink need them: without,
    every client is one scope."""
    state_dir: Path | None = None
    """Write-ahead log directory: acknowledged data survives a crash. None: memory only."""
    max_body_bytes: int = 32 * 1024 * 1024
    max_in_flight: int = 64
    max_connections: int | None = None
    """Open HTTP connections at most; idle ones are closed after ``idle_connection_timeout``. A
    newcomer beyond closes the connection that has waited longest for its request head. gRPC's
    incoming connections are held to the same number. None: derived from the process's
    descriptor limit (``durable.descriptors.Plan``: 1024, fewer under a low ``ulimit -n``)."""
    idle_connection_timeout: float = 15.0
    header_timeout: float = 5.0
    """Seconds a request head may take to arrive whole (from its first byte, or the connection's
    opening), and a gRPC connection its handshake: a slower connection is closed."""
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
    runs: RunLimits = field(default_factory=RunLimits)
    """How many runs the sink holds open, per experiment and per client, and when an open run
    gives back its descriptors or closes (``quotas``, ``upkeep``)."""
    resume_window: float = 7 * 86400.0
    """Seconds after a run was last seen during which a launch may resume it (``rankscope.run.resume``)."""
    live_window: float = 60.0
    """A run that sent data within this many seconds, and not all of whose processes said goodbye,
    is still sending: ``resume=latest`` starts a new run rather than continue it (name the run)."""
    max_runs: int = 1000
    """Runs of one experiment the sink remembers per token scope (for listing and resume); the
    oldest are forgotten, a scope's runs only by its own new ones."""
    late_interval: float = 1.0
    """Late updates of a step are merged and written at most this often."""
    view_workers: int = 4
    """Threads that write every run's views (``views.writer.ViewPool``), however many runs are open."""
    tick: float = 0.05
    stop_timeout: float = 10.0
    """How long ``stop`` waits for the views; with a state directory, the rest is replayed on start."""

    def transport(self, connections: int | None = None) -> Transport:
        """What the servers read of this configuration (``edge.ports.Transport``); ``connections``:
        the derived ``max_connections`` (``durable.descriptors.Plan``) when it is not set."""
        return Transport(
            host=self.host,
            token=self.token,
            tokens=self.tokens,
            max_body_bytes=self.max_body_bytes,
            max_connections=connections or self.max_connections or 1024,
            idle_connection_timeout=self.idle_connection_timeout,
            header_timeout=self.header_timeout,
            body_timeout=self.body_timeout,
            grpc_workers=self.grpc_workers,
            max_id_chars=self.limits.max_id_chars,
        )
