"""Capture on anomaly: which processes are asked to profile their next steps, and their files.

A capture is asked for by a detector (a straggler: that process only), by a process
(``rs.capture(reason)``) or by a person (``rankscope capture``). Processes poll for requests
on their export thread (``GET /rankscope/v1/captures``), run ``torch.profiler`` for the asked
number of steps and upload the Chrome trace (``PUT``), which is written under the sink's
artifact directory (``ARTIFACTS/<experiment>/captures/<id>/<process>.pt.trace.json.gz``: names
made safe, never paths) and announced to the views as a ``capture`` anomaly record.

Bounded and rate-limited: detector captures at most one per ``auto_interval`` seconds per
process of the run (an early false alarm on one rank cannot block the real one on another),
any other capture at most one per ``min_interval`` seconds, at most ``MAX_OPEN`` (of them
``MAX_AUTO_OPEN`` a detector's) asked in
the last ``open_for`` seconds (a capture is open that long, finished or not), a file at most the
sink's ``max_body_bytes``, and an experiment's files at most ``max_bytes`` in all (then uploads
are refused, with the reason); a flapping detector cannot profile forever.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.anomalies import Straggler
from ...core.paths import safe_component
from ..checked import Process
from .step import StepView

MAX_OPEN = 8
MAX_AUTO_OPEN = 4
"""Detector captures open at once: the other slots stay for people and ``rs.capture``."""
MAX_STEPS = 64
MAX_RANKS = 16_384
_IDS = itertools.count(1)


@dataclass(slots=True)
class CaptureRequest:
    id: str
    reason: str
    steps: int
    ranks: frozenset[int] | None
    """Ranks asked (None: every process), or"""
    processes: frozenset[str] | None
    """process ids asked (a detector names the very process)."""
    asked_at: float
    auto: bool = False
    """Asked by a detector (``ask_stragglers``)."""
    taken: set[str] = field(default_factory=set)
    """Processes that picked the request up."""
    files: dict[str, str] = field(default_factory=dict)
    """Process label -> path of its uploaded trace."""

    def wants(self, process: Process) -> bool:
        if self.processes is not None:
            return process.id in self.processes
        return self.ranks is None or process.rank in self.ranks

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "reason": self.reason,
            "steps": self.steps,
            "ranks": sorted(self.ranks)[:64] if self.ranks is not None else None,
            "rank_count": None if self.ranks is None else len(self.ranks),
            "taken": len(self.taken),
            "files": dict(self.files),
        }


class CaptureBook:
    """One experiment's captures. Not thread-safe: the experiment's lock guards it."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        min_interval: float = 5.0,
        auto_interval: float = 300.0,
        open_for: float = 600.0,
        max_bytes: int = 4 << 30,
    ) -> None:
        self.clock = clock
        self.min_interval = min_interval
        self.auto_interval = auto_interval
        self.open_for = open_for
        self.max_bytes = max_bytes
        """Bytes this experiment's capture files may hold on disk, in all."""
        self.bytes = 0
        self.captures: OrderedDict[str, CaptureRequest] = OrderedDict()
        self.refused = 0
        self._last: float | None = None
        self._last_auto: dict[str, float] = {}
        """Process id -> when a detector last asked it for a capture."""

    def ask(
        self,
        reason: str,
        steps: int,
        *,
        ranks: frozenset[int] | None = None,
        processes: frozenset[str] | None = None,
        auto: bool = False,
    ) -> CaptureRequest | str:
        """A new capture, or why not (rate limits, too many open)."""
        now = self.clock()
        self._expire(now)
        if not 1 <= steps <= MAX_STEPS:
            return f"steps must be in [1, {MAX_STEPS}]"
        if ranks is not None and len(ranks) > MAX_RANKS:
            return f"at most {MAX_RANKS} ranks"
        if auto:
            if sum(1 for c in self.captures.values() if c.auto) >= MAX_AUTO_OPEN:
                self.refused += 1
                return f"{MAX_AUTO_OPEN} detector captures are open"
            asked = [self._last_auto.get(p) for p in processes or ()]
            if any(at is not None and now - at < self.auto_interval for at in asked):
                self.refused += 1
                return f"a detector asked this process for a capture less than {self.auto_interval:.0f}s ago"
        elif self._last is not None and now - self._last < self.min_interval:
            self.refused += 1
            return f"a capture was asked for less than {self.min_interval:.0f}s ago"
        if len(self.captures) >= MAX_OPEN:
            self.refused += 1
            return f"{MAX_OPEN} captures are open"
        capture = CaptureRequest(f"c{next(_IDS)}-{int(time.time())}", reason[:200], steps, ranks, processes, now, auto)
        self.captures[capture.id] = capture
        if auto:
            if len(self._last_auto) >= MAX_RANKS:  # bounded: forget those asked longest ago
                self._last_auto = {p: at for p, at in self._last_auto.items() if now - at < self.auto_interval}
            self._last_auto.update(dict.fromkeys(processes or (), now))
        else:
            self._last = now
        return capture

    def pending(self, process: Process) -> list[dict[str, Any]]:
        """Requests for ``process`` it has not picked up yet (marked taken now)."""
        self._expire(self.clock())
        out = []
        for capture in self.captures.values():
            if process.id not in capture.taken and capture.wants(process):
                capture.taken.add(process.id)
                out.append({"id": capture.id, "steps": capture.steps, "reason": capture.reason})
        return out

    def path_for(self, root: Path, experiment: str, capture_id: str, process: Process, size: int) -> Path | str:
        """Where ``process``'s file of ``capture_id`` (``size`` bytes) would go, or why it is not taken."""
        capture = self.captures.get(capture_id)
        if capture is None or process.id not in capture.taken:
            return f"no open capture {capture_id[:64]!r} for this process"
        if process.label in capture.files:
            return "this process's file of that capture is in already"
        if self.bytes + size > self.max_bytes:
            return f"this experiment's capture files hold {self.max_bytes} bytes (limit)"
        name = f"{safe_component(process.label)}.pt.trace.json.gz"
        return root / safe_component(experiment) / "captures" / safe_component(capture.id) / name

    def stored(self, capture_id: str, process: Process, path: Path, size: int) -> CaptureRequest | None:
        """A file was written: it counts now (a failed write leaves nothing behind)."""
        capture = self.captures.get(capture_id)
        if capture is not None:
            capture.files[process.label] = str(path)
        self.bytes += size
        return capture

    def _expire(self, now: float) -> None:
        while self.captures:
            first = next(iter(self.captures.values()))
            if now - first.asked_at < self.open_for:
                break
            self.captures.popitem(last=False)

    def status(self) -> list[dict[str, Any]]:
        return [c.status() for c in self.captures.values()]


def ask_stragglers(book: CaptureBook, view: StepView, steps: int) -> None:
    """Ask each of the step's stragglers' process to profile its next ``steps`` steps
    (rate-limited by the book); the view's record of a straggler whose capture was asked names
    it (``Straggler.capture``)."""
    if steps <= 0 or not view.stragglers:
        return
    ids: dict[Hashable, str] = {}
    for record, process in view.stragglers:
        reason = f"straggler from step {record.first_step}: {process.label}"
        reason += f" in {record.phase or 'untraced code'}, +{record.excess_s:.3g}s ({record.ratio:.3g}x the others)"
        if record.collective:
            reason += f", arrived last at {record.collective}"
        asked = book.ask(reason, steps, processes=frozenset({process.id}), auto=True)
        if not isinstance(asked, str):
            ids[record.streak] = asked.id
    if ids:
        view.anomalies = [
            dataclasses.replace(a, capture=ids[a.streak]) if isinstance(a, Straggler) and a.streak in ids else a
            for a in view.anomalies
        ]


def ask_outliers(book: CaptureBook, view: StepView, steps: int) -> None:
    """Ask each of the step's outliers' process to profile its next ``steps`` steps, where the
    outlier detector asks for it (``Thresholds.outlier_capture``; rate-limited by the book)."""
    if steps <= 0:
        return
    for record, process in view.outliers:
        if process.merged:  # named through a Collector, by its label only: no process to ask
            continue
        reason = f"outlier from step {record.first_step}: {process.label} {record.key} {record.value:.4g}"
        reason += f" vs the others {record.others_mean:.4g} ± {record.others_std:.3g}"
        book.ask(reason, steps, processes=frozenset({process.id}), auto=True)
