"""The template encoders (``otlp.templates``) against the protobuf encoders they replace (``otlp.metrics.encode``,
``otlp.spans.encode_spans``).

Both run on the same steps; the template's bytes must parse to exactly the request the protobuf
objects make, metrics in the same order (a view lists a step's keys in the order they came), compared
canonically: parsed, then serialized deterministically, so NaN payloads and field order are compared
as bytes. No thread, no socket.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope

from rankscope.core import names as attr
from rankscope.metrics.reduce import MetricAccumulator, Reduce
from rankscope.otlp.common import encode_resource
from rankscope.otlp.markers import add_flush_marker, add_goodbye
from rankscope.otlp.metrics import PointAttributes, encode
from rankscope.otlp.spans import encode_spans
from rankscope.otlp.templates import MetricEncoder, SpanEncoder, varint
from rankscope.tracing.spans import SpanRecord

RESOURCE = encode_resource({"service.name": "trainer", attr.EXPERIMENT_ID: "exp", "rank": 3, "ratio": 0.5})
SCOPE = InstrumentationScope(name=attr.INSTRUMENTATION_SCOPE, version="1.2.3")
REDUCES = [Reduce.MEAN, Reduce.SUM, Reduce.COUNT, Reduce.MAX, Reduce.MIN, Reduce.LAST, Reduce.STD, Reduce.DISTRIBUTION]
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)


class Ema(MetricAccumulator):
    """A user's reduce state: goes through the protobuf encoder inside a templated request."""

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.value = 0.0

    def append(self, value: float) -> None:
        self.value = 0.5 * self.value + 0.5 * value

    def get_state(self) -> dict[str, object]:
        return {"reduction_type": "test_templates_ema", "value": self.value, "label": "not a number"}


EMA = Reduce.register("test_templates_ema", Ema)


Steps = list[tuple[int | None, int, int, dict[str, MetricAccumulator]]]
MARKERS = [(0, False), (4, True), (0, True), (3, False)]
"""(expected processes, driven) of a step's flush marker: the first is templated, the others protobuf."""


def _old(steps: Steps, goodbye: bool, marker: tuple[int, bool] = (4, True)) -> bytes:
    """What the export thread built before the templates: protobuf objects, key by key."""
    request = ExportMetricsServiceRequest()
    scope = request.resource_metrics.add(resource=RESOURCE).scope_metrics.add(scope=SCOPE)
    kvs = PointAttributes()
    for step, t0, t1, accs in steps:
        for key, acc in accs.items():
            metric = encode(key, acc, step, t0, t1, kvs)
            if metric is not None:
                scope.metrics.append(metric)
        if step is not None:
            add_flush_marker(scope, kvs.get("flush", step)[1:], len(accs), t0, t1, *marker)
    if goodbye:
        add_goodbye(scope)
    return bytes(request.SerializeToString())


def _new(steps: Steps, goodbye: bool, marker: tuple[int, bool] = (4, True)) -> bytes:
    encoder = MetricEncoder(RESOURCE, SCOPE)
    metrics: list[bytes] = []
    for step, t0, t1, accs in steps:
        metrics.extend(encoder.step(step, t0, t1, accs))
        if step is not None:
            metrics.append(encoder.marker(step, len(accs), t0, t1, *marker))
    if goodbye:
        metrics.append(encoder.goodbye())
    return encoder.request(metrics)


def _canonical(data: bytes, drop_goodbye_time: bool = True) -> bytes:
    request = ExportMetricsServiceRequest.FromString(data)
    if drop_goodbye_time:  # the goodbye is stamped with the clock when it is made
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == attr.GOODBYE:
                        m.sum.data_points[0].time_unix_nano = 0
    return bytes(request.SerializeToString(deterministic=True))


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[int | None, int, int, dict[str, MetricAccumulator]]]:
    keys = draw(
        st.lists(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_./-]{0,40}", fullmatch=True), min_size=1, max_size=12, unique=True)
    )
    reduces = {key: draw(st.sampled_from(REDUCES)) for key in keys}
    out = []
    t = draw(st.integers(min_value=0, max_value=2**62))
    for step in draw(st.lists(st.one_of(st.none(), st.integers(0, 2**62)), min_size=1, max_size=4)):
        accs: dict[str, MetricAccumulator] = {}
        for key in draw(st.lists(st.sampled_from(keys), unique=True)):
            reduce = reduces[key]
            acc = reduce.accumulator_class(reduce)
            for value in draw(st.lists(st.one_of(FLOATS, INT64), min_size=1, max_size=5)):
                if reduce is Reduce.DISTRIBUTION and not (isinstance(value, float) and math.isfinite(value)):
                    continue  # the distribution's own checks live in its tests
                acc.append(value)  # ints too: record_metric's fast path appends them as they come
            if reduce is Reduce.LAST and draw(st.booleans()):
                acc.time_unix_nano = 0  # type: ignore[attr-defined]  # no time of its own: the step's
            accs[key] = acc
        if draw(st.booleans()):
            accs["user/ema"] = ema = Ema(EMA)
            ema.append(draw(FLOATS))
        t1 = t + draw(st.integers(0, 10**12))
        out.append((step, t, t1, accs))
        t = t1
    return out


@settings(max_examples=300, deadline=None)
@given(steps(), st.booleans(), st.sampled_from(MARKERS))
def test_the_template_encoder_decodes_to_exactly_what_the_protobuf_encoder_makes(
    batches: Steps, goodbye: bool, marker: tuple[int, bool]
) -> None:
    assert _canonical(_new(batches, goodbye, marker)) == _canonical(_old(batches, goodbye, marker))


@st.composite
def repeated_steps(draw: st.DrawFn) -> Steps:
    """One step shape (the same keys, in order) over several steps, its numbers changing type: the
    packed path (a layout per shape, from its second step), and its fall back key by key."""
    keys = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_/]{0,20}", fullmatch=True), min_size=1, max_size=8, unique=True))
    reduces = {key: draw(st.sampled_from(REDUCES)) for key in keys}
    out = []
    t = draw(st.integers(min_value=0, max_value=2**62))
    for step in range(draw(st.integers(0, 300)), 0, -draw(st.integers(1, 150))):
        accs: dict[str, MetricAccumulator] = {}
        for key in keys:
            acc = reduces[key].accumulator_class(reduces[key])
            for value in draw(st.lists(st.one_of(FLOATS, INT64), min_size=1, max_size=3)):
                if reduces[key] is Reduce.DISTRIBUTION and not (isinstance(value, float) and math.isfinite(value)):
                    continue
                acc.append(value)
            accs[key] = acc
        out.append((step, t, t + 1, accs))
        t += 2
    return out


@settings(max_examples=200, deadline=None)
@given(repeated_steps())
def test_a_repeated_step_shape_packs_to_exactly_what_the_protobuf_encoder_makes(batches: Steps) -> None:
    assert _canonical(_new(batches, False)) == _canonical(_old(batches, False))


def test_templates_follow_the_step_attribute_across_its_varint_lengths() -> None:
    """A key's head is cached per length of the step attribute (steps 127, 128, 16384 change it)."""
    batches = []
    for step in (0, 127, 128, 16383, 16384, 2**35, None, 5):
        accs: dict[str, MetricAccumulator] = {}
        kinds = (("loss", Reduce.MEAN), ("grad/std", Reduce.STD), ("tokens", Reduce.SUM), ("lr", Reduce.LAST))
        for key, reduce in kinds:
            acc = accs[key] = reduce.accumulator_class(reduce)
            acc.append(1.5)
        batches.append((step, 10, 20, accs))
    for marker in MARKERS:
        assert _canonical(_new(batches, True, marker)) == _canonical(_old(batches, True, marker))


def test_a_reduce_type_of_the_users_on_a_built_in_state_keeps_its_own_name_on_the_wire() -> None:
    """``Reduce.register("tokens", SumAccumulator)``: not the template's ``sum``, the user's reduce type."""
    from rankscope.metrics.reduce import SumAccumulator

    tokens = Reduce.register("test_templates_tokens", SumAccumulator)
    acc = tokens.accumulator_class(tokens)
    acc.append(3.0)
    batches = [(5, 10, 20, {"tokens": acc})]
    assert _canonical(_new(batches, False)) == _canonical(_old(batches, False))
    (metric,) = [
        m
        for rm in ExportMetricsServiceRequest.FromString(_new(batches, False)).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "tokens"
    ]
    assert metric.WhichOneof("data") == "gauge"  # a custom state's numbers, named by its reduce type


def test_the_sdk_readers_request_joins_as_bytes() -> None:
    """Concatenated requests parse as one: the SDK reader's own instruments go first."""
    encoder = MetricEncoder(RESOURCE, SCOPE)
    sdk = ExportMetricsServiceRequest()
    sdk.resource_metrics.add().scope_metrics.add().metrics.add(name="sdk.counter")
    acc = Reduce.MAX.accumulator_class(Reduce.MAX)
    acc.append(7)
    joined = ExportMetricsServiceRequest.FromString(
        encoder.request(encoder.step(3, 1, 2, {"peak": acc}), bytes(sdk.SerializeToString()))
    )
    assert [[m.name for sm in rm.scope_metrics for m in sm.metrics] for rm in joined.resource_metrics] == [
        ["sdk.counter"],
        ["peak"],
    ]
    assert joined.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0].as_int == 7


def test_varint_matches_protobuf() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1):
        assert b"\x18" + varint(n) == AnyValue(int_value=n).SerializeToString()


# -- spans ---------------------------------------------------------------------------------

ATTRIBUTE_VALUES = st.one_of(
    st.text(max_size=20), INT64, FLOATS, st.booleans(), st.lists(st.integers(0, 9), max_size=3), st.none()
)


@st.composite
def span_records(draw: st.DrawFn) -> list[SpanRecord]:
    records = []
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, 2**63))
        record = SpanRecord(
            draw(st.text(max_size=30)),
            draw(st.integers(0, 2**128 - 1)),
            draw(st.integers(0, 2**64 - 1)),
            draw(st.one_of(st.just(0), st.integers(1, 2**64 - 1))),
            start,
            draw(st.integers(0, 2**63)),
            draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=12), ATTRIBUTE_VALUES, max_size=4))),
        )
        record.kind = draw(st.integers(0, 5))
        if draw(st.integers(0, 4)) == 0:
            record.fail(ValueError(draw(st.text(max_size=10))), start)
        if draw(st.integers(0, 4)) == 0:
            record.links = [(draw(st.integers(1, 2**128 - 1)), draw(st.integers(1, 2**64 - 1)))]
        records.append(record)
    return records


@settings(max_examples=300, deadline=None)
@given(span_records())
def test_the_span_template_encoder_decodes_to_exactly_what_the_protobuf_encoder_makes(
    records: list[SpanRecord],
) -> None:
    encoder = SpanEncoder(RESOURCE, SCOPE)
    first, again = encoder.request(records), encoder.request(records)  # the second from the caches
    expected = bytes(encode_spans(records, RESOURCE, SCOPE).SerializeToString(deterministic=True))
    for data in (first, again):
        assert ExportTraceServiceRequest.FromString(data).SerializeToString(deterministic=True) == expected


def test_a_cached_attribute_never_stands_for_an_equal_value_of_another_type() -> None:
    """True == 1 == 1.0 and -0.0 == 0.0 as dict keys: each is encoded as its own type."""
    encoder = SpanEncoder(RESOURCE, SCOPE)
    for value in (1, True, 1.0, 0.0, -0.0, 0, False):
        record = SpanRecord("s", 1, 2, 0, 3, 4, {"v": value})
        expected = bytes(encode_spans([record], RESOURCE, SCOPE).SerializeToString(deterministic=True))
        got = ExportTraceServiceRequest.FromString(encoder.request([record]))
        assert got.SerializeToString(deterministic=True) == expected, value
