"""What one run took and refused: the counters the status route and the step views show.

One dataclass, shared by the book and the parts that count (``steps`` counts late points and
kept sample rows as it merges them): each counter is bumped where its event happens, read in one
place (``sink.queries``, ``finalize.Finished``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counts:
    """What a run took and refused, as the status route and the views' own metrics show it."""

    points: int = 0
    """States taken (markers not counted); ``merged_points`` of them came merged by a Collector."""
    merged_points: int = 0
    late_points: int = 0
    partial_points: int = 0
    """Late points of steps no longer kept (``book.retained``): said in a ``partial`` record, not as values."""
    refused: int = 0
    foreign_points: int = 0
    internal_errors: int = 0
    abandoned_steps: int = 0
    """Steps an earlier attempt left open when the run restarted (never written: executed again)."""
    superseded_points: int = 0
    """Points refused because their process's attempt is older than the run's (a restart)."""
    reused_points: int = 0
    """Points refused because another launch reused the id of this run after it ended (every process
    said goodbye): any later point of its attempt, once the run book says it finished (``runs.runbook``)."""
    scope_refused: int = 0
    """Points refused because they came with the token of another scope than the run's (``runs.runbook``)."""
    sample_rows: int = 0
    log_records: int = 0
