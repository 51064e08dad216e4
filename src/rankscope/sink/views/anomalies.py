"""Per-step anomaly detectors: what went wrong in a step, named where it happened, while it happens.

Each finished step is judged once, from what the sink already holds for its view: non-finite
values (which process recorded them), stragglers (a traced phase whose slowest process is far
from the median), slow steps (a step's wall-clock window against the rolling median of the
last ones) and missing processes; a step the job ended in is not judged, only named
(``interrupted``). A detection is an anomaly record, a plain dict with ``type`` and ``step``:
the views write it (JSONL ``{"kind": "anomaly", ...}``, a W&B alert, a console line) and the
status route lists the latest. All cheap: a few comparisons per step,
and the non-finite scan only touches the keys whose merged value is not finite.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

NONFINITE, STRAGGLER, SLOW_STEP, MISSING = "nonfinite", "straggler", "slow_step", "missing"
INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Detectors:
    """Thresholds (``SinkConfig.detectors``); 0 turns a detector off."""

    straggler_ratio: float = 1.5
    """A traced phase whose slowest process took this many times the median..."""
    straggler_min_s: float = 0.05
    """...and at least this many seconds more than the median (tiny phases are noise)."""
    slow_step_factor: float = 3.0
    """A step whose window is this many times the median of the last ``slow_step_history`` steps."""
    slow_step_history: int = 16
    slow_step_min_s: float = 0.5
    """...and at least this many seconds over that median (a 50 ms step's jitter is not news)."""
    nonfinite: bool = True
    missing: bool = True


def _who(process: Any) -> dict[str, Any]:
    return {"process": process.label, "role": process.role, "replica": process.replica, "rank": process.rank}


class Watch:
    """One experiment's detectors: their running state and the latest records."""

    def __init__(self, detectors: Detectors | None = None, keep: int = 64) -> None:
        self.detectors = detectors or Detectors()
        self.first_nonfinite: dict[str, Any] | None = None
        self.counts: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._durations: deque[float] = deque(maxlen=max(1, self.detectors.slow_step_history))

    def step(
        self,
        step: int,
        *,
        nonfinite: list[tuple[str, Any]],
        phases: list[Any],
        duration: float | None,
        missing: list[str],
    ) -> list[dict[str, Any]]:
        """Judge one finished step; returns its anomaly records (also kept in ``recent``)."""
        d = self.detectors
        found: list[dict[str, Any]] = []
        if d.nonfinite and nonfinite:
            key, process = nonfinite[0]
            first = {"key": key, **(_who(process) if process is not None else {"process": None, "rank": None})}
            record = {"type": NONFINITE, "step": step, "count": len(nonfinite), **first}
            record["keys"] = sorted({k for k, _ in nonfinite})[:16]
            if self.first_nonfinite is None:
                self.first_nonfinite = {"step": step, **first}
                record["first"] = True
            found.append(record)
        if d.straggler_ratio > 0:
            for phase in phases:
                if phase.ratio >= d.straggler_ratio and phase.high - phase.median >= d.straggler_min_s:
                    record = {"type": STRAGGLER, "step": step, "phase": phase.name, **_who(phase.slowest)}
                    record.update(ratio=round(phase.ratio, 3), seconds=phase.high, median_s=phase.median)
                    found.append(record)
        if d.slow_step_factor > 0 and duration is not None and duration > 0:
            history = list(self._durations)
            if len(history) >= self._durations.maxlen:  # type: ignore[operator]
                median = statistics.median(history)
                if median > 0 and duration >= d.slow_step_factor * median and duration - median >= d.slow_step_min_s:
                    found.append(
                        {
                            "type": SLOW_STEP,
                            "step": step,
                            "seconds": duration,
                            "median_s": median,
                            "factor": round(duration / median, 3),
                        }
                    )
            self._durations.append(duration)
        if d.missing and missing:
            found.append({"type": MISSING, "step": step, "processes": missing[:64], "count": len(missing)})
        for record in found:
            self.note(record)
        return found

    def interrupted(self, step: int, waiting: list[str]) -> list[dict[str, Any]]:
        """A step the job ended in (Ctrl-C, a crash: the sink finalized it at the job's end while
        ``waiting`` had not closed it). Not judged: its phases were cut short and its absentees
        are not late, so no detector runs on it; its one record says what happened."""
        record = {"type": INTERRUPTED, "step": step, "processes": waiting[:64], "count": len(waiting)}
        self.note(record)
        return [record]

    def note(self, record: dict[str, Any]) -> None:
        """Keep a record (the step's detections, or a capture's file) for the status route."""
        self.counts[record["type"]] += 1
        self.recent.append(record)

    def status(self) -> dict[str, Any]:
        return {
            "first_nonfinite": self.first_nonfinite,
            "anomaly_counts": dict(self.counts),
            "anomalies": list(self.recent)[-16:],
        }
