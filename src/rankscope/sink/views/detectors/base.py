"""What every detector shares: its thresholds, what it sees of a finished step, and its interface.

A detector is a part: it sees one finished step (``StepFacts``, built by ``book.finalize``) and
returns the records it found (``core.anomalies``). It may keep a running history (a median of
step times, a straggler's streak); ``restart`` forgets what must not carry over a new attempt,
and ``status``/``live`` are its share of the status route.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ....core.anomalies import Anomaly, Outlier, Straggler
from ...checked import Process


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every detector's thresholds (``SinkConfig.detectors``); 0 turns a detector off."""

    straggler_ratio: float = 1.5
    """A process that took this many times the others' mean in a phase (net of its collective
    waits), or to reach a collective it arrived last at..."""
    straggler_min_s: float = 0.05
    """...and at least this many seconds more (tiny phases are noise)."""
    straggler_steps: int = 2
    """Judged steps in a row a straggler holds before it is named (its record says its first)."""
    warmup_steps: int = 3
    """A run's first judged steps, not judged for stragglers or slow steps."""
    slow_step_factor: float = 3.0
    """A step whose window is this many times the median of the last ``slow_step_history`` steps."""
    slow_step_history: int = 16
    slow_step_min_s: float = 0.5
    """...and at least this many seconds over that median (a 50 ms step's jitter is not news)."""
    nonfinite: bool = True
    missing: bool = True
    outlier_sigmas: float = 6.0
    """A process whose value of a key is this many of the other processes' standard deviations
    from their mean (``book.outliers``; 0: off)..."""
    outlier_min_rel: float = 0.05
    """...and at least this share of their mean's magnitude away..."""
    outlier_min_abs: float = 0.0
    """...and at least this far (keys whose mean is near 0)..."""
    outlier_steps: int = 3
    """...for this many judged steps in a row (its record says its first)."""
    outlier_min_others: int = 5
    """Other processes a key needs for its outliers to be judged: fewer others' spread is too
    noisy (3 processes whose values spread 10 %: noise alone made a 3-step streak every ~250 steps a key)."""
    outlier_keys: tuple[str, ...] = ()
    """Keys judged whatever their reduce type (fnmatch patterns): a SUM key is judged only here."""
    outlier_skip: tuple[str, ...] = ()
    """Keys never judged (fnmatch patterns): keys whose processes differ by design (ids, per-rank counts)."""
    outlier_capture: bool = False
    """An outlier's process is also asked to profile its next steps, as a straggler's is
    (``auto_capture_steps``; a profile shows time, so this is off unless asked)."""

    def __post_init__(self) -> None:
        for name in (
            "straggler_ratio",
            "straggler_min_s",
            "slow_step_factor",
            "slow_step_min_s",
            "outlier_sigmas",
            "outlier_min_rel",
            "outlier_min_abs",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"detectors: {name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("outlier_keys", "outlier_skip"):
            patterns = getattr(self, name)
            if not isinstance(patterns, tuple) or not all(isinstance(p, str) for p in patterns):
                raise ValueError(f"detectors: {name} must be a tuple of fnmatch patterns, got {patterns!r}")
        for name in ("straggler_steps", "warmup_steps", "slow_step_history", "outlier_steps", "outlier_min_others"):
            if getattr(self, name) < 0:
                raise ValueError(f"detectors: {name} must be >= 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class StepFacts:
    """A finished step as the detectors see it."""

    step: int
    warm: bool = False
    """Within the run's first ``warmup_steps`` judged steps (compiling, caches, a first rendezvous)."""
    nonfinite: list[tuple[str, Process | None]] = field(default_factory=list)
    """(key, process) of each non-finite value, in the order they came (None: merged upstream)."""
    stragglers: list[tuple[Straggler, Process]] = field(default_factory=list)
    """This step's processes over the straggler thresholds (``book.stragglers``), each its record."""
    outliers: list[tuple[Outlier, Process]] = field(default_factory=list)
    """This step's processes whose value of a key is over the outlier thresholds (``book.outliers``)."""
    duration: float | None = None
    """The step's wall-clock window, if known."""
    missing: list[str] = field(default_factory=list)


class Detector(Protocol):
    """One kind of judgement on finished steps."""

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        """The records this step calls for (said once each by the views)."""
        ...

    def restart(self) -> None:
        """A new attempt of the run: forget what must not carry over it."""
        ...

    def live(self) -> Iterable[Anomaly]:
        """Records said before that went on changing since (a streak's extent), as they are now."""
        ...

    def status(self) -> dict[str, Any]:
        """Its fields of the status route."""
        ...


class DetectorDefaults:
    """What a detector does by default: nothing to forget at a restart, nothing live, no status fields."""

    def restart(self) -> None:
        return None

    def live(self) -> Iterable[Anomaly]:
        return ()

    def status(self) -> dict[str, Any]:
        return {}
