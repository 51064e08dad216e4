"""Per-step anomaly detection: the registered detectors over each finished step, and what they found.

Each finished step is judged once (``book.finalize``) by every detector of ``DETECTORS``, in
order: stragglers (``detectors.stragglers``), outliers (``detectors.outliers``), non-finite
values (``detectors.nonfinite``), slow steps (``detectors.slow_step``) and missing processes
(``detectors.missing``). A run's first ``warmup_steps`` judged steps are not judged for
stragglers, outliers or slow steps (compiling, caches,
the first all-reduce's rendezvous). A step the job ended in is not judged, only named
(``Interrupted``).

A detection is a typed record (``core.anomalies``): the views write it (JSONL ``{"kind":
"anomaly", ...}``, a W&B alert, a console line) and the status route lists the latest. All cheap:
a few comparisons per step, and the non-finite scan only touches the keys whose merged value is
not finite. A new detector is its module in ``detectors/``, one entry here, and the views that
draw its records.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Any

from ...core.anomalies import Anomaly, Interrupted
from .detectors.base import Detector, StepFacts, Thresholds
from .detectors.missing import MissingDetector
from .detectors.nonfinite import NonFiniteDetector
from .detectors.outliers import OutlierDetector
from .detectors.slow_step import SlowStepDetector
from .detectors.stragglers import StragglerDetector

DETECTORS: tuple[Callable[[Thresholds], Detector], ...] = (
    StragglerDetector,
    OutlierDetector,
    NonFiniteDetector,
    SlowStepDetector,
    MissingDetector,
)
"""Every detector, in the order a step's records are said."""

SHOWN = 16
"""The latest records the status route lists."""


class Watch:
    """One run's detectors, and the latest records for the status route."""

    def __init__(self, thresholds: Thresholds | None = None, keep: int = 64) -> None:
        self.thresholds = thresholds or Thresholds()
        self.detectors = [make(self.thresholds) for make in DETECTORS]
        self.counts: Counter[str] = Counter()
        self.recent: deque[Anomaly] = deque(maxlen=keep)
        self.judged = 0

    def step(self, facts: StepFacts) -> list[Anomaly]:
        """Judge one finished step (whether it is within the warm-up is the watch's to say);
        returns its records, also kept."""
        self.judged += 1
        facts = dataclasses.replace(facts, warm=self.judged <= self.thresholds.warmup_steps)
        found = [record for detector in self.detectors for record in detector.judge(facts)]
        for record in found:
            self.note(record)
        return found

    def restart(self) -> None:
        """The run restarted (a new attempt): its warm-up comes again, no streak goes on."""
        self.judged = 0
        for detector in self.detectors:
            detector.restart()

    def interrupted(
        self, step: int, waiting: list[str], failed: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    ) -> list[Anomaly]:
        """A step the job ended in (Ctrl-C, a crash: the sink finalized it at the job's end while
        ``waiting`` had not closed it; ``failed``: the processes an exception ended, and their errors).
        Not judged: its phases were cut short and its absentees are not late, so no detector runs
        on it; its one record says what happened."""
        labels, errors = failed
        record = Interrupted(step=step, processes=tuple(waiting[:64]), count=len(waiting), failed=labels, errors=errors)
        self.note(record)
        return [record]

    def note(self, record: Anomaly) -> None:
        """Keep a record (the step's detections, or a capture's file) for the status route."""
        self.counts[record.KIND] += 1
        self.recent.append(record)

    def status(self) -> dict[str, Any]:
        live: dict[Hashable, Anomaly] = {r.streak: r for d in self.detectors for r in d.live()}
        shown = [live.get(r.streak, r) for r in list(self.recent)[-SHOWN:]]
        out: dict[str, Any] = {"anomaly_counts": dict(self.counts), "anomalies": [r.to_json() for r in shown]}
        for detector in self.detectors:
            fields = detector.status()
            assert not fields.keys() & out.keys(), f"two detectors answer {sorted(fields.keys() & out.keys())}"
            out.update(fields)
        return out
