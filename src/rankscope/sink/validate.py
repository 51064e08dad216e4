"""The sink's edge: every received point is checked here, once, before anything trusts it.

A decoded OTLP request is client data. This module turns it into plain, checked Python
values (``ResourceBatch``: who sent it, its points, its flush markers) and a count of what
was refused and why. Nothing downstream (step alignment, reduction, views, the write-ahead
log) ever sees a protobuf or an unchecked value, so nothing downstream may raise on client
data.

What is checked, per point: the reduce attribute is a string naming a known reduce type;
the OTel point kind is the one that reduce type travels as (``rankscope.otlp.metrics``);
the state's fields exist and are in range (counts non-negative and bounded, an
ExponentialHistogram's scale in [6, 20], bucket offsets and widths bounded, bucket counts
adding up to no more than the point's count, a custom state's fields numeric and mergeable);
the step is a non-negative int64 (not a bool, not a string) within ``step_window`` steps
ahead of the experiment's frontier (checked later, in ``Experiment.apply``: the frontier is
the experiment's own); names and attributes have bounded sizes and no control characters.
A refused point is counted in OTLP ``partial_success`` with a message naming the first
offending key and why; the rest of the request is accepted.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import names as attr
from ..metrics.reduce import BUILTIN_REDUCES, DISTRIBUTION_SCALE, Reduce
from ..otlp.metrics import SUM_SQ

INT64_MAX = 2**63 - 1
MAX_SCALE = 20
"""OpenTelemetry's largest exponential-histogram scale."""


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
    max_buckets: int = 16_384
    """Buckets of one ExponentialHistogram side (scale 6 spans the finite doubles in ~131k)."""
    step_window: int = 1_000_000
    """How far ahead of an experiment's frontier a step may be."""


@dataclass(slots=True)
class Refusals:
    """What one request refused: a count and the first few reasons (for ``partial_success``)."""

    count: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        self.count += n
        if len(self.reasons) < 8:
            self.reasons.append(reason)

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True, slots=True)
class Point:
    """One key's state from one process, checked: ``Reduce.get(reduce)`` merges ``state``."""

    key: str
    reduce: str
    step: int | None
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Marker:
    """A flush marker: the process closed ``step`` (a controller also says how many it flushed)."""

    step: int
    expected: int
    driven: bool


@dataclass(slots=True)
class ResourceBatch:
    """What one ResourceMetrics (or ResourceLogs) of one process carries, checked."""

    experiment: str
    resource: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    goodbye: bool = False
    streams: list[tuple[str, float, int | None]] = field(default_factory=list)
    foreign: int = 0
    """Points without ``rankscope.reduce``: not rankscope's (counted in the status route)."""
    refused: int = 0
    """Points of this batch refused at the edge (the experiment's status counts them)."""
    digest: bytes = b""
    """Of the ResourceMetrics as received: a retried request is recognized and not merged twice."""


def any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def clean_text(text: str, limit: int) -> str | None:
    """``text`` if it is non-empty, at most ``limit`` characters and has no control or format
    characters (NUL, newlines, bidi overrides); else None."""
    if not text or len(text) > limit:
        return None
    if text.isprintable():
        return text
    return None if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in text) else text


def check_resource(raw: Any, limits: Limits) -> tuple[str, dict[str, Any]] | str:
    """(experiment id, resource attributes) of a Resource, or why it is refused."""
    if len(raw.attributes) > limits.max_resource_attributes:
        return f"resource has {len(raw.attributes)} attributes (limit {limits.max_resource_attributes})"
    resource = attributes(raw.attributes)
    for key, value in resource.items():
        if len(key) > limits.max_name_chars:
            return f"resource attribute name of {len(key)} characters (limit {limits.max_name_chars})"
        if isinstance(value, str) and len(value) > limits.max_attribute_chars:
            return f"resource attribute {key[:64]!r} of {len(value)} characters (limit {limits.max_attribute_chars})"
    experiment = resource.get(attr.EXPERIMENT_ID)
    if not isinstance(experiment, str) or not experiment:
        return f"resource without {attr.EXPERIMENT_ID}"
    for name in (attr.EXPERIMENT_ID, attr.ROLE, attr.REPLICA, attr.SERVICE_NAME, attr.SERVICE_INSTANCE_ID):
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
        return value.isdigit() and len(value) < 10
    return isinstance(value, int) and 0 <= value < 2**31


def check_step(value: Any) -> int | str | None:
    """A point's step: an int64 >= 0, None when absent, or why it is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{attr.STEP} must be an integer, got {type(value).__name__}"
    if not 0 <= value <= INT64_MAX:
        return f"{attr.STEP} {value} is negative"
    return value


def metrics_batches(request: Any, limits: Limits, refused: Refusals) -> list[ResourceBatch]:
    """Check an ``ExportMetricsServiceRequest``; the refused points are added to ``refused``."""
    batches: list[ResourceBatch] = []
    for rm in request.resource_metrics:
        metrics = [m for sm in rm.scope_metrics for m in sm.metrics]
        checked = check_resource(rm.resource, limits)
        if isinstance(checked, str):
            ours = sum(_count(m) for m in metrics if m.name.startswith("rankscope") or _has_reduce(m))
            refused.add(ours, checked)  # plain OTel data without an experiment is not ours to refuse
            continue
        batch = ResourceBatch(*checked, digest=hashlib.blake2b(rm.SerializeToString(), digest_size=16).digest())
        before = refused.count
        for metric in metrics:
            _metric(batch, metric, limits, refused)
        batch.refused = refused.count - before
        batches.append(batch)
    return batches


def _metric(batch: ResourceBatch, metric: Any, limits: Limits, refused: Refusals) -> None:
    name = metric.name
    kind = metric.WhichOneof("data")
    if kind is None:
        return
    points = getattr(metric, kind).data_points
    if name == attr.FLUSH_MARKER:
        for p in points:
            a = attributes(p.attributes)
            step = check_step(a.get(attr.STEP))
            expected = a.get(attr.EXPECTED_PROCESSES, 0)
            if not isinstance(step, int) or not _small_int(expected if expected is not None else 0):
                refused.add(1, f"{name}: bad flush marker ({step if isinstance(step, str) else 'no step'})")
                continue
            batch.markers.append(Marker(step, int(expected or 0), a.get(attr.DRIVEN) is True))
        return
    if name == attr.GOODBYE:
        batch.goodbye = True
        return
    if clean_text(name, limits.max_name_chars) is None:
        shown = f"{name[:40]!r}..."
        refused.add(
            len(points), f"{shown}: metric name of {len(name)} characters is empty, too long or has control characters"
        )
        return
    custom: dict[tuple[str, int | None, int], dict[str, Any]] = {}
    for p in points:
        a = attributes(p.attributes)
        reduce = a.get(attr.REDUCE)
        if reduce is None:
            batch.foreign += 1
            continue
        why = _point(batch, name, kind, p, a, reduce, limits, custom)
        if why is not None:
            refused.add(1, f"{name}: {why}")
    for (reduce, step, _), state in custom.items():
        why = _custom(reduce, state)
        if why is None:
            batch.points.append(Point(name, reduce, step, state))
        else:
            refused.add(1, f"{name}: {why}")


def _point(
    batch: ResourceBatch,
    name: str,
    kind: str,
    p: Any,
    a: Mapping[str, Any],
    reduce: Any,
    limits: Limits,
    custom: dict[tuple[str, int | None, int], dict[str, Any]],
) -> str | None:
    """Append the checked point to ``batch``, or return why it is refused."""
    if not isinstance(reduce, str):
        return f"{attr.REDUCE} must be a string, got {type(reduce).__name__}"
    reduce = reduce.lower()
    step = check_step(a.get(attr.STEP))
    if isinstance(step, str):
        return step
    if reduce not in BUILTIN_REDUCES:
        try:
            Reduce.get(reduce)
        except KeyError:
            return f"unknown reduce type {reduce[:64]!r}"
        field_name = a.get(attr.STATE_FIELD)
        if kind != "gauge" or not isinstance(field_name, str) or clean_text(field_name, 64) is None:
            return f"custom reduce {reduce!r} travels as Gauge points with a string {attr.STATE_FIELD}"
        custom.setdefault((reduce, step, p.time_unix_nano), {"reduction_type": reduce})[field_name] = _value(p)
        return None
    state: dict[str, Any] = {"reduction_type": reduce}
    if reduce in ("sum", "count"):
        if kind != "sum":
            return f"{reduce} travels as a Sum point, not {kind}"
        value = _value(p)
        if reduce == "count" and not (isinstance(value, int) and 0 <= value <= INT64_MAX):
            return "count must be a non-negative integer"
        state[reduce] = value
    elif reduce in ("max", "min", "last"):
        if kind != "gauge":
            return f"{reduce} travels as a Gauge point, not {kind}"
        if attr.STATE_FIELD in a:
            return f"{reduce} is built in: no {attr.STATE_FIELD} attribute"
        if reduce == "last":
            state.update(value=_value(p), time_unix_nano=p.time_unix_nano)
        else:
            state[reduce] = _value(p)
    elif reduce in ("mean", "std"):
        if kind != "histogram":
            return f"{reduce} travels as a Histogram point, not {kind}"
        state.update(sum=p.sum, count=p.count)
        if reduce == "std":
            sum_sq = a.get(SUM_SQ)
            if isinstance(sum_sq, bool) or not isinstance(sum_sq, (int, float)):
                return f"std needs a numeric {SUM_SQ} attribute"
            state["sum_sq"] = float(sum_sq)
    else:  # distribution
        if kind != "exponential_histogram":
            return f"distribution travels as an ExponentialHistogram point, not {kind}"
        why = _exponential(p, state, limits)
        if why is not None:
            return why
    batch.points.append(Point(name, reduce, step, state))
    return None


def _exponential(p: Any, state: dict[str, Any], limits: Limits) -> str | None:
    if not DISTRIBUTION_SCALE <= p.scale <= MAX_SCALE:
        return f"scale {p.scale} outside [{DISTRIBUTION_SCALE}, {MAX_SCALE}]"
    # Bucket i holds (2**(i / 2**scale), 2**((i + 1) / 2**scale)]: finite doubles need
    # -1075 * 2**scale <= i < 1024 * 2**scale, and the percentile math overflows beyond.
    low, high = -1075 * 2**p.scale, 1024 * 2**p.scale
    buckets = []
    for side in (p.positive, p.negative):
        counts = side.bucket_counts
        if len(counts) > limits.max_buckets:
            return f"{len(counts)} buckets (limit {limits.max_buckets})"
        if counts and not (low <= side.offset and side.offset + len(counts) <= high):
            return f"bucket offset {side.offset} out of range at scale {p.scale}"
        buckets.append({side.offset + i: n for i, n in enumerate(counts) if n})
    total = p.zero_count + sum(buckets[0].values()) + sum(buckets[1].values())
    if total > p.count:
        return f"buckets hold {total} values but count is {p.count}"
    state.update(
        scale=p.scale,
        count=p.count,
        sum=p.sum,
        min=p.min,
        max=p.max,
        zero_count=p.zero_count,
        positive=buckets[0],
        negative=buckets[1],
    )
    return None


def _custom(reduce: str, state: dict[str, Any]) -> str | None:
    """A custom state must merge on its own (the reducer is third-party code: try it once)."""
    try:
        value = Reduce.get(reduce).accumulator_class.get_reduced_value_from_states([state])
        if isinstance(value, dict):
            ok = all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in value.items())
        else:
            ok = isinstance(value, (int, float))
    except Exception as exc:
        return f"custom reduce {reduce!r} cannot merge this state ({type(exc).__name__})"
    return None if ok else f"custom reduce {reduce!r} gave a non-numeric value"


def _value(p: Any) -> float | int:
    return p.as_double if p.WhichOneof("value") == "as_double" else p.as_int


def _count(metric: Any) -> int:
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


def _has_reduce(metric: Any) -> bool:
    kind = metric.WhichOneof("data")
    return bool(kind) and any(kv.key == attr.REDUCE for p in getattr(metric, kind).data_points for kv in p.attributes)


def logs_batches(request: Any, limits: Limits, refused: Refusals) -> Iterator[ResourceBatch]:
    """Check an ``ExportLogsServiceRequest``: streamed values (``per_rank_no_reduce``) only.

    Ordinary log records (no ``rankscope.key``) are accepted and not viewed."""
    for rl in request.resource_logs:
        records = [r for sl in rl.scope_logs for r in sl.log_records]
        ours = [(r, a) for r in records if attr.STREAM_KEY in (a := attributes(r.attributes))]
        if not ours:
            continue
        checked = check_resource(rl.resource, limits)
        if isinstance(checked, str):
            refused.add(len(ours), checked)
            continue
        batch = ResourceBatch(*checked)
        for _, a in ours:
            key, value, step = a.get(attr.STREAM_KEY), a.get(attr.STREAM_VALUE), check_step(a.get(attr.STEP))
            if not isinstance(key, str) or clean_text(key, limits.max_name_chars) is None:
                refused.add(1, "streamed value with a bad key")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                refused.add(1, f"streamed {key[:64]!r} has no numeric {attr.STREAM_VALUE}")
            elif isinstance(step, str):
                refused.add(1, f"streamed {key[:64]!r}: {step}")
            else:
                batch.streams.append((key, float(value), step))
        yield batch
