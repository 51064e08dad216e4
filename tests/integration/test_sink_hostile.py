"""The sink as a hostile client sees it: a corpus of points that decode but lie, and a fuzzer.

Every case goes over real OTLP/HTTP (or gRPC) into a real sink on loopback. Meanwhile an
honest experiment whose step needs the grace timer (one of its two ranks never reports) must
still finalize on time, and the sink must stay healthy with no internal error (checked by the
``make_sink`` fixture at teardown)."""

from __future__ import annotations

import http.client
import math
import random
import time
from typing import Any

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value

PB = {"Content-Type": "application/x-protobuf"}


def request(points: list[pb.Metric], experiment: str = "hostile", **resource: Any) -> mpb.ExportMetricsServiceRequest:
    r = mpb.ExportMetricsServiceRequest()
    attrs = {attr.EXPERIMENT_ID: experiment, attr.SERVICE_INSTANCE_ID: "p1", **resource}
    rm = r.resource_metrics.add(resource=encode_resource(attrs))
    rm.scope_metrics.add().metrics.extend(points)
    return r


def gauge(name: str, value: float, reduce: Any = "max", step: Any = 0, **extra: Any) -> pb.Metric:
    m = pb.Metric(name=name)
    p = m.gauge.data_points.add(as_double=value)
    p.attributes.append(key_value(attr.REDUCE, reduce))
    if step is not None:
        p.attributes.append(key_value(attr.STEP, step))
    for k, v in extra.items():
        p.attributes.append(key_value(k, v))
    return m


def histogram(name: str, reduce: str = "mean", step: int = 0) -> pb.Metric:
    m = pb.Metric(name=name)
    p = m.histogram.data_points.add(count=2, sum=3.0, bucket_counts=[2])
    p.attributes.extend([key_value(attr.REDUCE, reduce), key_value(attr.STEP, step)])
    return m


def exponential(name: str, scale: int = 6, offset: int = 0, step: int = 0) -> pb.Metric:
    m = pb.Metric(name=name)
    p = m.exponential_histogram.data_points.add(count=2, sum=3.0, scale=scale, min=1.0, max=2.0)
    p.positive.offset = offset
    p.positive.bucket_counts.extend([1, 1])
    p.attributes.extend([key_value(attr.REDUCE, "distribution"), key_value(attr.STEP, step)])
    return m


class Http:
    """One keep-alive OTLP/HTTP connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def close(self) -> None:
        self.conn.close()

    def post(self, body: bytes, headers: dict[str, str] = PB) -> tuple[int, bytes]:
        self.conn.request("POST", "/v1/metrics", body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return response.status, data

    def export(self, r: mpb.ExportMetricsServiceRequest) -> tuple[int, int, str]:
        """(HTTP status, rejected points, message)."""
        status, data = self.post(r.SerializeToString())
        if status != 200:
            return status, -1, Status.FromString(data).message
        answer = mpb.ExportMetricsServiceResponse.FromString(data)
        return status, answer.partial_success.rejected_data_points, answer.partial_success.error_message


def steady_experiment(conn: Http, step: int) -> None:
    """Rank 0 of 2 reports step ``step``; rank 1 never does, so the step waits for the grace timer."""
    r = request([gauge("loss", 1.0, "max", step)], "steady", **{attr.RANK: "0", attr.WORLD_SIZE: "2"})
    marker = pb.Metric(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, step)])
    r.resource_metrics[0].scope_metrics[0].metrics.append(marker)
    assert conn.export(r)[:2] == (200, 0)


CORPUS: list[tuple[str, list[pb.Metric], int, str]] = [
    ("max on a Histogram", [histogram("h", "max")], 1, "travels as a Gauge"),
    ("ExponentialHistogram at scale 0", [exponential("e", scale=0)], 1, "scale 0"),
    ("ExponentialHistogram offset 2e9", [exponential("e", offset=2_000_000_000)], 1, "offset"),
    ("ExponentialHistogram below the smallest double", [exponential("e", offset=-1074 * 64 - 2)], 1, "offset"),
    ("200 attributes on one point", [gauge("many", 1.0, **{f"a{i}": i for i in range(200)})], 1, "point attributes"),
    ("mean as a Gauge with a state field", [gauge("m", 1.0, "mean", **{attr.STATE_FIELD: "count"})], 1, "Histogram"),
    ("negative step", [gauge("s", 1.0, step=-5)], 1, "negative"),
    ("string step", [gauge("s", 1.0, step="abc")], 1, "integer"),
    ("float step", [gauge("s", 1.0, step=3.7)], 1, "integer"),
    ("bool step", [gauge("s", 1.0, step=True)], 1, "integer"),
    ("step far ahead of the frontier", [gauge("s", 1.0, step=10**18)], 1, "ahead"),
    ("unknown reduce on a Gauge", [gauge("u", 1.0, "median")], 1, "unknown reduce"),
    ("non-string reduce", [gauge("u", 1.0, reduce=7)], 1, "must be a string"),
    ("1 MB metric name", [gauge("n" * 1_000_000, 1.0)], 1, "metric name"),
    ("std without sum of squares", [histogram("sd", "std")], 1, "sum_sq"),
    ("count as a Gauge", [gauge("c", 1.0, "count")], 1, "Sum"),
    ("merged max with a negative holder", [gauge("x", 1.0, "max", **{attr.EXTREME_RANK: -1})], 1, "extreme.rank"),
    ("merged max with a string holder", [gauge("x", 1.0, "max", **{attr.EXTREME_RANK: "3"})], 1, "extreme.rank"),
    (
        "merged min with a terminal-escape label",
        [gauge("x", 1.0, "min", **{attr.EXTREME_RANK: 1, attr.EXTREME_LABEL: "\x1b[2J"})],
        1,
        "extreme.label",
    ),
    ("good points beside bad ones", [gauge("ok", 1.0), gauge("bad", 1.0, step=-1), histogram("ok2")], 1, "negative"),
]


def test_corpus_of_lying_points_is_refused_and_counted(make_sink) -> None:
    sink = make_sink(grace=1.0, max_body_bytes=4 * 1024 * 1024)
    conn = Http(sink.http_port)
    assert conn.export(request([gauge("frontier", 1.0, step=5)]))[:2] == (200, 0)  # the experiment's frontier
    steady_experiment(conn, 0)
    started = time.monotonic()
    for name, points, rejected, why in CORPUS:
        status, count, message = conn.export(request(points))
        assert (status, count) == (200, rejected), name
        assert why in message, (name, message)
        named = message.split(":", 1)[0]  # the first offending key, shortened if it is long
        assert any(p.name == named or repr(p.name[:40]) + "..." == named for p in points), (name, message)

    r = request([gauge("big", 1.0)], **{"huge": "x" * 1_000_000})
    assert conn.export(r)[:2] == (200, 1)  # a 1 MB resource attribute refuses the resource's points
    status, _, message = conn.export(request([gauge("x", 1.0)], experiment="\0bad"))
    assert status == 200 and "control characters" in message

    status, body = conn.post(b"\0" * (5 * 1024 * 1024))  # oversized: answered 413, not a closed socket
    assert status == 413 and "exceeds" in Status.FromString(body).message
    conn.close()
    with grpc.insecure_channel(sink.endpoint) as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
        with pytest.raises(grpc.RpcError) as e:
            call(b"\x0a\xff\xff\xff\xff", timeout=10)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        answer = mgrpc.MetricsServiceStub(channel).Export(request([gauge("u", 1.0, "median")]), timeout=10)
        assert answer.partial_success.rejected_data_points == 1

    # The honest experiment's step 0 waited for its grace timer and was finalized on time.
    deadline = started + 1.0 + 5.0
    while time.monotonic() < deadline and sink.status("steady")["last_finalized_step"] < 0:
        time.sleep(0.05)
    assert sink.status("steady")["last_finalized_step"] == 0
    assert sink.status("hostile")["refused_points"] >= len(CORPUS)
    assert sink.health() == (True, [])


def _mutations(rng: random.Random) -> bytes:
    """A valid request, then one random lie: a field, an attribute, a kind, or raw bytes."""
    step = rng.choice([0, 1, 2, rng.randrange(-3, 10**6), 2**63 - 1, None])
    name = rng.choice(["loss", "a/b", "", "x" * rng.randrange(200, 300), "\u202e", "n\0"])
    reduce = rng.choice(["mean", "sum", "max", "min", "std", "count", "last", "distribution", "nope", 3, True, 1.5])
    kind = rng.randrange(5)
    m = pb.Metric(name=name)
    if kind == 0:
        p: Any = m.gauge.data_points.add(as_double=rng.choice([1.0, float("nan"), float("inf"), -0.0]))
    elif kind == 1:
        p = m.sum.data_points.add(as_int=rng.choice([0, 1, -1, 2**63 - 1]))
    elif kind == 2:
        p = m.histogram.data_points.add(count=rng.randrange(0, 5), sum=rng.random())
    elif kind == 3:
        p = m.exponential_histogram.data_points.add(
            count=rng.randrange(0, 5), scale=rng.randrange(-10, 30), zero_count=rng.randrange(0, 3)
        )
        p.positive.offset = rng.choice([0, -1, 2**31 - 1, -(2**31), rng.randrange(-70000, 70000)])
        p.positive.bucket_counts.extend(rng.randrange(0, 3) for _ in range(rng.randrange(0, 5)))
    else:
        p = m.summary.data_points.add(count=1, sum=1.0)
    p.attributes.append(key_value(attr.REDUCE, reduce))
    if step is not None:
        p.attributes.append(key_value(attr.STEP, step))
    for _ in range(rng.randrange(0, 3)):
        key = rng.choice([attr.STATE_FIELD, "rankscope.sum_sq", attr.STEP, "x"])
        p.attributes.append(key_value(key, rng.choice(["count", "sum", 1, 2.5, True, "x" * 10])))
    resource = {rng.choice([attr.RANK, attr.WORLD_SIZE, attr.ROLE, attr.REPLICA, "k"]): rng.choice(["1", -1, "a", 2])}
    r = request([m], experiment=rng.choice(["fuzz", "fuzz2", "../f", "f" * 300]), **resource)
    if rng.random() < 0.1:
        marker = pb.Metric(name=attr.FLUSH_MARKER)
        marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, step if step is not None else 0)])
        r.resource_metrics[0].scope_metrics[0].metrics.append(marker)
    body = bytearray(r.SerializeToString())
    if rng.random() < 0.3 and body:  # raw corruption: decodes to something else, or not at all
        for _ in range(rng.randrange(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    return bytes(body)


def test_fuzzed_requests_get_otlp_answers_and_nobody_else_notices(make_sink) -> None:
    sink = make_sink(grace=1.0)
    conn, steady = Http(sink.http_port), Http(sink.http_port)
    rng = random.Random(12)
    statuses: dict[int, int] = {}
    step = 0
    steady_experiment(steady, step)
    last_steady = time.monotonic()
    for _ in range(10_000):
        status, data = conn.post(_mutations(rng))
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            mpb.ExportMetricsServiceResponse.FromString(data)  # a valid OTLP answer
        else:
            assert status == 400, status
            assert Status.FromString(data).message
        if time.monotonic() - last_steady > 0.5:  # the honest experiment goes on meanwhile
            step += 1
            steady_experiment(steady, step)
            last_steady = time.monotonic()
    conn.close()
    assert statuses.get(200, 0) > 5000 and statuses.get(400, 0) > 100, statuses
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sink.status("steady")["last_finalized_step"] < step:
        time.sleep(0.05)
    steady.close()
    assert sink.status("steady")["last_finalized_step"] == step  # every step finalized, by its grace timer
    assert sink.health() == (True, [])


def test_undecodable_point_attributes_are_refused_per_point(make_sink) -> None:
    """The sink parses point attributes as raw bytes (``otlp.raw``) and decodes them itself: a
    KeyValue that is not one (bad UTF-8, truncated, nested past protobuf's recursion limit) is a
    refused point with a reason, and the request's other points are taken."""
    from google.protobuf.internal.encoder import _VarintBytes

    from rankscope.otlp.raw import RawExportMetricsServiceRequest

    def field(number: int, payload: bytes) -> bytes:  # a length-delimited protobuf field
        return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload

    deep = field(1, b"k")  # KeyValue{key: "k"}
    for _ in range(150):  # KeyValue{value: AnyValue{kvlist_value: {values: [...]}}}, past upb's depth limit
        deep = field(1, b"k") + field(2, field(6, field(1, deep)))
    bad_attributes = [
        b"\x0a\x02\xff\xfe",  # key: invalid UTF-8
        b"\x0a\x10rankscope",  # key: truncated
        deep,
    ]
    sink = make_sink()
    conn = Http(sink.http_port)
    for bad in bad_attributes:
        good_and_bad = request([gauge("ok", 1.0), gauge("bad", 2.0)]).SerializeToString()
        r = RawExportMetricsServiceRequest.FromString(good_and_bad)
        r.resource_metrics[0].scope_metrics[0].metrics[1].gauge.data_points[0].attributes.append(bad)
        status, data = conn.post(r.SerializeToString())
        assert status == 200, data
        answer = mpb.ExportMetricsServiceResponse.FromString(data).partial_success
        assert answer.rejected_data_points == 1 and "bad: undecodable point attribute" in answer.error_message
    conn.close()
    assert sink.status("hostile")["points"] == len(bad_attributes)  # every "ok" point was taken


def _plain(kind: str, **fields: Any) -> pb.Metric:
    """A plain OTel point (no ``rankscope.reduce``) at step 0."""
    m = pb.Metric(name=f"plain_{kind}")
    data = getattr(m, kind)
    if kind != "gauge":
        data.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
    if kind == "sum":
        data.is_monotonic = True
    p = data.data_points.add(**{k: v for k, v in fields.items() if k not in ("offset", "counts")})
    if "counts" in fields:
        p.positive.offset = fields["offset"]
        p.positive.bucket_counts.extend(fields["counts"])
    p.attributes.append(key_value(attr.STEP, 0))
    return m


PLAIN_TAKEN: list[tuple[str, pb.Metric]] = [
    ("the top bucket at the coarsest scale", _plain("exponential_histogram", scale=-10, count=1, offset=0, counts=[1])),
    (
        "the lowest bucket at scale 20",
        _plain("exponential_histogram", scale=20, count=1, offset=-1074 * 2**20 - 1, counts=[1]),
    ),
    (
        "a histogram whose min is over its max",
        _plain("histogram", count=3, sum=1.0, bucket_counts=[3], min=5.0, max=1.0),
    ),
    (
        "a histogram of infinities",
        _plain("histogram", count=1, sum=math.inf, explicit_bounds=[1.0], bucket_counts=[0, 1], max=math.inf),
    ),
    ("a NaN gauge", _plain("gauge", as_double=math.nan)),
    ("a NaN cumulative counter", _plain("sum", as_double=math.nan)),
]
PLAIN_REFUSED: list[tuple[str, pb.Metric, str]] = [
    ("scale 21", _plain("exponential_histogram", scale=21, count=1, offset=0, counts=[1]), "scale 21"),
    ("a bucket past the doubles", _plain("exponential_histogram", scale=-10, count=1, offset=1, counts=[1]), "offset"),
    (
        "counts that do not fit the bounds",
        _plain("histogram", count=2, explicit_bounds=[1.0], bucket_counts=[2]),
        "bucket counts",
    ),
    ("a NaN bound", _plain("histogram", count=1, explicit_bounds=[math.nan], bucket_counts=[1, 0]), "finite"),
    (
        "more in buckets than counted",
        _plain("histogram", count=1, explicit_bounds=[1.0], bucket_counts=[1, 1]),
        "count is 1",
    ),
]


def test_plain_otel_points_at_the_edges_of_the_rules_are_taken_or_refused_never_raising(make_sink) -> None:
    """Points that hold a mergeable state, however odd, are taken and the step finalizes with no
    internal error (the fixture checks); the rest are refused with the reason."""
    sink = make_sink(grace=0.5)
    conn = Http(sink.http_port)
    for name, metric in PLAIN_TAKEN:
        assert conn.export(request([metric], "odd"))[:2] == (200, 0), name
    for name, metric, why in PLAIN_REFUSED:
        status, count, message = conn.export(request([metric], "odd"))
        assert (status, count) == (200, 1) and why in message, (name, message)
    conn.close()
    sink.finalize("odd")
    assert sink.wait_written("odd")
    status = sink.status("odd")
    assert status["last_finalized_step"] == 0 and status["internal_errors"] == 0
    assert status["refused_points"] == len(PLAIN_REFUSED)
