"""What one request may cost the sink, without sockets: the counting walk over the wire format
(``otlp.raw.walk_metrics``, ``walk_records``), each per-request bound of ``Limits`` as the edge
applies it (``metrics_batches``, ``traces_parts``, ``logs_batches``), the new runs one request may
open (``Openings``; a traces or logs request takes nothing until its runs are open), and the sink's
budget of points in flight (``Gate``).

The same bounds against a real ``rankscope sink`` over HTTP and gRPC, with an honest experiment
finalizing meanwhile: ``tests/integration/test_sink_request_cost.py``."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb

from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.raw import (
    EncodedMetrics,
    Walked,
    bounded_metrics,
    parse_logs,
    parse_metrics,
    parse_traces,
    resource_metrics,
    walk_metrics,
    walk_records,
)
from rankscope.sink import Limits, Sink, SinkConfig
from rankscope.sink.testing import (
    ANSWERS,
    RECORD_WEIGHT,
    Client,
    Gate,
    Kind,
    Openings,
    OverloadedError,
    Refusals,
    RefusedError,
    logs_batches,
    metrics_batches,
    traces_parts,
)
from tests.wire import field as _field


def empty_points(n: int, experiment: str = "x") -> bytes:
    """A request of one Gauge holding ``n`` empty points (two bytes each), built as bytes."""
    resource = encode_resource({attr.EXPERIMENT_ID: experiment}).SerializeToString()
    metric = _field(1, b"m") + _field(5, b"\x0a\x00" * n)
    return _field(1, _field(1, resource) + _field(2, _field(2, metric)))


def request(experiments: int = 1, keys: int = 1, points: int = 1) -> mpb.ExportMetricsServiceRequest:
    """One Resource per experiment, each with ``keys`` MAX metrics of ``points`` points."""
    r = mpb.ExportMetricsServiceRequest()
    for e in range(experiments):
        resource = encode_resource({attr.EXPERIMENT_ID: f"exp-{e}", attr.SERVICE_INSTANCE_ID: "p", attr.RANK: "0"})
        metrics = r.resource_metrics.add(resource=resource).scope_metrics.add().metrics
        for k in range(keys):
            gauge = metrics.add(name=f"key{k}").gauge
            for step in range(points):
                p = gauge.data_points.add(as_double=1.0)
                p.attributes.extend([key_value(attr.REDUCE, "max"), key_value(attr.STEP, step)])
    return r


def units(body: bytes) -> int:
    """What the walk counts, from the decoded request: each Metric's points (one if none), each
    ScopeMetrics' (one if it holds no Metric)."""
    total = 0
    for _, rm in resource_metrics(body):
        for sm in rm.scope_metrics:
            found = 0
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                found += max(1, len(getattr(m, kind).data_points) if kind else 0)
            total += found or 1
    return total


def test_the_walk_counts_what_the_parser_decodes_and_stops_at_each_bound() -> None:
    body = request(experiments=3, keys=4, points=5).SerializeToString()
    walked = walk_metrics(body, 100, 1000, count=True)
    assert walked == Walked(walked.spans, 60, "") and len(walked.spans) == 3
    assert len(body) < 2 * 10_000 and walk_metrics(body, 100, 10_000).points == -1  # too short to pass: not counted
    assert walk_metrics(body, 2, 1000).over == "resources" and len(walk_metrics(body, 2, 1000).spans) == 3
    over = walk_metrics(body, 100, 25, count=True)
    assert over.over == "points" and over.points == 26  # stopped one past the bound, not at the end

    big = empty_points(2_000_000)
    walked = walk_metrics(big, 100, 1 << 20)  # 4 MB: long enough to pass the bound, so counted
    assert walked.over == "points" and walked.points == (1 << 20) + 1


def test_empty_metrics_and_scopes_count_one_each() -> None:
    resource = _field(1, encode_resource({attr.EXPERIMENT_ID: "x"}).SerializeToString())
    scopes = _field(2, b"") * 3 + _field(2, _field(2, b"") * 5)  # three empty scopes, five empty metrics
    body = _field(1, resource + scopes)
    assert walk_metrics(body, 10, 100, count=True).points == 8 == units(body)


def test_the_walk_reads_any_encoding_of_otlp_the_parser_reads() -> None:
    point = b"\x09" + b"\0" * 8  # as_double 0.0
    long_tag = b"\x8a\x00"  # field 1, length-delimited, as a two-byte varint
    data = _field(1, point) + long_tag + bytes([len(point)]) + point + b"\x10\x01" + _field(1, b"x" * 300)
    body = _field(1, _field(2, _field(2, _field(1, b"m") + _field(7, data))) + b"\x18\x05")
    assert walk_metrics(body, 10, 100, count=True).points == 3 == units(body)
    group = bytes([7 << 3 | 3]) + b"\x08\x01" + bytes([7 << 3 | 4])  # no OTLP message has a group
    with pytest.raises(DecodeError, match="group"):
        walk_metrics(_field(1, _field(2, b"") + group), 10, 100, count=True)


def test_fields_past_four_of_a_message_count_as_points() -> None:
    """Stepping over a field costs the walk what a point costs: a body of two-byte unknown fields
    (at any level the walk reads) is refused as fast as one of empty points."""
    junk = b"\x62\x00"  # an empty field 12 (Metric.metadata; unknown elsewhere)
    metric = _field(1, b"m") + _field(3, b"s") + _field(5, _field(1, b"")) + junk  # 4 fields: free
    assert walk_metrics(_field(1, _field(2, _field(2, metric))), 10, 100, count=True).points == 1
    assert walk_metrics(_field(1, _field(2, _field(2, metric + junk * 10))), 10, 100, count=True).points == 11
    for body in (
        junk * 50_000,  # the request's own fields
        _field(1, junk * 50_000),  # a ResourceMetrics'
        _field(1, _field(2, junk * 50_000)),  # a ScopeMetrics'
        _field(1, _field(2, _field(2, _field(1, b"m") + junk * 50_000))),  # a Metric's
        _field(1, _field(2, _field(2, _field(5, b"\x18\x01" * 50_000)))),  # a Gauge's
    ):
        walked = walk_metrics(body, 100, 10_000)
        assert walked.over == "points" and walked.points == 10_001


def test_the_walk_never_counts_fewer_than_the_parser_decodes() -> None:
    """Seeded random requests, half of them mutated: whatever the parser takes, the walk counts
    at least as much (or refuses the framing the parser refuses too)."""
    rng = random.Random(49)
    for _ in range(2000):
        body = bytearray(request(rng.randint(0, 3), rng.randint(0, 3), rng.randint(0, 3)).SerializeToString())
        for _ in range(rng.randint(0, 3) if body else 0):
            body[rng.randrange(len(body))] = rng.randrange(256)
        try:
            expected = units(bytes(body))
            walked = walk_metrics(bytes(body), 1 << 30, 1 << 30, count=True)
        except DecodeError:  # either refuses: the sink answers 400
            continue
        assert walked.points >= expected


@pytest.mark.parametrize(
    "body",
    [b"\x0a\x05\x12", b"\x0a\xff\xff\xff\xff\x0f", b"\x0b\x08\x01", b"\x0f", _field(1, _field(2, b"\x12\x09"))],
)
def test_broken_framing_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError):
        walk_metrics(body, 100, 100, count=True)


def test_only_a_request_within_the_bounds_is_decoded() -> None:
    body = request(experiments=2, keys=2).SerializeToString()
    decoded = bounded_metrics(body, 10, 100)
    assert isinstance(decoded, list) and [rm.scope_metrics[0].metrics[0].name for _, rm in decoded] == ["key0"] * 2
    assert all(encoded in body for encoded, _ in decoded)  # each as it arrived: a retry is known by its digest
    over = bounded_metrics(empty_points(300), 10, 100)
    assert isinstance(over, Walked) and over.over == "points"
    assert parse_metrics(body) == EncodedMetrics(body)  # the transports hand the body on as it came


def costly(body: Any, limits: Limits) -> tuple[RefusedError, Refusals, list[Refusals]]:
    refused, said = Refusals(), []
    with pytest.raises(RefusedError) as caught:
        metrics_batches(body, limits, refused, said.append)
    return caught.value, refused, said


def test_a_request_past_max_points_is_refused_whole_before_it_is_decoded() -> None:
    error, refused, said = costly(EncodedMetrics(empty_points(2_000_000)), Limits())
    assert error.kind == Kind.COSTLY and "more than 1048576 points (limit max_points)" in str(error)
    assert refused.count == (1 << 20) + 1 and said == [refused]  # counted for the status route
    answer = ANSWERS[Kind.COSTLY]
    assert (answer.http, answer.grpc, answer.retry_after) == (400, grpc.StatusCode.INVALID_ARGUMENT, None)


def test_a_request_past_max_resources_is_refused_whole() -> None:
    body = request(experiments=5).SerializeToString()
    error, refused, _ = costly(body, Limits(max_resources=4))
    assert error.kind == Kind.COSTLY and "more than 4 resources" in str(error)
    assert refused.count == 5  # its points, counted though the body was too short to count them on the way
    assert len(metrics_batches(body, Limits(max_resources=5), Refusals())) == 5


def test_a_request_naming_more_than_max_experiments_is_refused_before_any_point_is_checked() -> None:
    body = request(experiments=4, keys=2).SerializeToString()
    error, refused, _ = costly(body, Limits(max_experiments=3))
    assert error.kind == Kind.COSTLY and "naming more than 3 experiments" in str(error) and refused.count == 8
    same = mpb.ExportMetricsServiceRequest()
    for rank in range(6):  # six processes of one experiment: one experiment
        resource = encode_resource({attr.EXPERIMENT_ID: "one", attr.SERVICE_INSTANCE_ID: f"p{rank}", attr.RANK: rank})
        same.resource_metrics.add(resource=resource)
    assert len(metrics_batches(same.SerializeToString(), Limits(max_experiments=1), Refusals())) == 6


def test_an_undecodable_request_is_a_bad_request_and_counts_nothing() -> None:
    error, refused, said = costly(b"\x0a\xff\xff\xff\xff\x0f", Limits())
    assert error.kind == Kind.BAD_REQUEST and refused.count == 0 and said == []


def test_limits_are_at_least_one() -> None:
    for name in ("max_points", "max_resources", "max_experiments", "max_new_runs"):
        with pytest.raises(ValueError, match=name):
            Limits(**{name: 0})


def test_a_request_opens_at_most_max_new_runs_then_the_rest_waits_for_the_retry() -> None:
    opens = Openings(2, Client())
    assert opens.take(5) is None and opens.take(5) is None
    opens.check()  # nothing deferred: the request is answered as it is
    why = opens.take(7)
    assert why is not None and "more than 2 runs (limit max_new_runs)" in why and opens.take(1) == why
    assert opens.deferred == 8
    with pytest.raises(OverloadedError) as caught:
        opens.check()
    assert caught.value.kind == Kind.OPENING and caught.value.retry_after == 1
    assert (ANSWERS[Kind.OPENING].http, ANSWERS[Kind.OPENING].grpc) == (429, grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_once_the_client_went_away_no_run_opens() -> None:
    waiting = [True]
    opens = Openings(100, Client(alive=lambda: waiting[0]))
    assert opens.take(1) is None
    waiting[0] = False
    why = opens.take(3)
    assert why is not None and "went away" in why and opens.left == 99 and opens.deferred == 3
    with pytest.raises(OverloadedError) as caught:
        opens.check()
    assert caught.value.kind == Kind.CLIENT_GONE


# -- traces and logs: the same walk, the same bounds -------------------------------------------


def records_request(signal: str, experiments: int = 1, records: int = 1, scopes: int = 1) -> bytes:
    """A traces (logs) request: one Resource per experiment, each with ``scopes`` scopes of
    ``records`` valid spans (log records)."""
    r: Any = tpb.ExportTraceServiceRequest() if signal == "traces" else lpb.ExportLogsServiceRequest()
    for e in range(experiments):
        resource = encode_resource({attr.EXPERIMENT_ID: f"exp-{e}", attr.SERVICE_INSTANCE_ID: "p", attr.RANK: "0"})
        if signal == "traces":
            part = r.resource_spans.add(resource=resource)
            for _ in range(scopes):
                spans = part.scope_spans.add().spans
                for i in range(records):
                    spans.add(trace_id=b"\1" * 16, span_id=(i + 1).to_bytes(8, "big"), name="s", end_time_unix_nano=1)
        else:
            part = r.resource_logs.add(resource=resource)
            for _ in range(scopes):
                logs = part.scope_logs.add().log_records
                for i in range(records):
                    logs.add(time_unix_nano=i + 1).body.string_value = "line"
    return bytes(r.SerializeToString())


def empty_records(n: int, experiment: str = "x") -> bytes:
    """One scope of ``n`` empty spans (log records: the same bytes), two bytes each."""
    resource = encode_resource({attr.EXPERIMENT_ID: experiment}).SerializeToString()
    return _field(1, _field(1, resource) + _field(2, b"\x12\x00" * n))


def record_units(signal: str, body: bytes) -> int:
    """What the walk counts, from the decoded request: each scope's records (one if it holds none)."""
    if signal == "traces":
        return sum(
            len(ss.spans) or 1
            for rs in tpb.ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
        )
    return sum(
        len(sl.log_records) or 1
        for rl in lpb.ExportLogsServiceRequest.FromString(body).resource_logs
        for sl in rl.scope_logs
    )


@pytest.mark.parametrize("signal", ["traces", "logs"])
def test_the_walk_counts_spans_and_log_records_as_the_parser_decodes_them(signal: str) -> None:
    body = records_request(signal, experiments=3, records=4, scopes=2)
    walked = walk_records(body, 100, 1000, count=True)
    assert walked == Walked(walked.spans, 24, "") and len(walked.spans) == 3 == len(traces_or_logs(signal, body))
    assert walk_records(body, 2, 1000).over == "resources"
    assert walk_records(body, 100, 10, count=True) == Walked(walked.spans[:2], 11, "points")  # one past, not at the end
    empty = _field(1, _field(2, b"") * 3)  # three scopes without records: a loop each
    assert walk_records(empty, 10, 100, count=True).points == 3 == record_units(signal, empty)
    over = walk_records(empty_records(2_000_000), 10, 1 << 16)  # 4 MB: counted, stopped at the bound
    assert over.over == "points" and over.points == (1 << 16) + 1
    rng = random.Random(50)
    for _ in range(1000):  # mutated requests: the walk never counts fewer than the parser decodes
        mutated = bytearray(records_request(signal, rng.randint(0, 3), rng.randint(0, 3), rng.randint(0, 2)))
        for _ in range(rng.randint(0, 3) if mutated else 0):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        try:
            expected = record_units(signal, bytes(mutated))
            counted = walk_records(bytes(mutated), 1 << 30, 1 << 30, count=True).points
        except DecodeError:
            continue
        assert counted >= expected


def traces_or_logs(signal: str, request: Any, limits: Limits | None = None, **kw: Any) -> list[Any]:
    """The edge's check of a traces or logs request (as the transports hand it on, or bytes)."""
    check = traces_parts if signal == "traces" else logs_batches
    refused = kw.pop("refused", Refusals())
    return check(request, limits or Limits(), refused, **kw)  # type: ignore[no-any-return]


@pytest.mark.parametrize("signal", ["traces", "logs"])
def test_a_traces_or_logs_request_past_a_bound_is_refused_whole_before_it_is_decoded(signal: str) -> None:
    encode = parse_traces if signal == "traces" else parse_logs
    noun = "spans" if signal == "traces" else "log records"
    for body, limits, why, units in (
        (empty_records(2_000_000), Limits(), f"more than 65536 {noun} (limit max_records)", (1 << 16) + 1),
        (records_request(signal, experiments=5), Limits(max_resources=4), "more than 4 resources", 5),
        (records_request(signal, experiments=4, records=2), Limits(max_experiments=3), "naming more than 3", 8),
    ):
        refused, said = Refusals(), []
        with pytest.raises(RefusedError) as caught:
            traces_or_logs(signal, encode(body), limits, refused=refused, on_costly=said.append)
        assert caught.value.kind == Kind.COSTLY and why in str(caught.value) and "not taken" in str(caught.value)
        assert refused.count == units and said == [refused]
    message = tpb.ExportTraceServiceRequest if signal == "traces" else lpb.ExportLogsServiceRequest
    decoded = message.FromString(records_request(signal, records=3))  # OTLP/JSON's, decoded already: bounded alike
    with pytest.raises(RefusedError):
        traces_or_logs(signal, decoded, Limits(max_records=2))
    assert len(traces_or_logs(signal, decoded, Limits(max_records=3))) == 1
    with pytest.raises(RefusedError) as caught:
        traces_or_logs(signal, encode(b"\x0a\x05\x12"))
    assert caught.value.kind == Kind.BAD_REQUEST


def test_limits_on_records_are_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_records"):
        Limits(max_records=0)


# -- the sink's budget of points in flight --------------------------------------------------------


def test_calls_within_their_share_always_pass_and_larger_ones_share_the_budget() -> None:
    gate = Gate(4, threading.Event(), 100)  # a share of 25 points
    assert gate.share == 25
    with gate as first:
        assert first.room() > 10**12  # nothing else weighs: any size passes
        assert first.weigh(60) and gate.held == 60
        with gate as second:
            assert second.room() == 40
            assert not second.weigh(50)  # 60 + 50 over 100: retry later
            assert second.weigh(25) and gate.held == 60  # within its share: always, and none of the budget
            assert second.weigh(40) and gate.held == 100
            with gate as third:
                assert third.room() == 25 and third.weigh(25) and not third.weigh(26)
        assert gate.held == 60  # what a call held is given back when it leaves
    assert gate.held == 0
    with gate as alone:
        assert alone.weigh(10_000)  # larger than the whole budget: passes when no other large call is in flight
    with pytest.raises(OverloadedError) as caught, gate, gate, gate, gate, gate:
        pass
    assert caught.value.kind == Kind.CAPACITY and gate.held == 0


def test_a_request_that_does_not_fit_is_refused_retry_later_having_cost_at_most_the_room() -> None:
    """Another request holds 1,500 of 2,000 points: a 1,500-point request is walked only to the
    500 left, refused CAPACITY (429/RESOURCE_EXHAUSTED, retry in 1 s) and counted; alone it passes."""
    gate, body = Gate(64, threading.Event(), 2_000), EncodedMetrics(empty_points(1_500))
    with gate as other:
        assert other.weigh(1_500)
        with gate as call:
            refused, said = Refusals(), []
            with pytest.raises(OverloadedError) as caught:
                metrics_batches(body, Limits(), refused, said.append, call)
            assert caught.value.kind == Kind.CAPACITY and caught.value.retry_after == 1
            assert "(limit max_points_in_flight); retry" in str(caught.value)
            assert refused.count == 501 and said == [refused] and gate.held == 1_500
    answer = ANSWERS[Kind.CAPACITY]
    assert (answer.http, answer.grpc, answer.retry_after) == (429, grpc.StatusCode.RESOURCE_EXHAUSTED, 1)
    with gate as call:
        assert len(metrics_batches(body, Limits(), Refusals(), None, call)) == 1 and gate.held == 1_500
    with gate as call:  # spans and log records weigh more than points: the sink does more for each
        traces_parts(parse_traces(records_request("traces", records=300)), Limits(), Refusals(), None, call)
        assert call.weight == 300 * RECORD_WEIGHT
        small = request(keys=10).SerializeToString()  # within its share: not even counted
        metrics_batches(small, Limits(), Refusals(), None, call)
        assert call.weight == 0


# -- traces and logs requests open their runs before taking anything ------------------------------


@pytest.mark.parametrize("signal", ["traces", "logs"])
def test_a_traces_or_logs_request_takes_nothing_until_its_runs_are_all_open(tmp_path: Path, signal: str) -> None:
    """Seven new runs, three a request (``max_new_runs``): the first two attempts open three each
    and take nothing (429, retry in 1 s), the third takes every record once; a client that went away
    opens nothing and takes nothing."""
    config = SinkConfig(grpc_port=None, http_port=None, state_dir=None, limits=Limits(max_new_runs=3))
    config.backends = {"jsonl": {"path": str(tmp_path / "{experiment}.jsonl")}}
    sink = Sink(config).start()
    export = sink.export_traces if signal == "traces" else sink.export_logs
    encode = parse_traces if signal == "traces" else parse_logs
    taken = "spans_stored" if signal == "traces" else "log_records"
    try:
        with pytest.raises(OverloadedError) as caught:
            export(encode(records_request(signal, experiments=2)), Client(alive=lambda: False))
        assert caught.value.kind == Kind.CLIENT_GONE and sink.overview()["runs"] == 0
        body = encode(records_request(signal, experiments=7, records=2))
        for opened in (3, 6):
            with pytest.raises(OverloadedError) as caught:
                export(body)
            assert caught.value.kind == Kind.OPENING and caught.value.retry_after == 1
            assert "nothing taken yet" in str(caught.value) and sink.overview()["runs"] == opened
            assert all(sink.status(f"exp-{e}")[taken] == 0 for e in range(opened))  # type: ignore[index]
        assert export(body).accepted == 14
        assert [sink.status(f"exp-{e}")[taken] for e in range(7)] == [2] * 7  # type: ignore[index]
        refusals = sink.overview()["refusals"]
        assert sum(n for kind, n in refusals.items() if "(limit max_new_runs); nothing taken" in kind) == 8 + 2
    finally:
        sink.stop()


@pytest.mark.parametrize("signal", ["metrics", "traces", "logs"])
def test_a_corrupt_unit_the_walk_steps_over_is_a_bad_request(signal: str) -> None:
    """The walk reads a point's (span's, record's) key and length, never into it: a unit whose inside
    the parser refuses is still answered 400, not an internal error."""
    corrupt = b"\x0b"  # a group's start: no OTLP message has one
    if signal == "metrics":
        body = _field(1, _field(2, _field(2, _field(1, b"m") + _field(5, _field(1, corrupt)))))
        check = metrics_batches
    else:
        body = _field(1, _field(2, _field(2, corrupt)))
        check = traces_parts if signal == "traces" else logs_batches
    refused = Refusals()
    with pytest.raises(RefusedError) as caught:
        check(body, Limits(), refused)
    assert caught.value.kind == Kind.BAD_REQUEST and refused.count == 0
