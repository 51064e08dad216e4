"""The sink's edge: every received point is checked here, once, before anything trusts it.

A decoded OTLP request is client data. This module turns it into plain, checked Python
values (``sink.checked``, below every stage: ``ResourceBatch``: who sent it, its states as rows
per reduce type and step, its flush markers) and a count of what was refused and why. Nothing
downstream (step alignment, reduction, views, the write-ahead log) ever sees a protobuf or an
unchecked value, so nothing downstream may raise on client data.

Decoding is the codec's (``rankscope.otlp``: its readers return a row or the reason a point
does not hold one, and never raise); the limits and the experiment's bookkeeping are the sink's.
This is the sink's hot path, built to keep up with a thousand ranks on one core: requests
are parsed with point attributes left as bytes (``otlp.raw``), each distinct attribute list is
decoded and judged once (``_SHAPES``: its reduce type, step and reader), and a point costs a
dictionary lookup and its reader.
What is checked, per point: the reduce attribute is a string naming a known reduce type;
the OTel point kind is the one that reduce type travels as (``rankscope.otlp.metrics``);
the state's fields exist and are in range (counts non-negative and bounded, an
ExponentialHistogram's scale in [6, 20], bucket offsets and widths bounded, bucket counts
adding up to no more than the point's count, a custom state's fields numeric and mergeable);
the step is a non-negative int64 (not a bool, not a string) within ``step_window`` steps
ahead of the run's frontier (checked later, by the step book: ``book.steps``; the frontier is
the run's own); names and attributes have bounded sizes and no control characters.
A refused point is counted in OTLP ``partial_success`` with a message naming the first
offending key and why; the rest of the request is accepted.

What a request may cost is checked first, whole (``edge.cost``): its points (spans, log records)
and resources are counted while its body is walked, before any of it is decoded
(``otlp.raw.walk_metrics``, ``walk_records``), and weighed in the sink's gate; the experiments it
names once its Resources are checked and before any point is; past a bound of ``Limits``
(``max_points``, ``max_records``, ``max_resources``, ``max_experiments``) the request is refused whole
(``RefusedError`` of kind COSTLY: nothing of it was taken, sent again it is refused again), past the
gate's budget retry-later (CAPACITY).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from ...core import names as attr
from ...core.paths import safe_component
from ...metrics.reduce import BUILTIN_REDUCES, Reduce
from ...otlp import foreign
from ...otlp.common import attributes, decode_step
from ...otlp.logs import decode_record, decode_stream, is_stream
from ...otlp.markers import EXIT_ERROR_CHARS, MAX_SPANS, decode_marker, decode_ranks
from ...otlp.metrics import READERS, SUM_SQ, Reader, check_custom_state, decode_custom_field, read_spread
from ...otlp.raw import ParsedMetrics, decode_attribute, decode_attributes
from ...otlp.samples import decode_row, is_sample
from ..checked import (
    MAX_POINT_ATTRIBUTES,
    Limits,
    LogRecord,
    PlainPoint,
    Refusals,
    ResourceBatch,
    StateRows,
    clean_text,
)
from .cost import OnCostly, Weigh, counted, experiments_within, logs_within, metrics_within, traces_within


def check_resource(raw: Any, limits: Limits) -> tuple[str, dict[str, Any]] | str:
    """(experiment id, resource attributes) of a Resource, or why it is refused."""
    if len(raw.attributes) > limits.max_resource_attributes:
        return f"resource has {len(raw.attributes)} attributes (limit {limits.max_resource_attributes})"
    size = raw.ByteSize()
    if size > limits.max_resource_bytes:
        return f"resource of {size} bytes (limit {limits.max_resource_bytes})"
    resource = attributes(raw.attributes)
    for key, value in resource.items():
        if len(key) > limits.max_name_chars:
            return f"resource attribute name of {len(key)} characters (limit {limits.max_name_chars})"
        if isinstance(value, str) and len(value) > limits.max_attribute_chars:
            return f"resource attribute {key[:64]!r} of {len(value)} characters (limit {limits.max_attribute_chars})"
    experiment = resource.get(attr.EXPERIMENT_ID)
    if not isinstance(experiment, str) or not experiment:
        return f"resource without {attr.EXPERIMENT_ID}"
    for name in (
        attr.EXPERIMENT_ID,
        attr.RUN_ID,
        attr.RUN_RESUME,
        attr.ROLE,
        attr.REPLICA,
        attr.SERVICE_NAME,
        attr.SERVICE_INSTANCE_ID,
    ):
        value = resource.get(name)
        if value is not None and clean_text(str(value), limits.max_id_chars) is None:
            return f"{name} is empty, longer than {limits.max_id_chars} characters or holds control characters"
    for name in (attr.RANK, attr.WORLD_SIZE, attr.EXPERIMENT_ATTEMPT, attr.PROCESS_PID):
        value = resource.get(name)
        if value is not None and not _small_int(value):
            return f"{name} must be a non-negative integer, got {str(value)[:32]!r}"
    return experiment, resource


def _small_int(value: Any) -> bool:
    """A non-negative integer below 2**31, or a string of one (ranks arrive as either)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        return value.isascii() and value.isdigit() and len(value) < 10
    return isinstance(value, int) and 0 <= value < 2**31


def metrics_batches(
    request: Any, limits: Limits, refused: Refusals, on_costly: OnCostly | None = None, gate: Weigh | None = None
) -> list[ResourceBatch]:
    """Check an ``ExportMetricsServiceRequest`` (as the transports hand it on: ``otlp.raw.EncodedMetrics``;
    bytes, a message or an already decoded list alike); the refused points are added to ``refused``.

    Raises ``RefusedError`` before anything of it is taken (``edge.cost``): of kind BAD_REQUEST when
    it does not decode, of kind COSTLY past a per-request bound of ``limits``, of kind CAPACITY
    (``OverloadedError``) when its points do not fit in ``gate`` now, its points and the reason then
    in ``refused``, handed to ``on_costly`` first (the sink's tally: the status route counts it)."""
    with counted(refused, on_costly):
        parsed = _resources(metrics_within(request, limits, refused, gate), limits, refused)
    batches: list[ResourceBatch] = []
    spans = [MAX_SPANS]  # the rank-set ranges the whole request may hold (``_rank_sets``)
    for encoded, rm, checked in parsed:
        if isinstance(checked, str):  # nothing without an experiment is taken: said, not dropped silently
            points = sum(_count(m) for sm in rm.scope_metrics for m in sm.metrics)
            refused.received += points
            refused.add(points, checked)
            continue
        batch = ResourceBatch(*checked, digest=hashlib.blake2b(encoded, digest_size=16).digest())
        before = refused.count
        groups: dict[_Group, StateRows | str] = {}
        for sm in rm.scope_metrics:
            refused.received += _scope(batch, groups, sm.metrics, limits, refused, spans)
        batch.states = [rows for rows in batch.states if rows.keys]
        batch.refused = refused.count - before
        batches.append(batch)
    return batches


def _resources(
    parsed: ParsedMetrics, limits: Limits, refused: Refusals
) -> list[tuple[bytes, Any, tuple[str, dict[str, Any]] | str]]:
    """Each ResourceMetrics with its checked Resource (``check_resource``); refused whole once they
    name more than ``max_experiments`` experiments, before any point is checked."""
    experiments: set[str] = set()
    checked = []
    for encoded, rm in parsed:
        found = check_resource(rm.resource, limits)
        if not isinstance(found, str):
            experiments_within(experiments, found[0], limits, refused, lambda: _points_of(parsed))
        checked.append((encoded, rm, found))
    return checked


_Group = tuple[str, int | None]


class _Shape(NamedTuple):
    """What an attribute list means (made once per distinct list: ``_SHAPES``)."""

    reduce: str | None
    """None: not rankscope's (a plain OTel point)."""
    step: int | None
    extra: Mapping[str, Any]
    """The other attributes."""
    group: _Group | None
    """(reduce, step): the rows it goes to."""
    reader: Reader | None
    """The reduce type's reader; None: a custom reduce type."""


_NOTHING: Mapping[str, Any] = MappingProxyType({})
_FOREIGN = _Shape(None, None, _NOTHING, None, None)
_SHAPES: dict[tuple[bytes, ...], _Shape | str] = {}
"""Encoded attribute list -> its shape, or why it is refused. A pure function of the bytes, so
shared by every request; bounded, and never holding a value of its own (``rankscope.sum_sq``)
or a long list."""
_MAX_SHAPES = 65_536
_MAX_SHAPE_BYTES = 512
_MAX_SHAPE_ATTRIBUTES = 8
_KINDS: dict[str, str] = {}
"""Metric names that passed ``clean_text`` -> the point kind they came with last (bounded like
``_SHAPES``)."""


def _shape(raw: tuple[bytes, ...]) -> _Shape | str:
    """Decode an attribute list that is not in ``_SHAPES`` (and keep it there when worth it)."""
    if len(raw) > MAX_POINT_ATTRIBUTES:
        return f"{len(raw)} point attributes (limit {MAX_POINT_ATTRIBUTES})"
    head = _SHAPES.get(raw[:-1]) if len(raw) > 1 else None
    if isinstance(head, _Shape) and head.group is not None and not head.extra:  # a known list + ``rankscope.sum_sq``
        last = decode_attribute(raw[-1])
        if last is not None and last[0] == SUM_SQ:
            return head._replace(extra={SUM_SQ: last[1]})
    a = decode_attributes(raw)
    shape: _Shape | str
    if isinstance(a, str):
        shape = a
    else:
        reduce = a.pop(attr.REDUCE, None)
        step = decode_step(a.pop(attr.STEP, None))
        if isinstance(step, str):
            shape = step
        elif reduce is None:
            shape = _Shape(None, step, a or _NOTHING, None, None) if a or step is not None else _FOREIGN
        elif not isinstance(reduce, str):
            shape = f"{attr.REDUCE} must be a string, got {type(reduce).__name__}"
        else:
            reduce = reduce.lower()
            shape = _Shape(reduce, step, a or _NOTHING, (reduce, step), READERS.get(reduce))
        if SUM_SQ in a:  # a value of its own: keep the list without it instead (the next one hits)
            last = decode_attribute(raw[-1])
            if isinstance(shape, _Shape) and last is not None and last[0] == SUM_SQ and len(raw) > 1:
                rest = {k: v for k, v in shape.extra.items() if k != SUM_SQ}
                _keep(raw[:-1], shape._replace(extra=rest or _NOTHING))
            return shape
    _keep(raw, shape)
    return shape


def _keep(raw: tuple[bytes, ...], shape: _Shape | str) -> None:
    """Cache a short attribute list's shape (memory per entry stays small: a few short bytes)."""
    if len(raw) <= _MAX_SHAPE_ATTRIBUTES and sum(len(kv) for kv in raw) <= _MAX_SHAPE_BYTES:
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        _SHAPES[raw] = shape


_Custom = dict[tuple[str, int | None, int], dict[str, Any]]
"""A custom reduce type's states being assembled from their fields' points, by (reduce, step, time)."""


def _scope(
    batch: ResourceBatch,
    groups: dict[_Group, StateRows | str],
    metrics: Any,
    limits: Limits,
    refused: Refusals,
    spans: list[int],
) -> int:
    """Check one scope's metrics into ``batch``; returns how many points they held.

    A sink's hot path: per point one attribute-list lookup, one group lookup and one reader
    call; the rest is resolved once per distinct attribute list or (reduce, step)."""
    received = 0
    for metric in metrics:
        name = metric.name
        kind, points, clean = _data_points(metric, name, limits)
        if not kind:
            continue
        n = len(points)
        received += n
        if name == attr.FLUSH_MARKER:
            _markers(batch, points, refused)
            continue
        if name == attr.FLUSH_RANKS:
            _rank_sets(batch, points, refused, spans)
            continue
        if name == attr.GOODBYE:
            batch.goodbye = True
            error = _exit_error(points)
            if error is not None:
                batch.exit_error, batch.exit_step = error, _exit_step(points)
            continue
        if not clean or len(name) > limits.max_name_chars:
            why = f"metric name of {len(name)} characters is empty, too long or has control characters"
            refused.add(n, f"{name[:40]!r}...: {why}")
            continue
        _points(batch, groups, metric, name, kind, points, limits, refused)
    return received


def _data_points(metric: Any, name: str, limits: Limits) -> tuple[str, Any, bool]:
    """(kind, data points, whether the name is clean) of a metric; kind "" when it holds no data."""
    kind = _KINDS.get(name, "")  # the oneof test costs more than trying the kind this name had last
    points = getattr(metric, kind).data_points if kind else ()
    clean = True
    if not points:  # a new name, another kind this time, or no points
        kind = metric.WhichOneof("data") or ""
        if not kind:
            return "", (), True
        points = getattr(metric, kind).data_points
        clean = _clean_name(name, kind, limits)
    return kind, points, clean


def _points(
    batch: ResourceBatch,
    groups: dict[_Group, StateRows | str],
    metric: Any,
    name: str,
    kind: str,
    points: Any,
    limits: Limits,
    refused: Refusals,
) -> None:
    """Check one metric's points (its name already checked) into ``batch``."""
    custom: _Custom | None = None
    form: str | None = None
    for p in points if len(points) != 1 else (points[0],):  # indexing one point is cheaper than iterating
        raw = tuple(p.attributes[:])  # a slice: tuple() over the container itself is 3x slower
        shape = _SHAPES.get(raw) or _shape(raw)
        if isinstance(shape, str):
            refused.add(1, f"{name}: {shape}")
            continue
        _, step, extra, group, reader = shape
        if group is None:  # a plain OTel point: taken by the documented rules (``otlp.foreign``)
            batch.foreign += 1
            form = form or foreign.form_of(kind, getattr(metric, kind))
            _foreign_point(batch, name, form, p, step, extra, limits, refused)
            continue
        target = groups.get(group)
        if target is None:
            target = groups[group] = _group(batch, group)
            if step is None and not isinstance(target, str):
                target.time_unix_nano = p.time_unix_nano
        if isinstance(target, str):
            refused.add(1, f"{name}: {target}")
            continue
        if reader is None:  # a custom reduce type: one Gauge point per numeric state field
            custom = _custom_field(custom, name, target, group, kind, p, extra, refused)
            continue
        row = reader(kind, p, extra, limits.max_buckets)
        if isinstance(row, str):
            refused.add(1, f"{name}: {row}")
            continue
        if extra and attr.SPREAD_N in extra:  # a Collector's merged point: its processes' spread
            spread = read_spread(extra)
            if spread is not None:
                if target.spreads is None:
                    target.spreads = {}
                target.spreads[len(target.rows)] = spread
        target.keys.append(name)
        target.rows.append(row)
        batch.order.append(name)
    if custom is not None:
        _custom_states(name, custom, groups, refused)


def _foreign_point(
    batch: ResourceBatch,
    name: str,
    form: str,
    p: Any,
    step: int | None,
    extra: Mapping[str, Any],
    limits: Limits,
    refused: Refusals,
) -> None:
    """A plain OTel point of ``form``: its row into ``batch.plain``, or refused."""
    row = foreign.read(form, p, limits.max_buckets) if form in foreign.FORMS else form
    if isinstance(row, str):
        refused.add(1, f"{name}: {row}")
    elif row is not None:  # None: no recorded value (a Prometheus staleness marker)
        series = foreign.series_name(name, extra)
        batch.plain.append(PlainPoint(name, series, form, row, p.start_time_unix_nano, p.time_unix_nano, step))


def _custom_field(
    custom: _Custom | None,
    name: str,
    target: StateRows,
    group: _Group,
    kind: str,
    p: Any,
    extra: Mapping[str, Any],
    refused: Refusals,
) -> _Custom | None:
    """One point of a custom reduce type's state: its field into ``custom`` (made on the first
    field), or refused. Returns ``custom``."""
    found = decode_custom_field(target.reduce, kind, p, extra)
    if isinstance(found, str):
        refused.add(1, f"{name}: {found}")
    else:
        state = {"reduction_type": target.reduce}
        custom = {} if custom is None else custom
        custom.setdefault((*group, p.time_unix_nano), state)[found[0]] = found[1]
    return custom


def _exit_error(points: Any) -> str | None:
    """A goodbye's ``rankscope.exit.error``: printable text, bounded; anything else is no error said."""
    for p in points:
        a = decode_attributes(p.attributes)
        text = a.get(attr.EXIT_ERROR) if isinstance(a, dict) else None
        if isinstance(text, str) and text:
            return "".join(c if c.isprintable() else "?" for c in text[:EXIT_ERROR_CHARS])
    return None


def _exit_step(points: Any) -> int | None:
    """The step a failed goodbye says its process was in: a valid ``rankscope.step``, else None."""
    for p in points:
        a = decode_attributes(p.attributes)
        step = decode_step(a.get(attr.STEP)) if isinstance(a, dict) else None
        if isinstance(step, int):
            return step
    return None


def _markers(batch: ResourceBatch, points: Any, refused: Refusals) -> None:
    for p in points:
        a = decode_attributes(p.attributes)
        marker = a if isinstance(a, str) else decode_marker(a, p.time_unix_nano, p.start_time_unix_nano)
        if isinstance(marker, str):
            refused.add(1, f"{attr.FLUSH_MARKER}: {marker}")
        else:
            batch.markers.append(marker)


def _rank_sets(batch: ResourceBatch, points: Any, refused: Refusals, spans: list[int]) -> None:
    """A Collector's merged markers: taken from a merged resource only (a process names itself in
    its own markers), and at most ``MAX_SPANS`` ranges a request (``spans``: what is left), so a
    request's text cannot become millions of ranges in memory."""
    name = attr.FLUSH_RANKS
    if batch.resource.get(attr.MERGED) is not True:
        refused.add(len(points), f"{name}: only a Collector's merge sends rank sets ({attr.MERGED})")
        return
    for p in points:
        a = decode_attributes(p.attributes)
        text = a.get(attr.RANKS) if isinstance(a, dict) else None
        if isinstance(text, str) and text.count(",") >= spans[0]:
            refused.add(1, f"{name}: more than {MAX_SPANS} ranges in one request")
            continue
        marker = a if isinstance(a, str) else decode_ranks(a, p.time_unix_nano, p.start_time_unix_nano)
        if isinstance(marker, str):
            refused.add(1, f"{name}: {marker}")
        elif marker.ranks is not None:
            spans[0] -= len(marker.ranks.spans)
            batch.markers.append(marker)


def _custom_states(
    name: str,
    custom: _Custom,
    groups: dict[_Group, StateRows | str],
    refused: Refusals,
) -> None:
    """A custom reduce type's states, assembled from their fields' points, checked once each."""
    for (reduce, step, _), state in custom.items():
        why = check_custom_state(reduce, state)
        target = groups[(reduce, step)]
        if why is not None:
            refused.add(1, f"{name}: {why}")
        elif isinstance(target, StateRows):
            target.keys.append(name)
            target.rows.append((state,))


def _clean_name(name: str, kind: str, limits: Limits) -> bool:
    """Whether a metric name passes ``clean_text``; a clean one is kept in ``_KINDS``."""
    if name not in _KINDS and clean_text(name, limits.max_name_chars) is None:
        return False
    if len(_KINDS) >= _MAX_SHAPES:
        _KINDS.clear()
    _KINDS[name] = kind
    return True


def _group(batch: ResourceBatch, group: _Group) -> StateRows | str:
    """The batch's rows of (reduce, step), or why that reduce type is refused."""
    reduce, step = group
    if reduce == "sample":
        return "Reduce.SAMPLE rows travel as log records (record_sample), not as metric points"
    if reduce not in BUILTIN_REDUCES:
        try:
            Reduce.get(reduce)
        except KeyError:
            return f"unknown reduce type {reduce[:64]!r}"
        except Exception as exc:  # an installed plugin that fails to load: the sender's problem, not ours
            return f"reduce type {reduce[:64]!r} did not load ({type(exc).__name__})"
    rows = StateRows(reduce, step)
    batch.states.append(rows)
    return rows


def _points_of(parsed: ParsedMetrics) -> int:
    return sum(_count(m) for _, rm in parsed for sm in rm.scope_metrics for m in sm.metrics)


def _count(metric: Any) -> int:
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


def logs_batches(
    request: Any, limits: Limits, refused: Refusals, on_costly: OnCostly | None = None, gate: Weigh | None = None
) -> list[ResourceBatch]:
    """Check an ``ExportLogsServiceRequest`` (as the transports hand it on: ``otlp.raw.EncodedLogs``;
    bytes or a message alike): sample-table rows (``otlp.samples.decode_row``), streamed values
    (``per_rank_no_reduce``) and ordinary OTel log records (bodies and attributes cut to bounded
    sizes, ``otlp.logs.decode_record``); the records it held are ``refused.received``. Raises
    ``RefusedError`` before any record is checked, as ``metrics_batches`` does (``max_records``)."""
    with counted(refused, on_costly):
        decoded = logs_within(request, limits, refused, gate)
        parts = _parts(decoded.resource_logs, "scope_logs", "log_records", limits, refused)
    batches = []
    for rl, n, checked in parts:
        if isinstance(checked, str):
            refused.add(n, checked)
            continue
        batch = ResourceBatch(*checked)
        for record in (r for sl in rl.scope_logs for r in sl.log_records):
            a = attributes(record.attributes)
            if is_sample(a):
                row = decode_row(record, a, limits.max_attribute_chars)
                if isinstance(row, str):
                    _refuse(batch, refused, row)
                elif clean_text(row.table, limits.max_name_chars) is None:
                    _refuse(batch, refused, "sample row: bad table name")
                else:
                    batch.samples.append(row)
                continue
            if is_stream(a):
                decoded = decode_stream(a)
                if isinstance(decoded, str):
                    _refuse(batch, refused, decoded)
                elif clean_text(decoded[0], limits.max_name_chars) is None:
                    _refuse(batch, refused, "streamed value with a bad key")
                else:
                    batch.streams.append(decoded)
                continue
            when, severity, body, kept, step, trace_id = decode_record(record, a)
            if isinstance(step, str):
                _refuse(batch, refused, f"log record: {step}")
            elif not severity.isprintable():
                _refuse(batch, refused, "log record: severity text with control characters")
            else:
                batch.logs.append(LogRecord(when, severity, body, kept, step, trace_id))
        if batch.samples:  # merged like points: a client's retry is recognized, not merged twice
            batch.digest = hashlib.blake2b(rl.SerializeToString(), digest_size=16).digest()
        batches.append(batch)
    return batches


class SpanPart(NamedTuple):
    """One ResourceSpans of a traces request that holds spans, its Resource checked (``traces_parts``)."""

    experiment: str
    resource: dict[str, Any]
    scope_spans: Any
    n: int
    """Its spans."""


def traces_parts(
    request: Any, limits: Limits, refused: Refusals, on_costly: OnCostly | None = None, gate: Weigh | None = None
) -> list[SpanPart]:
    """The ResourceSpans of an ``ExportTraceServiceRequest`` (as the transports hand it on:
    ``otlp.raw.EncodedTraces``; bytes or a message alike) that hold spans, with their checked
    Resources (``check_resource``); the spans of those refused are counted in ``refused`` with the
    reason, and all it held are ``refused.received``. Raises ``RefusedError`` before any span is
    checked, as ``logs_batches`` does. Each span is checked where it is stored (``book.traces``)."""
    with counted(refused, on_costly):
        decoded = traces_within(request, limits, refused, gate)
        found = _parts(decoded.resource_spans, "scope_spans", "spans", limits, refused)
    parts = []
    for rs, n, checked in found:
        if isinstance(checked, str):
            refused.add(n, f"{n} spans: {checked}")
        else:
            parts.append(SpanPart(*checked, rs.scope_spans, n))
    return parts


def _parts(
    resources: Any, scopes: str, records: str, limits: Limits, refused: Refusals
) -> list[tuple[Any, int, tuple[str, dict[str, Any]] | str]]:
    """Each resource of a traces or logs request that holds records (its ``scopes``' ``records``),
    with their count and its checked Resource; the request refused whole (COSTLY) once they name more
    than ``max_experiments`` experiments, before any record is checked."""
    found = [(r, sum(len(getattr(scope, records)) for scope in getattr(r, scopes))) for r in resources]
    refused.received += sum(n for _, n in found)
    named: set[str] = set()
    parts = []
    for resource, n in found:
        if not n:
            continue
        checked = check_resource(resource.resource, limits)
        if not isinstance(checked, str):
            experiments_within(named, checked[0], limits, refused, lambda: refused.received)
        parts.append((resource, n, checked))
    return parts


def _refuse(batch: ResourceBatch, refused: Refusals, why: str) -> None:
    """One record of ``batch`` refused: answered in the request, counted for its experiment."""
    refused.add(1, why)
    batch.refused += 1


_PATH_OPTIONS = ("path", "logdir", "dir")
_FORMATTED_OPTIONS = ("path",)
"""The path options whose views fill in ``{experiment}``, ``{run}``, ...: the others are used as given."""
_PATH_FIELDS = frozenset({"experiment", "run", "process", "role", "replica", "rank", "pid"})
_PATH_SPEC = re.compile(r"(0?[0-9]?d)?")


def check_posted_views(backends: Mapping[str, Any]) -> str | None:
    """Why a client's posted view config is refused, or None. The sink's own ``--backends`` are
    the operator's; a posted one is a client's, so where it writes is held to the working
    directory: each path option (``path``, ``logdir``, ``dir``) is a relative path without
    ``..``, ``:`` or ``\\`` (a scheme in a page's link to it) whose only format fields are the
    plain names the views fill in, each a safe component (``paths.safe_component``) or an int,
    with no conversion and at most an int's
    width (``{experiment}``, ``{rank:03d}``): no attribute or index lookups, which
    ``str.format`` would run, and no fill or precision, which would make any text (``/``, ``..``).
    ``logdir`` and ``dir`` hold no format fields at all: their views do not fill them in. A config
    that passes is then rooted in its experiment's directory (``root_posted_views``)."""
    import string
    from pathlib import PurePath

    if len(backends) > 16:
        return "at most 16 views"
    for name, options in backends.items():
        for option in _PATH_OPTIONS:
            if option not in options:
                continue
            value = options[option]
            if not isinstance(value, str) or not value or len(value) > 1024 or "\0" in value:
                return f"view {str(name)[:64]!r}: {option} must be a non-empty string"
            where = PurePath(value)
            if where.is_absolute() or ".." in where.parts or value.startswith("~"):
                return f"view {str(name)[:64]!r}: {option} must be a relative path without '..' (it is the client's)"
            try:
                parsed = list(string.Formatter().parse(value))
            except ValueError as exc:
                return f"view {str(name)[:64]!r}: {option} is not a format string: {exc}"
            if any(":" in text or "\\" in text for text, _, _, _ in parsed):  # a scheme in a page's link
                return f"view {str(name)[:64]!r}: {option} must be a plain relative path (no ':' or '\\')"
            fields = [(f, spec, conv) for _, f, spec, conv in parsed if f is not None]
            if fields and option not in _FORMATTED_OPTIONS:  # it would be a literal ``{run}`` directory
                return f"view {str(name)[:64]!r}: {option} is a plain directory (its view names what is under it)"
            for field_name, spec, conversion in fields:
                if field_name not in _PATH_FIELDS or conversion is not None or not _PATH_SPEC.fullmatch(spec or ""):
                    shown = ", ".join("{" + f + "}" for f in sorted(_PATH_FIELDS))
                    return f"view {str(name)[:64]!r}: {option} may only use {shown} (and an int width: {{rank:03d}})"
    return None


POSTED_ROOT = "rankscope_logs"
"""Where a shared sink roots a posted view config's paths, one directory per experiment."""


def root_posted_views(experiment: str, backends: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A checked posted config (``check_posted_views``) with each path option under
    ``rankscope_logs/<experiment>/``: a client writes only in its own experiment's directory, never
    over the sink's files or another experiment's (``safe_component`` is one-to-one)."""
    root = f"{POSTED_ROOT}/{safe_component(experiment)}"
    rooted = {}
    for name, options in backends.items():
        rooted[name] = {k: _rooted(root, v) if k in _PATH_OPTIONS else v for k, v in options.items()}
    return rooted


def _rooted(root: str, path: str) -> str:
    """``path`` under ``root``; a path that already starts with ``rankscope_logs/`` (and
    ``{experiment}/``), as the views' defaults do, is not nested twice."""
    from pathlib import PurePosixPath

    parts = PurePosixPath(path).parts
    if parts[:1] == (POSTED_ROOT,):
        parts = parts[1:]
        if parts[:1] == ("{experiment}",):
            parts = parts[1:]
    return str(PurePosixPath(root, *parts))
