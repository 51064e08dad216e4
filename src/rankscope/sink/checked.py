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

    # What one request may cost (``edge.cost``): past a bound it is refused whole, before any of it
    # is decoded (points, spans, log records, resources: counted while the body is walked,
    # ``otlp.raw``) or taken (experiments), and new runs past theirs wait for the client's retry.
    # Each default is twice or more what the largest honest sender sends (docs/sink.md, "Limits").
    max_points: int = 1 << 20
    """Points of one request (a metric without points, a scope without metrics: one each). A
    Collector gateway forwards its merge window once it holds 200,000 points (``rankscopemerge``'s
    ``max_points``): at most that plus the request that filled it, an agent's window of as many
    plus one process's step (``max_keys_per_step``, 100,000): about 500,000. The SDK's exporter
    sends 8,192 points a request, or one whole step: 10,000 for a 10,000-key process."""
    max_records: int = 1 << 16
    """Spans of one traces request, log records of one logs request (a scope without any: one each).
    The SDK's exporter sends 4,096 spans a request (``export.outboxes.SpanOutbox``), the OTel SDK's
    batch processors 512; an agent Collector's ``batch`` forwards 8,192 and the request that filled
    it, which a gateway passes on as it came: about 12,000."""
    max_resources: int = 16_384
    """ResourceMetrics (ResourceSpans, ResourceLogs) of one request: one per process (the SDK sends
    one; a gateway's window holds each process's flush markers under the process's Resource, once
    per request it got from it), as many as one run may hold processes (``ExperimentLimits.max_processes``)."""
    max_experiments: int = 1024
    """Experiments one request names: more than one client may hold runs open (``RunLimits.per_client``,
    512 by default; a gateway is one client), so a request over it would be refused in part anyway."""
    max_new_runs: int = 128
    """Runs one request may open (each opens its log and views: a few milliseconds, an fsync): the
    rest of the request is answered 429 and opened by the client's retry, which the sink knows by
    its digests and does not merge twice. Spans and log records have no digest: a traces or logs
    request opens all its runs before it takes anything (``runs.opening.Opener.resolve_first``), so
    one answered 429 took nothing, and its retry finds open the runs it opened. Only a burst of as
    many jobs starting within one of a gateway's 200 ms windows opens more."""

    def __post_init__(self) -> None:
        for name in ("max_points", "max_records", "max_resources", "max_experiments", "max_new_runs"):
            if getattr(self, name) < 1:
                raise ValueError(f"limits: {name} must be >= 1, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose data a request is: the scope of the bearer token it carried (``edge.auth``).

    A scope may write the experiments it names: each entry of ``experiments`` is an exact
    experiment id, or a prefix when it ends in ``*`` (``"*"``: every experiment). The run book
    records the scope that created each run (``runs.runbook``): only that scope may resume it,
    restart it with a higher attempt, say goodbye to it or send to it.

    Scopes of one sink never share an experiment (``overlap``: ``edge.auth.load_tokens`` refuses
    a tokens file where they would): an experiment id is any clean text (``clean_text``), so two
    entries are disjoint only when no id can match both, which ``overlap`` decides exactly."""

    name: str = ""
    """The scope's name (``""``: the sink's one ``--token``, or everyone on a sink without tokens)."""
    experiments: tuple[str, ...] = ("*",)

    def allows(self, experiment: str) -> bool:
        """Whether this scope may write ``experiment``."""
        for entry in self.experiments:
            text, prefix = _pattern(entry)
            if experiment.startswith(text) if prefix else experiment == text:
                return True
        return False

    def overlap(self, other: Scope) -> tuple[str, str, str] | None:
        """An entry of this scope and one of ``other`` that both match some experiment id, and the
        shortest such id (``""``: both take every id); None when no id is allowed by both."""
        for mine in self.experiments:
            for theirs in other.experiments:
                common = _common(_pattern(mine), _pattern(theirs))
                if common is not None:
                    return mine, theirs, common
        return None

    @property
    def label(self) -> str:
        """How answers name the scope."""
        return f"scope {self.name[:64]!r}" if self.name else "the sink's all-experiments scope"


def _pattern(entry: str) -> tuple[str, bool]:
    """An entry of ``Scope.experiments`` as (its text, whether it is a prefix): ``"grpo-*"`` is
    ``("grpo-", True)``, ``"eval"`` is ``("eval", False)``, ``"*"`` is ``("", True)``."""
    return (entry[:-1], True) if entry.endswith("*") else (entry, False)


def _common(a: tuple[str, bool], b: tuple[str, bool]) -> str | None:
    """The shortest experiment id two entries (``_pattern``) both match, or None: two exact ids
    only when equal, an exact id and a prefix when the id starts with it, two prefixes when one
    starts with the other (the longer is then the shortest id both take)."""
    (x, x_prefix), (y, _) = sorted((a, b), key=lambda p: len(p[0]))
    if x_prefix:  # every id both take starts with the longer text, and it is one
        return y if y.startswith(x) else None
    return x if x == y else None  # an exact id no longer than the other's text: only that text itself


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
    """What one request refused: a count and the first few distinct reasons (for ``partial_success``)."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)
    received: int = 0
    """Points the request held, taken or not (what ``partial_success`` is measured against)."""

    def add(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        self.count += n
        if len(self.reasons) < 8 and reason not in self.reasons:  # 16 runs refused alike: said once
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
    spreads: dict[int, Row] | None = None
    """A merged process's rows: ``rows[i]``'s spread of the processes' own values, where its point
    carried a well-formed one (``otlp.metrics.read_spread``; ``book.spread``)."""


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
    exit_error: str | None = None
    """The goodbye's ``rankscope.exit.error``: printable, at most ``EXIT_ERROR_CHARS``."""
    exit_step: int | None = None
    """...and the step it says the process was in then (``rankscope.step``), unchecked against the run's."""
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

    @property
    def record_count(self) -> int:
        """Of a logs request's batch: its streamed values, log records and sample rows."""
        return len(self.streams) + len(self.logs) + len(self.samples)


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
    exit_error: str | None = None
    """What its goodbye said of the exception that ended it (``rankscope.exit.error``), checked."""
    exit_step: int | None = None
    """...and the step it said it was in (``roster.died_in`` weighs it against the run's steps)."""
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
