"""What one run may make the sink hold, and the checks that hold it there.

The edge (``sink.edge.validate``) bounds what one request may carry; the limits here depend on the
run's own state: processes, keys and late points per step, one reduce type per key, log
records per step, sample tables and their characters per step. What does not fit is refused
with a reason (``checked.Refusals``, answered as OTLP ``partial_success``) and counted.
Adding a limit is a field of ``ExperimentLimits`` and the check that reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checked import Refusals, StateRows


@dataclass(kw_only=True, slots=True)
class ExperimentLimits:
    """Per-run bounds (``SinkConfig.experiment_limits``; ``rankscope sink --max-*`` flags)."""

    max_processes: int = 16_384
    """Processes per run (a rank whose markers come merged through a Collector tree is not one)."""
    max_rank_slots: int = 131_072
    """Rank slots per run and attempt: the world sizes its groups declare, the ranks of a tree's
    merged markers included. A step's missing ranks are named from them."""
    max_open_steps: int = 16_384
    """Steps of a run not finalized yet (each waits for its processes, at most the grace period)."""
    max_keys_per_step: int = 100_000
    max_late_points_per_step: int = 1_000_000
    max_series: int = 256
    """Series (attribute sets) per plain OTel metric name; more fold into an overflow series."""
    max_logs_per_step: int = 1000
    """Ordinary OTel log records a run's views take per step."""
    max_sample_tables: int = 64
    """Sample tables one step may hold (``record_sample``)."""
    max_sample_chars_per_step: int = 16 << 20
    """Characters the kept sample rows of one step may hold (text, plus 16 per field)."""


def shown(reduce: str) -> str:
    """A reduce type as an error message names it (``SUM``; a plain OTel kind: ``OTel Gauge``)."""
    return f"OTel {reduce[5:].replace('_', ' ')}" if reduce.startswith("otel.") else reduce.upper()


MAX_LOG_STEPS = 4096
"""Steps whose log-record counts are kept; the lowest are forgotten first."""


class Admission:
    """The per-run limits as checks. Counts nothing itself: the caller's ``Refusals`` does."""

    def __init__(self, limits: ExperimentLimits) -> None:
        self.limits = limits
        self._logs_per_step: dict[int, int] = {}

    def opens_step(self, open_steps: int) -> bool:
        """Whether a run with ``open_steps`` steps not finalized may open one more."""
        return open_steps < self.limits.max_open_steps

    def states(
        self,
        step: int,
        states: list[StateRows],
        merged: Mapping[str, Any],
        late_points: int | None,
        refused: Refusals,
    ) -> list[StateRows]:
        """The rows of ``step`` that fit: keys per step (beside the step's ``merged`` keys), one
        reduce type per key, and for a finalized step (``late_points``: its late points so far)
        late points per step."""
        limits = self.limits
        new: dict[str, str] = {}
        key_room = limits.max_keys_per_step - len(merged)
        late_room = None if late_points is None else limits.max_late_points_per_step - late_points
        kept: list[StateRows] = []
        for rows in states:
            reduce = rows.reduce
            dropped: set[int] = set()
            for i, key in enumerate(rows.keys):
                state = merged.get(key)
                known = new.get(key) if state is None else state[0]
                why = None
                if known is None:
                    if len(new) >= key_room:
                        why = f"{key}: step {step} has {limits.max_keys_per_step} keys (limit)"
                    else:
                        new[key] = reduce
                elif known != reduce:
                    why = f"{key}: recorded as {shown(known)} and as {shown(reduce)}"
                if why is None and late_room is not None:
                    if late_room <= 0:
                        why = f"{key}: step {step} has {limits.max_late_points_per_step} late points (limit)"
                    late_room -= 1
                if why is not None:
                    refused.add(1, why)
                    dropped.add(i)
            if dropped:
                keep = [i for i in range(len(rows.keys)) if i not in dropped]
                carried = rows.spreads  # a merged row's spread stays with its row (re-indexed)
                spreads = {j: carried[i] for j, i in enumerate(keep) if i in carried} if carried else None
                rows = StateRows(
                    reduce, rows.step, [rows.keys[i] for i in keep], [rows.rows[i] for i in keep], spreads=spreads
                )
            if rows.keys:
                kept.append(rows)
        return kept

    def late_rows(self, step: int, n: int, late_points: int, refused: Refusals) -> int:
        """How many of ``n`` late sample rows of ``step`` fit its late points; the rest are refused."""
        room = max(0, self.limits.max_late_points_per_step - late_points)
        if room < n:
            limit = self.limits.max_late_points_per_step
            refused.add(n - room, f"sample rows: step {step} has {limit} late points (limit)")
        return min(n, room)

    def log_record(self, step: int, refused: Refusals) -> bool:
        """Whether one more log record of ``step`` fits ``max_logs_per_step`` (counted if so)."""
        n = self._logs_per_step.get(step, 0)
        if n >= self.limits.max_logs_per_step:
            refused.add(1, f"log records: step {step} has {self.limits.max_logs_per_step} (limit)")
            return False
        self._logs_per_step[step] = n + 1
        if len(self._logs_per_step) > MAX_LOG_STEPS:  # the lowest steps are forgotten first (not the newest)
            del self._logs_per_step[min(self._logs_per_step)]
        return True
