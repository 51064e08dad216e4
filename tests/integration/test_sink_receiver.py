"""The sink's OTLP receiver on loopback: statuses for bad input, OTLP/JSON, gzip, tokens, overload;
what is not taken answered with a reason, the experiments listed, and the spans route serving the
whole run from its span file."""

from __future__ import annotations

import gzip
import http.client
import json

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc

from rankscope.metrics.recorder import Recorder
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.metrics import PointAttributes, encode
from rankscope.sink import Transport


def metrics_request(experiment: str = "e", key: str = "loss", value: float = 1.0, step: int = 0) -> bytes:
    c = Recorder(streams=[])
    c.record(key, value, Reduce.MEAN)
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(
        resource=encode_resource({"rankscope.experiment.id": experiment, "service.instance.id": "p1"})
    )
    metric = encode(key, c.accs[key], step, 0, 1, PointAttributes())
    assert metric is not None
    rm.scope_metrics.add().metrics.append(metric)
    return request.SerializeToString()


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


PB = {"Content-Type": "application/x-protobuf"}


def test_bad_bodies_get_the_right_status_and_the_sink_keeps_serving(make_sink) -> None:
    sink = make_sink(transport=Transport(max_body_bytes=64 * 1024))
    port = sink.http_port
    good = metrics_request()

    status, headers, body = post(port, "/v1/metrics", b"\x0a\xff\xff\xff\xff", PB)
    assert status == 400 and headers["Content-Type"] == "application/x-protobuf"
    assert "undecodable" in Status.FromString(body).message

    status, _, _ = post(port, "/v1/metrics", good, {"Content-Type": "text/html"})
    assert status == 415

    status, _, _ = post(port, "/v1/metrics", b"\0" * (65 * 1024), PB)
    assert status == 413

    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024))  # 50 MiB of zeros in ~50 KiB
    assert len(bomb) < 64 * 1024
    status, _, body = post(port, "/v1/metrics", bomb, {**PB, "Content-Encoding": "gzip"})
    assert status == 413 and "inflates past" in Status.FromString(body).message

    # Good clients are still served, over both transports, gzip included.
    status, _, body = post(port, "/v1/metrics", gzip.compress(good), {**PB, "Content-Encoding": "gzip"})
    assert status == 200 and not mpb.ExportMetricsServiceResponse.FromString(body).HasField("partial_success")
    with grpc.insecure_channel(sink.endpoint) as channel:
        mgrpc.MetricsServiceStub(channel).Export(mpb.ExportMetricsServiceRequest.FromString(good), timeout=10)
    assert sink.status("e")["processes"] == 1


def test_otlp_json_with_hex_ids_and_integer_enums(make_sink) -> None:
    sink = make_sink()
    body = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "rankscope.experiment.id", "value": {"stringValue": "j"}}]},
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "loss",
                                "gauge": {
                                    "dataPoints": [
                                        {
                                            "asDouble": 2.5,
                                            "timeUnixNano": "1",
                                            "attributes": [
                                                {"key": "rankscope.reduce", "value": {"stringValue": "max"}},
                                                {"key": "rankscope.step", "value": {"intValue": "0"}},
                                            ],
                                            "exemplars": [{"spanId": "00f067aa0ba902b7", "asDouble": 1}],
                                        }
                                    ]
                                },
                            },
                            {
                                "name": "rankscope.flush",
                                "sum": {
                                    "aggregationTemporality": 1,
                                    "dataPoints": [
                                        {
                                            "asInt": "1",
                                            "attributes": [{"key": "rankscope.step", "value": {"intValue": "0"}}],
                                        }
                                    ],
                                },
                            },
                        ]
                    }
                ],
            }
        ]
    }
    status, headers, answer = post(
        sink.http_port, "/v1/metrics", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200 and headers["Content-Type"] == "application/json", answer
    assert sink.wait_written("j") and sink.status("j")["last_finalized_step"] == 0


def test_rejected_points_are_counted_in_partial_success(make_sink) -> None:
    sink = make_sink()
    request = mpb.ExportMetricsServiceRequest.FromString(metrics_request())
    point = request.resource_metrics[0].scope_metrics[0].metrics[0].histogram.data_points[0]
    point.attributes[0].value.string_value = "no-such-reduce"
    status, _, body = post(sink.http_port, "/v1/metrics", request.SerializeToString(), PB)
    answer = mpb.ExportMetricsServiceResponse.FromString(body)
    assert status == 200 and answer.partial_success.rejected_data_points == 1
    assert "no-such-reduce" in answer.partial_success.error_message


def test_bearer_token_on_both_transports(make_sink, caplog: pytest.LogCaptureFixture) -> None:
    sink = make_sink(transport=Transport(token="s3cret"))
    good = metrics_request()
    assert post(sink.http_port, "/v1/metrics", good, PB)[0] == 401
    for _ in range(300):  # a flood of wrong tokens: each answered and counted, the log not flooded
        assert post(sink.http_port, "/v1/metrics", good, {**PB, "Authorization": "Bearer wrong"})[0] == 401
    assert post(sink.http_port, "/v1/metrics", good, {**PB, "Authorization": "Bearer s3cret"})[0] == 200
    with grpc.insecure_channel(sink.endpoint) as channel:
        stub = mgrpc.MetricsServiceStub(channel)
        request = mpb.ExportMetricsServiceRequest.FromString(good)
        with pytest.raises(grpc.RpcError) as e:
            stub.Export(request, timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
        stub.Export(request, timeout=10, metadata=(("authorization", "Bearer s3cret"),))
    # A job sending with a wrong token is seen at the sink: counted per transport, said now and then.
    connections = sink.overview()["connections"]
    assert (connections["http"]["unauthorized"], connections["grpc"]["unauthorized"]) == (301, 1), connections
    said = [r.getMessage() for r in caplog.records if "missing or wrong bearer token" in r.getMessage()]
    assert len(said) == 2 and all("answered 1 request(s)" in line for line in said), said  # each transport's first


def test_over_capacity_is_retryable(make_sink) -> None:
    """Throttled: 429 + Retry-After, RESOURCE_EXHAUSTED + RetryInfo (``sink.edge.errors``)."""
    sink = make_sink(max_in_flight=0)  # every request finds the sink full
    status, headers, _ = post(sink.http_port, "/v1/metrics", metrics_request(), PB)
    assert status == 429 and headers["Retry-After"] == "1"
    with grpc.insecure_channel(sink.endpoint) as channel:
        with pytest.raises(grpc.RpcError) as e:
            mgrpc.MetricsServiceStub(channel).Export(
                mpb.ExportMetricsServiceRequest.FromString(metrics_request()), timeout=10
            )
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "google.rpc.retryinfo-bin" in dict(e.value.trailing_metadata() or ())


def test_what_is_not_taken_is_answered_with_a_reason_and_experiments_are_listed(make_sink, tmp_path) -> None:
    """Nothing is dropped silently: anything without an experiment id, plain OTel points and log
    records that do not hold what they must are answered as rejected with the reason. The
    status route lists experiments and where their views write."""
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as lgrpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

    path = tmp_path / "view.jsonl"
    sink = make_sink(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}})
    with grpc.insecure_channel(sink.endpoint) as channel:
        metrics, traces, logs = (
            mgrpc.MetricsServiceStub(channel),
            tgrpc.TraceServiceStub(channel),
            lgrpc.LogsServiceStub(channel),
        )
        for resource, why in (
            ({"service.name": "plain"}, "without rankscope.experiment.id"),
            ({"rankscope.experiment.id": "x", "service.instance.id": "p"}, "aggregation temporality unspecified"),
        ):
            request = mpb.ExportMetricsServiceRequest()
            scope = request.resource_metrics.add(resource=encode_resource(resource)).scope_metrics.add()
            counter = scope.metrics.add(name="requests")
            counter.sum.is_monotonic = True
            counter.sum.data_points.add(as_int=3)
            counter.sum.data_points.add(as_int=4)
            answer = metrics.Export(request, timeout=10).partial_success
            assert answer.rejected_data_points == 2 and why in answer.error_message, answer
        spans = tpb.ExportTraceServiceRequest()
        spans.resource_spans.add(resource=encode_resource({"service.name": "plain"})).scope_spans.add().spans.add(
            trace_id=b"\1" * 16, span_id=b"\2" * 8, name="s"
        )
        answer = traces.Export(spans, timeout=10).partial_success
        assert answer.rejected_spans == 1 and "rankscope.experiment.id" in answer.error_message
        records = lpb.ExportLogsServiceRequest()
        resource = encode_resource({"rankscope.experiment.id": "x", "service.instance.id": "p"})
        record = records.resource_logs.add(resource=resource).scope_logs.add().log_records.add(severity_text="INFO")
        record.attributes.append(key_value("rankscope.step", "three"))
        answer = logs.Export(records, timeout=10).partial_success
        assert answer.rejected_log_records == 1 and "rankscope.step must be an integer" in answer.error_message
        metrics.Export(mpb.ExportMetricsServiceRequest.FromString(metrics_request("x")), timeout=10)
    sink.finalize("x")
    assert sink.wait_written("x")
    overview = sink.overview()
    assert overview["refused_points"] >= 4
    (listed,) = overview["experiment_list"]
    assert listed["id"] == "x" and listed["processes"] == 2 and listed["views"] == {"jsonl": str(path.resolve())}
    assert sink.status("x")["foreign_points"] == 2


def test_the_spans_route_and_gantt_cover_the_whole_run_from_the_span_file(make_sink, tmp_path) -> None:
    """Memory keeps the last 3 steps; with a span file, the spans route (and ``rankscope gantt
    --sink``) serves all 10."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

    from rankscope.report import perfetto

    sink = make_sink(trace_retain_steps=3, spans_dir=tmp_path / "spans")
    with grpc.insecure_channel(sink.endpoint) as channel:
        stub = tgrpc.TraceServiceStub(channel)
        for step in range(10):
            request = tpb.ExportTraceServiceRequest()
            resource = encode_resource({"rankscope.experiment.id": "long", "service.instance.id": "p"})
            span = (
                request.resource_spans.add(resource=resource)
                .scope_spans.add()
                .spans.add(trace_id=(step + 1).to_bytes(16, "big"), span_id=b"\1" * 8, name="fwd", end_time_unix_nano=5)
            )
            span.attributes.append(key_value("rankscope.step", step))
            assert stub.Export(request, timeout=10).partial_success.rejected_spans == 0
    assert len(sink.spans("long") or []) == 3
    rows = list(perfetto.read_sink(f"http://127.0.0.1:{sink.http_port}", "long", perfetto.Filter()))
    assert [row["step"] for row in rows] == list(range(10))
    assert sink.status("long")["span_file"]["capped"] is False
