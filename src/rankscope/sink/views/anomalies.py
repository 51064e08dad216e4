"""Per-step anomaly detectors: what went wrong in a step, named where it happened, while it happens.

Each finished step is judged once, from what the sink already holds for its view: non-finite
values (which process recorded them), stragglers (the causes ``book.stragglers`` found: a rank
far over the others in a phase net of its collective waits, or the last to arrive at a
collective), slow steps (a step's wall-clock window against the rolling median of the last ones)
and missing processes; a step the job ended in is not judged, only named (``interrupted``).

A run's first ``warmup_steps`` judged steps are not judged for stragglers or slow steps (compiling,
caches, the first all-reduce's rendezvous). A straggler is one **streak** while it is named in
consecutive judged steps: said once, as one record, when it has held ``straggler_steps`` steps in
a row (one noisy step on a busy box is not a straggler), with its ``first_step``; the live record
(the status route) keeps its ``last_step`` and ``steps`` up to date.

A detection is an anomaly record, a plain dict with ``type`` and ``step``: the views write it
(JSONL ``{"kind": "anomaly", ...}``, a W&B alert, a console line) and the status route lists the
latest. All cheap: a few comparisons per step, and the non-finite scan only touches the keys whose
merged value is not finite.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

NONFINITE, STRAGGLER, SLOW_STEP, MISSING = "nonfinite", "straggler", "slow_step", "missing"
MAX_STREAKS_SHOWN = 64
"""Straggler streaks the status route lists (the latest), each with its extent so far."""
INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Detectors:
    """Thresholds (``SinkConfig.detectors``); 0 turns a detector off."""

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
        self.judged = 0
        self.named: deque[dict[str, Any]] = deque(maxlen=MAX_STREAKS_SHOWN)
        """The run's latest straggler streaks named, live (the status route, the report)."""
        self.streaks: dict[str, dict[str, Any]] = {}
        """Open streaks by process label: the live record (named) or its start (not yet)."""
        self.started: list[tuple[dict[str, Any], Any]] = []
        """The streaks named at the last judged step, with their processes (to profile)."""

    def step(
        self,
        step: int,
        *,
        nonfinite: list[tuple[str, Any]],
        stragglers: list[tuple[dict[str, Any], Any]],
        duration: float | None,
        missing: list[str],
    ) -> list[dict[str, Any]]:
        """Judge one finished step; returns its anomaly records (also kept in ``recent``).
        ``stragglers``: this step's (record, process) over the thresholds (``book.stragglers``)."""
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
        self.started = []
        self.judged += 1
        warm = self.judged <= d.warmup_steps
        said = self._streaks(step, stragglers) if d.straggler_ratio > 0 and not warm else []
        if d.slow_step_factor > 0 and duration is not None and duration > 0 and not warm:
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
        return said + found  # a streak's live record is noted already

    def restart(self) -> None:
        """The run restarted (a new attempt): its warm-up comes again, no streak goes on."""
        self.judged = 0
        self.streaks = {}

    def _streaks(self, step: int, stragglers: list[tuple[dict[str, Any], Any]]) -> list[dict[str, Any]]:
        """Go on with each open streak named again, close the others, start new ones; returns the
        records of the streaks named now (copies: the live ones go on changing)."""
        named: list[dict[str, Any]] = []
        now: dict[str, dict[str, Any]] = {}
        for record, process in stragglers:
            label = record["process"]
            live = self.streaks.get(label)
            if live is None:
                live = {"type": STRAGGLER, "step": step, "first_step": step, "last_step": step, "steps": 0, **record}
            else:  # the latest step's figures, the streak's extent
                live.update(record, last_step=step)
            live["steps"] += 1
            now[label] = live
            if live["steps"] == max(1, self.detectors.straggler_steps):
                self.note(live)  # the status route's: it goes on changing
                self.named.append(live)
                said = dict(live)
                named.append(said)
                self.started.append((said, process))
        self.streaks = now
        return named

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
            "straggler_streaks": list(self.named),
        }
