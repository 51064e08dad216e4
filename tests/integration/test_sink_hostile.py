"""The sink as a hostile client sees it: a corpus of points that decode but lie, and a fuzzer.

Every case goes over real OTLP/HTTP (or gRPC) into a real sink on loopback. Meanwhile an
honest experiment whose step needs the grace timer (one of its two ranks never reports) must
still finalize on time, and the sink must stay healthy with no internal error (checked by the
``make_sink`` fixture at teardown)."""

from __future__ import annotations

import http.client
import logging
import math
import random
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.sink import BookConfig, Transport
from rankscope.sink.testing import RunLimits

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
    """One keep-alive OTLP/HTTP connection, closed at the test's end by ``close_connections``."""

    opened: ClassVar[list[Http]] = []

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        Http.opened.append(self)

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


@pytest.fixture(autouse=True)
def close_connections() -> Iterator[None]:
    """A failed assertion skips the test's own ``close``: its socket was then collected in a later
    test, which failed on the unclosed-socket warning (imported by the modules that use ``Http``)."""
    yield
    while Http.opened:
        Http.opened.pop().close()


def steady_experiment(conn: Http, step: int) -> None:
    """Rank 0 of 2 reports step ``step``; rank 1 never does, so the step waits for the grace timer."""
    r = request([gauge("loss", 1.0, "max", step)], "steady", **{attr.RANK: "0", attr.WORLD_SIZE: "2"})
    marker = pb.Metric(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, step)])
    r.resource_metrics[0].scope_metrics[0].metrics.append(marker)
    assert conn.export(r)[:2] == (200, 0)


def finalized(sink: Any, experiment: str, step: int, deadline: float) -> int:
    """The experiment's last finalized step once it reaches ``step`` or ``deadline`` (monotonic) passes."""
    while time.monotonic() < deadline and sink.status(experiment)["last_finalized_step"] < step:
        time.sleep(0.05)
    return int(sink.status(experiment)["last_finalized_step"])


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
    sink = make_sink(transport=Transport(max_body_bytes=4 * 1024 * 1024), book=BookConfig(grace=1.0))
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
    sink = make_sink(book=BookConfig(grace=1.0))
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
    sink = make_sink(book=BookConfig(grace=0.5))
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


# -- found by a hostile read of the edge (2026-11-26) ---------------------------------------------


def test_a_made_up_world_size_costs_the_other_experiments_nothing(make_sink) -> None:
    """Processes declaring 10 million ranks each once made the roster list every empty rank slot
    on the finalizer every experiment shares (13.6 s and 2.6 GB for one). A run's groups now
    declare at most ``max_rank_slots`` slots in all; a rank in non-ASCII digits is refused (it would
    parse as nothing), and so is a padded Resource (kept per process, logged with every step)."""
    sink = make_sink(book=BookConfig(grace=1.0))
    conn = Http(sink.http_port)
    steady_experiment(conn, 0)
    for replica in range(3):
        resource = {attr.WORLD_SIZE: "10000000", attr.RANK: "0", attr.REPLICA: str(replica)}
        r = request([gauge("loss", 1.0)], "big", **{**resource, attr.SERVICE_INSTANCE_ID: f"p{replica}"})
        marker = r.resource_metrics[0].scope_metrics[0].metrics.add(name=attr.FLUSH_MARKER)
        marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, 0)])
        assert conn.export(r)[:2] == (200, 0)  # taken: a job bigger than the sink's limit keeps what fits
    for resource, why in (
        ({attr.RANK: "\u00b2"}, "must be a non-negative integer"),  # '²'.isdigit(), but not int()
        ({f"pad{i}": "x" * 4000 for i in range(5)}, "bytes (limit 16384)"),
    ):
        status, rejected, message = conn.export(request([gauge("loss", 1.0)], "padded", **resource))
        assert (status, rejected) == (200, 1) and why in message, (resource, message)
    conn.close()
    deadline = time.monotonic() + 6
    assert finalized(sink, "steady", 0, deadline) == 0
    assert finalized(sink, "big", 0, deadline) == 0  # its empty slots named, and given up on


def test_a_repeated_point_attribute_is_refused_and_leaves_honest_points_alone(make_sink) -> None:
    """OTel attribute keys are unique. A point that repeats ``rankscope.sum_sq`` was once cached as
    the shape of its first three attributes, so an honest std point of another experiment with
    that same first value was then refused."""
    sink = make_sink()
    conn = Http(sink.http_port)

    def std(*sum_sq: float) -> pb.Metric:
        m = histogram("sd", "std", step=0)
        m.histogram.data_points[0].attributes.extend(key_value("rankscope.sum_sq", v) for v in sum_sq)
        return m

    status, rejected, message = conn.export(request([std(5.0, 6.0)], "attacker"))
    assert (status, rejected) == (200, 1) and "'rankscope.sum_sq' appears twice" in message, message
    assert conn.export(request([std(5.0)], "honest"))[:2] == (200, 0)
    conn.close()


def test_a_gzip_body_of_several_members_is_read_whole(make_sink) -> None:
    """RFC 1952 lets a gzip body hold several members: each is inflated (two requests' bytes
    concatenated are one protobuf request holding both); bytes after the last are refused, not
    ignored with a 200."""
    import gzip

    sink = make_sink()
    conn = Http(sink.http_port)
    first = request([gauge("loss", 1.0)], "member-a").SerializeToString()
    second = request([gauge("loss", 2.0)], "member-b").SerializeToString()
    headers = {**PB, "Content-Encoding": "gzip"}
    status, data = conn.post(gzip.compress(first) + gzip.compress(second), headers)
    assert status == 200 and mpb.ExportMetricsServiceResponse.FromString(data).partial_success.rejected_data_points == 0
    assert sink.status("member-a")["points"] == 1 and sink.status("member-b")["points"] == 1
    status, data = conn.post(gzip.compress(first) + b"trailing junk", headers)
    assert status == 400 and "corrupt gzip body" in Status.FromString(data).message
    status, data = conn.post(gzip.compress(b"") * 65, headers)
    assert status == 400 and "more than 64 members" in Status.FromString(data).message
    conn.close()


def test_a_span_query_naming_millions_of_ranks_is_refused_at_once(make_sink) -> None:
    """``ranks=0-60000000`` once built a set of 60 million ints on the event loop that answers
    everyone (5 s, gigabytes): now it is a 400 before the experiment is even looked up."""
    import urllib.error
    import urllib.request

    sink = make_sink()
    base = f"http://127.0.0.1:{sink.http_port}/rankscope/v1/spans?experiment=x&ranks="
    for ranks in ("0-60000000", "0-65535,70000", "5-2147483647"):
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + ranks, timeout=10)
        with e.value:
            assert e.value.code == 400 and "more than 65536 ranks" in e.value.read().decode()
        assert time.monotonic() - started < 2.0, ranks
    with pytest.raises(urllib.error.HTTPError) as e:  # within the cap: parsed, then the experiment is unknown
        urllib.request.urlopen(base + "0-65535", timeout=10)
    with e.value:
        assert e.value.code == 404


def test_parse_ranks_bounds_what_a_list_may_name() -> None:
    from rankscope.sink.testing import MAX_QUERY_RANKS, parse_ranks

    assert parse_ranks("0,2,4-7") == {0, 2, 4, 5, 6, 7} and parse_ranks("") is None
    assert len(parse_ranks(f"0-{MAX_QUERY_RANKS - 1}") or ()) == MAX_QUERY_RANKS
    for text in (f"0-{MAX_QUERY_RANKS}", ",".join(str(i) for i in range(MAX_QUERY_RANKS + 1)), "1," * 10**6, "-5", "a"):
        with pytest.raises(ValueError):
            parse_ranks(text)


def test_a_trickled_body_is_answered_408_and_frees_its_connection(make_sink) -> None:
    """A body sent a byte at a time held its connection (and a buffer) for as long as the client
    liked; at ``max_connections`` of them nobody else could connect."""
    import socket

    sink = make_sink(transport=Transport(body_timeout=1.0, max_connections=4))
    slow = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", sink.http_port), timeout=10)
        s.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n")
        s.sendall(b"Content-Length: 100\r\n\r\n\x0a")
        slow.append(s)
    started = time.monotonic()
    for s in slow:
        answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert b"not received within 1 s" in answer
    assert time.monotonic() - started < 5.0
    for s in slow:
        assert s.recv(4096) == b""  # and closed by the sink
        s.close()
    conn = Http(sink.http_port)  # the connections are free again
    assert conn.export(request([gauge("loss", 1.0)], "after"))[:2] == (200, 0)
    conn.close()


def test_a_posted_view_path_is_rooted_in_its_experiments_directory(make_sink, tmp_path, monkeypatch) -> None:
    """A shared sink's posted paths are relative; they were relative to the sink's working
    directory, so a client could name the sink's own files (or another experiment's). Now they
    are under ``rankscope_logs/<experiment>/``."""
    from rankscope.export.senders import post_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "settings.cfg").write_text("the operator's\n")
    sink = make_sink(book=BookConfig(grace=0.5))
    config = {"jsonl": {"logging_mode": "global_reduce", "path": "settings.cfg"}}
    assert post_config(f"http://127.0.0.1:{sink.http_port}", "attacker", config) == "ok"
    defaults = {"jsonl": {"logging_mode": "global_reduce", "path": "rankscope_logs/{experiment}/{process}.jsonl"}}
    assert post_config(f"http://127.0.0.1:{sink.http_port}", "spelled", defaults) == "ok"
    posted = sink.views.posted_backends
    assert posted["spelled"]["jsonl"]["path"] == "rankscope_logs/spelled/{process}.jsonl"  # not nested
    conn = Http(sink.http_port)
    r = request([gauge("loss", 1.0)], "attacker", **{attr.RANK: "0", attr.WORLD_SIZE: "1"})
    marker = r.resource_metrics[0].scope_metrics[0].metrics.add(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, 0)])
    assert conn.export(r)[:2] == (200, 0)
    conn.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sink.status("attacker")["last_finalized_step"] < 0:
        time.sleep(0.05)
    sink.stop()
    assert (tmp_path / "settings.cfg").read_text() == "the operator's\n"
    written = (tmp_path / "rankscope_logs" / "attacker" / "settings.cfg").read_text()
    assert '"loss"' in written


def test_a_run_whose_log_cannot_be_opened_is_refused_with_a_reason(make_sink, tmp_path) -> None:
    """An experiment named like the state directory's lock file once raised out of the ingest
    path (a bare 500, counted nowhere); a run whose log directory cannot be made (here a file
    is in its way, as a full or read-only disk would refuse it) is now a refused request."""
    state = tmp_path / "state"
    sink = make_sink(state_dir=state)
    (state / "blocked").write_text("not a directory\n")
    conn = Http(sink.http_port)
    assert conn.export(request([gauge("loss", 1.0)], "lock"))[:2] == (200, 0)
    status, rejected, message = conn.export(request([gauge("loss", 1.0)], "blocked"))
    assert (status, rejected) == (200, 1) and "cannot open this run's write-ahead log" in message
    assert conn.export(request([gauge("loss", 2.0)], "lock"))[:2] == (200, 0)
    conn.close()
    assert sink.health() == (True, [])


def test_a_request_spreading_points_over_many_steps_opens_at_most_max_open_steps(make_sink) -> None:
    """Each open step waits for its processes, and finalizing once went over every open step for
    each one closed: 100k steps in one request held the finalizer every experiment shares for a
    minute. A run now opens at most ``max_open_steps`` steps; the rest is refused and counted."""
    from rankscope.sink.testing import ExperimentLimits

    # The grace is a bound, not a pace: on a slow box a 1 s grace finalized steps 0-99 between the
    # two requests, and step 100 opened in the room they left.
    sink = make_sink(book=BookConfig(grace=4.0, limits=ExperimentLimits(max_open_steps=100)))
    conn = Http(sink.http_port)
    steady_experiment(conn, 0)
    spread = request([gauge("loss", 1.0, step=s) for s in range(150)], "spread", **{attr.WORLD_SIZE: "2"})
    status, rejected, message = conn.export(spread)
    assert (status, rejected) == (200, 50) and "step 100 would open more than 100 steps (limit)" in message
    again = request([gauge("acc", 1.0, step=s) for s in (5, 99, 100)], "spread", **{attr.WORLD_SIZE: "2"})
    assert conn.export(again)[:2] == (200, 1)  # open steps take more points; a new one does not open
    assert sink.status("spread")["refused_points"] == 51
    deadline = time.monotonic() + 20
    assert finalized(sink, "steady", 0, deadline) == 0
    assert finalized(sink, "spread", 99, deadline) == 99  # by the grace timer: rank 1 never came
    assert conn.export(request([gauge("loss", 1.0, step=150)], "spread"))[:2] == (200, 0)  # room again
    conn.close()


def test_spans_are_bounded_and_cleaned_at_the_edge(make_sink) -> None:
    """Spans once went from the wire into the trace store as sent: 25 MB names, escape sequences,
    any number of attributes. Now a span with malformed ids is refused and counted; what a span
    says is cut and cleaned, not refused (a failing span's long error message, a plain OTel
    client's long SQL name are worth keeping), and what is left out is counted."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
    from opentelemetry.proto.trace.v1 import trace_pb2

    sink = make_sink()
    r = tpb.ExportTraceServiceRequest()
    attrs = {attr.EXPERIMENT_ID: "spans", attr.SERVICE_INSTANCE_ID: "p1", attr.RANK: "0"}
    spans = r.resource_spans.add(resource=encode_resource(attrs)).scope_spans.add().spans

    def span(name: str, **kw: Any) -> trace_pb2.Span:
        s = spans.add(name=name, trace_id=b"\x01" * 16, span_id=random.randbytes(8), **kw)
        s.start_time_unix_nano, s.end_time_unix_nano = 1_000, 2_000
        s.attributes.append(key_value(attr.STEP, 0))
        return s

    span("train/forward")
    span("n" * 1_000_000)
    span("\x1b[2Jclear")
    span("wide").attributes.extend(key_value(f"a{i}", i) for i in range(200))
    span("heavy").attributes.append(key_value("blob", "x" * 100_000))
    span("failed", status=trace_pb2.Status(code=2, message="m" * 100_000))
    span("bad parent", parent_span_id=b"\x01" * 3)
    span("far ahead").attributes[0].value.int_value = 10**18  # every real step would be too old to keep
    conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=10)
    conn.request("POST", "/v1/traces", body=r.SerializeToString(), headers=PB)
    response = conn.getresponse()
    answer = tpb.ExportTraceServiceResponse.FromString(response.read())
    conn.close()
    assert response.status == 200 and answer.partial_success.rejected_spans == 2
    assert "malformed trace, span or parent span id" in answer.partial_success.error_message
    assert "more than the step window ahead" in answer.partial_success.error_message
    stored = {s.name: s for s in sink.spans("spans")}
    assert set(stored) == {"train/forward", "n" * 254 + "\u2026", "\ufffd[2Jclear", "wide", "heavy", "failed"}
    assert len(stored["wide"].attributes) == 127 and stored["wide"].step == 0  # 128 with the step
    assert stored["heavy"].attributes["blob"] == "x" * 4095 + "\u2026"
    assert stored["failed"].error == "m" * 4095 + "\u2026"
    status = sink.status("spans")
    assert (status["spans_refused"], status["span_attributes_left_out"]) == (2, 73)
    assert sink.health() == (True, [])


def test_one_client_cannot_fill_the_sinks_runs_or_configs(make_sink) -> None:
    """Run ids are the client's to choose: one experiment inventing them once filled every run
    the sink holds, and configs posted for experiments never seen again filled the config table
    for the sink's lifetime."""
    from rankscope.export.senders import post_config

    sink = make_sink(runs=RunLimits(per_experiment=3, max_open=5, per_client=5))
    conn = Http(sink.http_port)
    answers = [conn.export(request([gauge("loss", 1.0)], "inventive", **{attr.RUN_ID: f"r{i}"})) for i in range(5)]
    assert [a[:2] for a in answers] == [(200, 0)] * 3 + [(200, 1)] * 2
    assert "experiment 'inventive' has 3 runs open (limit)" in answers[3][2]
    assert conn.export(request([gauge("loss", 1.0)], "neighbour"))[:2] == (200, 0)  # others still get runs
    goodbye = request(
        [pb.Metric(name=attr.GOODBYE, sum=pb.Sum(data_points=[pb.NumberDataPoint(as_int=1)]))], "inventive"
    )
    goodbye.resource_metrics[0].resource.CopyFrom(
        encode_resource({attr.EXPERIMENT_ID: "inventive", attr.SERVICE_INSTANCE_ID: "p1", attr.RUN_ID: "r0"})
    )
    assert conn.export(goodbye)[0] == 200  # run r0 ended: it no longer counts against the limit
    assert conn.export(request([gauge("loss", 1.0)], "inventive", **{attr.RUN_ID: "r5"}))[:2] == (200, 0)
    conn.close()

    control = f"http://127.0.0.1:{sink.http_port}"
    config = {"console": {"logging_mode": "global_reduce"}}
    for i in range(8):  # the oldest config of an experiment with no run open makes room
        assert post_config(control, f"never-seen-{i}", config) == "ok"
    assert len(sink.views.posted_backends) == 5 and "never-seen-7" in sink.views.posted_backends


def test_a_client_inventing_refusal_reasons_cannot_wipe_the_status_routes_counts(make_sink) -> None:
    """The status route counts refusals by kind; past 1,000 kinds the table was cleared, so a
    client sending made-up attribute names could erase what the operator was looking at. A kind
    is now its reason without the names and numbers in it (and a full table folds new kinds into
    one entry rather than being cleared)."""
    sink = make_sink()
    conn = Http(sink.http_port)
    for _ in range(3):  # the operator's problem: a real one, counted first
        assert conn.export(request([gauge("u", 1.0, "median")]))[:2] == (200, 1)
    for i in range(1_100):
        assert conn.export(request([gauge("x", 1.0)], **{f"k{i}": "v" * (5000 + i)}))[:2] == (200, 1)
    conn.close()
    assert sink.tally.refused == 1_103
    assert sink.tally.refusals == {
        "unknown reduce type …": 3,
        "resource attribute … of … characters (limit …)": 1_100,
    }


def test_hostile_rank_sets_are_refused_with_their_reason_and_leave_a_victim_on_time(make_sink) -> None:
    """Rank sets (``rankscope.flush.ranks``, a Collector's merged markers) over real HTTP, as an
    attacker would send them: from a process's own resource, unreadable, scattered past the ranges
    a request may hold, a million-rank world, thousands of made-up groups. Each is answered with its
    reason and counted; the sink keeps its memory and a victim experiment finalizes on time."""
    import resource as rlimit

    sink = make_sink(book=BookConfig(grace=1.0))
    conn = Http(sink.http_port)
    merged = {attr.MERGED: True, attr.SERVICE_INSTANCE_ID: "forged-merge"}

    def sets(*points: tuple[str, int, str]) -> pb.Metric:
        m = pb.Metric(name=attr.FLUSH_RANKS)
        for role, world, ranks in points:
            attributes = [key_value(attr.STEP, 0), key_value(attr.ROLE, role), key_value(attr.WORLD_SIZE, world)]
            m.sum.data_points.add(as_int=1, attributes=[*attributes, key_value(attr.RANKS, ranks)])
        return m

    scattered = ",".join(str(2 * i) for i in range(70_000))  # 70,000 ranges: past 65,536 a request
    cases = [
        (request([sets(("trainer", 8, "0-7"))], "rs-own"), "only a Collector's merge sends rank sets"),
        (request([sets(("trainer", 8, "0-8"))], "rs-bad", **merged), "not ascending, apart and below 8"),
        (request([sets(("trainer", 1 << 20, scattered))], "rs-wide", **merged), "more than 65536 ranges"),
        (request([sets(("trainer", (1 << 20) + 1, "0"))], "rs-huge", **merged), "at most 1048576"),
    ]
    rss = rlimit.getrusage(rlimit.RUSAGE_SELF).ru_maxrss
    for step in range(4):
        steady_experiment(conn, step)
        for r, why in cases:
            status, rejected, message = conn.export(r)
            assert (status, rejected) == (200, 1) and why in message, (why, message)
    groups = request([sets(*[(f"role{i}", 1 << 20, "0-1048575") for i in range(2_000)])], "rs-groups", **merged)
    assert conn.export(groups)[:2] == (200, 0)  # taken: 131,072 slots for the first group, the rest counted
    status = sink.status("rs-groups")
    assert status["ranks"] == 131_072 and status["unplaced_rank_sets"] == 1_999
    conn.close()
    assert finalized(sink, "steady", 3, time.monotonic() + 8) == 3  # the victim: each step after its grace
    assert rlimit.getrusage(rlimit.RUSAGE_SELF).ru_maxrss - rss < 512 * 1024  # KiB: no set became memory
    assert sink.status("steady")["internal_errors"] == 0 and sink.status("rs-groups")["internal_errors"] == 0


def test_an_otlp_grpc_exporter_given_the_http_port_is_answered_400_and_said_by_name(
    make_sink, caplog: pytest.LogCaptureFixture
) -> None:
    """A real OTLP/gRPC exporter pointed at the OTLP/HTTP port opens with HTTP/2's preface: the sink
    answers it 400 and logs what happened in words, not aiohttp's parser message of raw bytes."""
    from rankscope.export.senders import make_sender

    sink = make_sink()
    sender = make_sender(f"http://127.0.0.1:{sink.http_port}", "grpc")
    with caplog.at_level(logging.WARNING, logger="rankscope.sink.http"):
        try:
            attempt = sender.send("metrics", b"", 2.0)
        finally:
            sender.shutdown()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not caplog.records:
            time.sleep(0.05)
    assert not attempt.sent, attempt
    said = [r.getMessage() for r in caplog.records if r.name == "rankscope.sink.http"]
    assert any("an OTLP/gRPC client (HTTP/2) at the OTLP/HTTP port" in m for m in said), said
    assert not any("PRI/Upgrade" in m for m in said), said
