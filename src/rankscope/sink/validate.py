"""The sink's edge: every received point is checked here, once, before anything trusts it.

A decoded OTLP request is client data. This module turns it into plain, checked Python
values (``ResourceBatch``: who sent it, its points, its flush markers) and a count of what
was refused and why. Nothing downstream (step alignment, reduction, views, the write-ahead
log) ever sees a protobuf or an unchecked value, so nothing downstream may raise on client
data.

Decoding is the codec's (``rankscope.otlp``: its decoders return a state or the reason a point
does not hold one, and never raise); the limits and the experiment's bookkeeping are the sink's.
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
from ..metrics.reduce import BUILTIN_REDUCES, Reduce
from ..otlp.common import attributes, decode_step
from ..otlp.logs import decode_stream, is_stream
from ..otlp.markers import Marker, decode_marker
from ..otlp.metrics import MAX_BUCKETS, check_custom_state, decode_custom_field, decode_state


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
    max_buckets: int = MAX_BUCKETS
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
            marker = decode_marker(attributes(p.attributes))
            if isinstance(marker, str):
                refused.add(1, f"{name}: {marker}")
            else:
                batch.markers.append(marker)
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
        why = check_custom_state(reduce, state)
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
    step = decode_step(a.get(attr.STEP))
    if isinstance(step, str):
        return step
    if reduce not in BUILTIN_REDUCES:
        try:
            Reduce.get(reduce)
        except KeyError:
            return f"unknown reduce type {reduce[:64]!r}"
        found = decode_custom_field(reduce, kind, p, a)
        if isinstance(found, str):
            return found
        custom.setdefault((reduce, step, p.time_unix_nano), {"reduction_type": reduce})[found[0]] = found[1]
        return None
    state = decode_state(reduce, kind, p, a, limits.max_buckets)
    if isinstance(state, str):
        return state
    batch.points.append(Point(name, reduce, step, state))
    return None


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
        ours = [(r, a) for r in records if is_stream(a := attributes(r.attributes))]
        if not ours:
            continue
        checked = check_resource(rl.resource, limits)
        if isinstance(checked, str):
            refused.add(len(ours), checked)
            continue
        batch = ResourceBatch(*checked)
        for _, a in ours:
            decoded = decode_stream(a)
            if isinstance(decoded, str):
                refused.add(1, decoded)
            elif clean_text(decoded[0], limits.max_name_chars) is None:
                refused.add(1, "streamed value with a bad key")
            else:
                batch.streams.append(decoded)
        yield batch
