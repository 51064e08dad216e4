"""What one run's step book is configured with: ``BookConfig``.

The sink builds one from its ``SinkConfig`` and hands the same one to every run it opens, so a
run's rules arrive as one checked value, not a dozen numbers passed one by one. The book's
collaborators (its trace store, error callback and clocks) are not configuration: they are
passed beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..views.detectors.base import Thresholds
from .admission import ExperimentLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class BookConfig:
    """One run's step book rules (``SinkConfig.book``; ``docs/sink.md``): one value the sink hands to
    every run it opens."""

    grace: float = 10.0
    """Seconds after a step's first data it is final whoever is missing."""
    start_hold: float = 0.0
    """Seconds from a run's first data in which a step is final only by ``grace`` (at most ``grace``)."""
    retain_seconds: float = 900.0
    """Seconds a finalized step's states are kept for its late data, so its late update is the
    step's exact total (``book.retained``; 0: none kept, a late update is partial and said so)."""
    retain_bytes: int = 64 << 20
    """Bytes one run's kept steps may hold packed (the 16 newest are kept live besides)."""
    late_interval: float = 1.0
    """Late updates of a step are written at most this often."""
    step_window: int = 1_000_000
    """How far ahead of the run's frontier a step may be."""
    limits: ExperimentLimits = field(default_factory=ExperimentLimits)
    """What one run may make the sink hold (``admission``)."""
    time_bucket: float = 1.0
    """Seconds per step of a run none of whose processes steps (``windows``)."""
    time_bucket_lag: float = 2.0
    """How long after a time bucket ends its step is final."""
    detectors: Thresholds = field(default_factory=Thresholds)
    """Per-step anomaly detectors' thresholds (``views.anomalies``)."""

    def __post_init__(self) -> None:
        for name in ("grace", "start_hold", "late_interval", "time_bucket_lag", "retain_seconds"):
            _seconds(name, getattr(self, name))
        _seconds("time_bucket", self.time_bucket)
        if self.time_bucket == 0:
            raise ValueError("book config: time_bucket must be > 0 seconds, got 0")
        for name in ("retain_bytes", "step_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"book config: {name} must be an int >= 0, got {value!r}")
        if not isinstance(self.limits, ExperimentLimits):
            raise ValueError(f"book config: limits must be an ExperimentLimits, got {type(self.limits).__name__}")
        if not isinstance(self.detectors, Thresholds):
            raise ValueError(f"book config: detectors must be a Thresholds, got {type(self.detectors).__name__}")


def _seconds(name: str, value: object) -> None:
    """A duration: a finite number of seconds >= 0 (a NaN would make every comparison with it false)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"book config: {name} must be a finite number of seconds >= 0, got {value!r}")
