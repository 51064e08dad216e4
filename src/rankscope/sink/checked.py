"""The checked data every stage of the sink shares: the leaf below the stages, so imports go one way.

The edge (``edge.validate``) turns a decoded request into these: a process's checked batch
(``ResourceBatch``: its ``StateRows`` per reduce type and step, ``PlainPoint``s, ``LogRecord``s),
what it refused and why (``Refusals``), under which ``Limits``, and whose it is (``Scope``: the
sending token's, which the edge puts on the request's client). The step book takes them, the
write-ahead log records them and replays them, the views write what was made of them. ``Process``
is who sent them, as the step book's roster knows it (``book.roster`` builds it from the checked
Resource); it names the values in every view. The text checks are here because both the edge
(names, ids) and the trace store (each kept span's name and attributes) apply them.

Data and pure functions only: nothing here imports another part of the sink.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..otlp.common import any_value
from ..otlp.markers import Marker
from ..otlp.metrics import MAX_BUCKETS, Row
from ..otlp.samples import SampleRow

OnError = Callable[[str, BaseException], None]
"""How a stage reports an internal failure (where, what): counted and logged by its owner, never raised."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one client can make the sink hold (``SinkConfig`` carries them)."""

    max_name_chars: int = 255
    """A metric key (OTel instrument names are at most 255 characters)."""
    max_id_chars: int = 256
    """An experiment id, role or replica."""
    max_attribute_chars: int = 4096
    """Any other string attribute value."""
    max_resource_attributes: int = 128
    max_span_attribute_chars: int = 16 * 1024
    """Characters of one span's attributes, keys and values, that the trace store keeps."""
    max_resource_bytes: int = 16 * 1024
    """A Resource's encoded size: the sink keeps each process's Resource, and its write-ahead log
    repeats it in every step's record (a padded one would cost memory and disk many times over)."""
    max_buckets: int = MAX_BUCKETS
    """Buckets of one ExponentialHistogram side (scale 6 spans the finite doubles in ~131k)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose data a request is: the scope of the bearer token it carried (``edge.auth``).

    A scope may write the experiments it names: each entry of ``experiments`` is an exact
    experiment id, or a prefix when it ends in ``*`` (``"*"``: every experiment). The run book
    records the scope that created each run (``runs.runbook``): only that scope may resume it,
    restart it with a higher attempt, say goodbye to it or send to it."""

    name: str = ""
    """The scope's name (``""``: the sink's one ``--token``, or everyone on a sink without tokens)."""
    experiments: tuple[str, ...] = ("*",)

    def allows(self, experiment: str) -> bool:
        """Whether this scope may write ``experiment``."""
        for entry in self.experiments:
            if entry.endswith("*") and experiment.startswith(entry[:-1]):
                return True
            if entry == experiment:
                return True
        return False

    @property
    def label(self) -> str:
        """How answers name the scope."""
        return f"scope {self.name[:64]!r}" if self.name else "the sink's all-experiments scope"


ALL = Scope()
"""Every experiment: the sink's single ``--token``, and every client of a sink without tokens."""


@dataclass(frozen=True, slots=True)
class SpanQuery:
    """Which stored spans a caller asks for: a run's (None: the experiment's latest), steps in
    [first, last] (None: an open end), of the given ranks only (None: every rank)."""

    experiment: str
    first: int | None = None
    last: int | None = None
    ranks: frozenset[int] | None = None
    run: str | None = None


@dataclass(slots=True)
class Refusals:
    """What one request refused: a count and the first few reasons (for ``partial_success``)."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)
    received: int = 0
    """Points the request held, taken or not (what ``partial_success`` is measured against)."""

    def add(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        self.count += n
        if len(self.reasons) < 8:
            self.reasons.append(reason)

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


@dataclass(slots=True)
class StateRows:
    """One process's checked states of one reduce type and step: ``keys[i]`` holds ``rows[i]``.

    A built-in reduce type's row is its state field by field (``rankscope.otlp.metrics.FIELDS``);
    a custom type's row is ``(state,)``. Rows, not a state dict per point: a sink merges them
    into running states (``book.merge``) and keeps nothing per point past the step's view."""

    reduce: str
    step: int | None
    keys: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    time_unix_nano: int = 0
    """Without a step: when the first point was taken (the step whose window holds it is chosen)."""


class PlainPoint(NamedTuple):
    """A checked plain OTel point (no rankscope reduce type): mapped into the run's view by
    ``book.streams`` (a tuple underneath: one is made per point)."""

    name: str
    series: str
    form: str
    """Its OTel kind and temporality (``counter.cumulative``, ``gauge``, ...)."""
    row: tuple[Any, ...]
    start_unix_nano: int
    time_unix_nano: int
    step: int | None
    """Its ``rankscope.step`` attribute, else None (the step whose window holds its time)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """An ordinary OTel log record, checked: what the views write."""

    time_unix_nano: int
    severity: str
    body: str
    attributes: dict[str, Any]
    step: int | None
    trace_id: str


@dataclass(slots=True)
class ResourceBatch:
    """What one ResourceMetrics (or ResourceLogs) of one process carries, checked."""

    experiment: str
    resource: dict[str, Any]
    states: list[StateRows] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    goodbye: bool = False
    streams: list[tuple[str, float, int | None]] = field(default_factory=list)
    foreign: int = 0
    """Points without ``rankscope.reduce``: plain OTel points (counted in the status route)."""
    plain: list[PlainPoint] = field(default_factory=list)
    """Those of them taken, checked (``otlp.foreign``); ``sink.book.streams`` makes them step rows."""
    logs: list[LogRecord] = field(default_factory=list)
    """Ordinary OTel log records, checked."""
    samples: list[SampleRow] = field(default_factory=list)
    """Sample-table rows (``record_sample``), checked; streamed ones (side ``stream``) included."""
    refused: int = 0
    """Points of this batch refused at the edge (the experiment's status counts them)."""
    digest: bytes = b""
    """Of the ResourceMetrics as received: a retried request is recognized and not merged twice."""
    order: list[str] = field(default_factory=list)
    """Its metric names in the order the process sent them, which is the order it first recorded
    them in (``states`` groups them by reduce type): the views list a run's keys in it."""

    @property
    def point_count(self) -> int:
        return sum(len(s.keys) for s in self.states) + len(self.plain) + len(self.samples)


Group = tuple[str, str | None, int]
"""(role, replica, attempt): the processes that share one rank numbering."""


@dataclass(slots=True, eq=False)
class Process:
    """One process of the run, as its Resource describes it."""

    id: str
    label: str
    role: str
    replica: str | None
    rank: int
    world_size: int
    attempt: int
    host: str
    pid: int | None
    resource: Mapping[str, Any]
    stepped: bool = False
    last_marker: int = -1
    live: bool = True
    merged: bool = False
    """States merged upstream by a Collector (``rankscope.merged``): in the global view only."""
    ended: bool = False
    """It said goodbye (``rankscope.goodbye``): it ended, and does not come back."""
    suspect: bool = False
    """It took the slot of a process that ended, in a run whose processes had all ended, at the
    same attempt: its first data decides whether it is another launch (``reused``)."""
    reused: bool = False
    """...and that data was for a step the run had finalized already: another launch reusing the run
    id (a fixed ``--rdzv-id``, a ``RANKSCOPE_RUN_ID`` set by hand). Its data is refused."""

    @property
    def group(self) -> Group:
        return (self.role, self.replica, self.attempt)


def ended_reason(run: str, resuming: bool) -> str:
    """Why data for a run whose processes all said goodbye is refused: one reason for every later
    point, whoever sends it (the step book's and the run book's alike). ``resuming``: the sender
    carries ``rankscope.run.resume``."""
    return f"run {run[:64]!r} ended (every process said goodbye) and another launch reuses its id: " + (
        "a resuming launch needs its own run id (unset RANKSCOPE_RUN_ID, a new --rdzv-id); "
        "RANKSCOPE_RESUME names the run it continues"
        if resuming
        else "give the launch its own run id, or resume the run (RANKSCOPE_RESUME)"
    )


MAX_POINT_ATTRIBUTES = 128
"""Attributes of one point at most (the OTel SDK's default attribute count limit)."""


def clean_text(text: str, limit: int) -> str | None:
    """``text`` if it is non-empty, at most ``limit`` characters and has no control or format
    characters (NUL, newlines, bidi overrides); else None."""
    if not text or len(text) > limit:
        return None
    if text.isprintable():
        return text
    return None if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in text) else text


def check_span(span: Any) -> str | None:
    """Why a received span is refused, or None: ids of the wrong length or all zeros (invalid in
    OTLP: the span cannot be placed), or an end before its start (no Gantt bar has a negative
    length). What it says is cleaned instead (``span_text``, ``span_attributes``): a failing
    span's long error message or a plain OTel client's long SQL name is worth keeping cut."""
    if len(span.trace_id) != 16 or len(span.span_id) != 8 or len(span.parent_span_id) not in (0, 8):
        return "a span with a malformed trace, span or parent span id"
    if not any(span.trace_id) or not any(span.span_id):
        return "a span with an all-zero trace or span id"
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return "a span that ends before it starts"
    return None


def span_text(text: str, limit: int) -> str:
    """A span's name or status message as stored and shown: at most ``limit`` characters (cut ones
    end in an ellipsis), control and format characters as U+FFFD, never raising."""
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else "\ufffd" for c in text)


def span_attributes(kvs: Any, limits: Limits) -> tuple[dict[str, Any], int]:
    """A span's attributes as stored: the first ``MAX_POINT_ATTRIBUTES`` whose keys are clean, each
    string value cut to ``max_attribute_chars``, while they fit ``max_span_attribute_chars`` in
    all; returns them and how many were left out (the store records that count)."""
    out: dict[str, Any] = {}
    room = limits.max_span_attribute_chars
    for kv in kvs:
        if len(out) >= MAX_POINT_ATTRIBUTES:
            break
        key = clean_text(kv.key, limits.max_name_chars)
        if key is None:
            continue
        value = any_value(kv.value)
        if isinstance(value, str):
            value = span_text(value, limits.max_attribute_chars)
        elif not isinstance(value, (int, float, bool)):
            value = span_text(str(value), limits.max_attribute_chars)
        size = len(key) + (len(value) if isinstance(value, str) else 8)
        if size > room:
            break
        room -= size
        out[key] = value
    return out, len(kvs) - len(out)
