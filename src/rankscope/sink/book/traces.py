"""An experiment's spans at the sink: bounded storage by step.

Retention (documented in ``docs/tracing.md``): the spans of the last ``retain_steps`` steps (64),
at most ``max_spans`` (200,000) per experiment; older steps go first, and spans beyond
the cap for the newest step are counted in ``dropped``. Spans without ``rankscope.step``
(a user's own OTel spans) take the step of a span with the same trace id in the same
request, else the step whose wall-clock window holds their start (``StepBook.step_at``).

With a span file (``SinkConfig.spans_dir``), every stored span is also appended to
``SPANS_DIR/<experiment>/runs/<run>/spans.jsonl`` as it arrives, up to ``max_span_file_bytes`` (then the
file stops growing, says so in the status route and a warning, and counts what it missed):
the whole run's Gantt (``rankscope gantt``, ``rankscope run --gantt``), not only the retained steps.

Who held a step up is judged from these spans (``book.stragglers``).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ...core import names as attr
from ...otlp.common import any_value
from ..checked import Limits, Process, Refusals, check_span, span_attributes, span_text

_LIMITS = Limits()
"""The edge's default bounds (a sink passes its own)."""

log = logging.getLogger("rankscope.sink")
MAX_PHASES_PER_STEP = 64
MAX_LINKS = 128
"""Links kept per span (rankscope's SDK sends at most this many; a client's beyond are not kept)."""
ROOT_NAME = "step"


@dataclass(slots=True)
class StoredSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    step: int | None
    process: Process
    attributes: dict[str, Any]
    error: str | None
    links: list[dict[str, str]] = field(default_factory=list)
    """OTel span links (``trace_id``, ``span_id``): e.g. a trainer step to the generations it trained on."""

    def row(self) -> dict[str, Any]:
        """The JSONL form (``rankscope gantt`` reads it; one span per line)."""
        p = self.process
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "name": self.name,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "step": self.step,
            "attempt": p.attempt,
            "process": p.label,
            "role": p.role,
            "replica": p.replica,
            "rank": p.rank,
            "host": p.host,
            "pid": p.pid,
            "attributes": self.attributes,
            "error": self.error,
            "links": self.links,
        }


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1)


class SpanFile:
    """Every stored span of one experiment, one JSONL row each, up to ``max_bytes``. Its handle is
    open while spans come (``release`` closes it, the next span opens it again: the sink's
    descriptor budget)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        file = path.open("a", encoding="utf-8")
        self._file: IO[str] | None = file
        self.bytes = path.stat().st_size
        if self.bytes and _last_byte(path) != b"\n":  # a sink killed mid-line: the next row starts afresh
            file.write("\n")
            self.bytes += 1
        self.not_saved = 0
        """Spans past the cap: stored in memory (the last steps), not in the file."""

    def write(self, span: StoredSpan) -> None:
        if self.not_saved:
            self.not_saved += 1
            return
        line = json.dumps(span.row(), default=str) + "\n"
        if self.bytes + len(line) > self.max_bytes:
            self.not_saved = 1
            log.warning(
                "rankscope sink: span file %s reached its cap of %d bytes: later spans are kept for the last "
                "steps only (raise --max-span-file-bytes)",
                self.path,
                self.max_bytes,
            )
            return
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(line)
        self.bytes += len(line)

    def rows(self, first: int | None, last: int | None, ranks: AbstractSet[int] | None) -> Iterator[str]:
        """The file's lines (JSON rows) of steps in [first, last] and the given ranks, as far as it
        was written when called (call under the lock that guards ``write``; read lazily without it).
        A line cut by a crash is skipped."""
        if self._file is not None:
            self._file.flush()
        return self._read(self.bytes, first, last, ranks)

    def _read(self, size: int, first: int | None, last: int | None, ranks: AbstractSet[int] | None) -> Iterator[str]:
        with self.path.open("rb") as raw:
            for encoded in raw:
                size -= len(encoded)
                if size < 0:  # written after the call (or not yet whole)
                    return
                try:
                    line = encoded.decode()
                    row = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(row, dict):
                    continue
                step = row.get("step")
                if (first is not None and (not isinstance(step, int) or step < first)) or (
                    last is not None and (not isinstance(step, int) or step > last)
                ):
                    continue
                if ranks is None or row.get("rank") in ranks:
                    yield line

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "bytes": self.bytes,
            "capped": bool(self.not_saved),
            "not_saved": self.not_saved,
        }

    def release(self) -> None:
        """Close the handle (written through); the next span opens it again."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.release()


class TraceStore:
    """Spans of one experiment, by step. Not thread-safe: the sink's ingest lock guards it."""

    def __init__(self, *, retain_steps: int = 64, max_spans: int = 200_000, file: SpanFile | None = None) -> None:
        self.retain_steps = retain_steps
        self.max_spans = max_spans
        self.file = file
        self._steps: OrderedDict[int | None, list[StoredSpan]] = OrderedDict()
        self.count = 0
        self.dropped = 0
        self.refused = 0
        """Spans refused at the edge (malformed ids: ``checked.check_span``)."""
        self.attributes_left_out = 0
        """Span attributes past the edge's bounds (``checked.span_attributes``)."""

    def ingest(
        self,
        process: Process,
        scope_spans: Iterable[Any],
        step_at: Callable[[int], int] | None = None,
        refused: Refusals | None = None,
        limits: Limits = _LIMITS,
        horizon: int | None = None,
    ) -> tuple[int, int]:
        """Store one ResourceSpans' spans for ``process``; returns (accepted, rejected): a span
        ``checked.check_span`` refuses is counted, with its reason, in ``refused``, as one whose
        step is past ``horizon`` (the run's ``step_window``: a span of step 10^18 would make every
        real step too old to keep); what a kept span says is cleaned and bounded
        (``checked.span_text``, ``checked.span_attributes``). ``step_at(start_ns)`` gives a span
        without a step its step."""
        decoded: list[StoredSpan] = []
        steps_of: dict[str, int] = {}
        rejected = 0
        for ss in scope_spans:
            for span in ss.spans:
                why = check_span(span)
                if why is not None:
                    rejected += 1
                    self.refused += 1
                    if refused is not None:
                        refused.add(1, why)
                    continue
                a, left_out = span_attributes(span.attributes, limits)
                if left_out:
                    self.attributes_left_out += left_out
                    if attr.STEP not in a:  # the step is kept wherever it was
                        a[attr.STEP] = next(
                            (any_value(kv.value) for kv in span.attributes if kv.key == attr.STEP), None
                        )
                step = a.pop(attr.STEP, None)
                step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
                if step is not None and horizon is not None and step > horizon:
                    rejected += 1
                    self.refused += 1
                    if refused is not None:
                        refused.add(1, "a span of a step more than the step window ahead of the run")
                    continue
                trace_id = span.trace_id.hex()
                if step is not None:
                    steps_of.setdefault(trace_id, step)
                error = (
                    span_text(span.status.message, limits.max_attribute_chars) or "error"
                    if span.status.code == 2
                    else None
                )
                links = [
                    {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                    for link in span.links[:MAX_LINKS]
                    if len(link.trace_id) == 16 and len(link.span_id) == 8
                ]
                decoded.append(
                    StoredSpan(
                        trace_id,
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span_text(span.name, limits.max_name_chars) or "?",
                        int(span.start_time_unix_nano),
                        max(int(span.end_time_unix_nano), int(span.start_time_unix_nano)),
                        step,
                        process,
                        a,
                        error,
                        links,
                    )
                )
        accepted = 0
        for stored in decoded:
            if stored.step is None:
                stored.step = steps_of.get(stored.trace_id)
                if stored.step is None and step_at is not None:
                    stored.step = step_at(stored.start_ns)
            if self._add(stored):
                accepted += 1
                if self.file is not None:
                    self.file.write(stored)
        return accepted, rejected

    def _add(self, span: StoredSpan) -> bool:
        """Keep ``span``, making room by dropping the oldest other steps; too old or no room: count it."""
        if span.step not in self._steps:
            stepped = [s for s in self._steps if s is not None]
            if span.step is not None and len(stepped) >= self.retain_steps:
                oldest = min(stepped)
                if span.step < oldest:  # older than everything retained: not worth a newer step
                    self.dropped += 1
                    return False
                self.count -= len(self._steps.pop(oldest))
            self._steps[span.step] = []
        while self.count >= self.max_spans:
            victims = [s for s in self._steps if s != span.step]
            if not victims:
                self.dropped += 1
                return False
            victim = None if None in victims else min(v for v in victims if v is not None)
            self.count -= len(self._steps.pop(victim))
        self._steps[span.step].append(span)
        self.count += 1
        return True

    def steps(self) -> list[int]:
        return sorted(s for s in self._steps if s is not None)

    def spans(self, step: int | None) -> list[StoredSpan]:
        return list(self._steps.get(step, ()))

    def select(
        self, first: int | None = None, last: int | None = None, ranks: AbstractSet[int] | None = None
    ) -> list[StoredSpan]:
        """Spans of steps in [first, last] (None: open end), of the given ranks only, by step."""
        out: list[StoredSpan] = []
        for step in self.steps():
            if (first is not None and step < first) or (last is not None and step > last):
                continue
            out.extend(s for s in self._steps[step] if ranks is None or s.process.rank in ranks)
        return out

    def phase_times(self, step: int) -> dict[str, dict[Any, float]]:
        """Seconds each process spent in each span name of ``step`` (the root span left out)."""
        per_phase: dict[str, dict[Any, float]] = {}
        for span in self._steps.get(step, ()):
            if span.end_ns <= span.start_ns or (span.name == ROOT_NAME and not span.parent_span_id):
                continue
            by_process = per_phase.setdefault(span.name, {})
            by_process[span.process] = by_process.get(span.process, 0.0) + (span.end_ns - span.start_ns) / 1e9
        return {name: per_phase[name] for name in sorted(per_phase)[:MAX_PHASES_PER_STEP]}


def rows(spans: Iterable[StoredSpan]) -> Iterator[dict[str, Any]]:
    for span in spans:
        yield span.row()


MAX_QUERY_RANKS = 65_536
"""Ranks one span query may name (a query string must not make the sink build a huge set)."""


def parse_ranks(text: str | None) -> set[int] | None:
    """``"0,2,4-7"`` → {0, 2, 4, 5, 6, 7}; None or empty → None (all ranks). Raises ``ValueError``
    for a malformed list or one naming more than ``MAX_QUERY_RANKS`` ranks."""
    if not text:
        return None
    if text.count(",") >= MAX_QUERY_RANKS:
        raise ValueError(f"ranks: more than {MAX_QUERY_RANKS} ranks")
    found: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = (int(bound) for bound in part.split("-", 1))
            if high - low >= MAX_QUERY_RANKS - len(found):
                raise ValueError(f"ranks: more than {MAX_QUERY_RANKS} ranks")
            found.update(range(low, high + 1))
        elif part:
            found.add(int(part))
        if len(found) > MAX_QUERY_RANKS:
            raise ValueError(f"ranks: more than {MAX_QUERY_RANKS} ranks")
    return found
