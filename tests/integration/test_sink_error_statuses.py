"""Refusals over real HTTP and gRPC into a real sink on loopback: each answered as its kind's row in
``sink.edge.errors.ANSWERS`` says, never by its words. An experiment named ``capacity-test`` whose
run is closing was answered 429 over HTTP (its message held "capacity"); it is 503, as on gRPC."""

from __future__ import annotations

import http.client
from typing import Any

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc

from rankscope.export.senders import _hint
from rankscope.sink import Transport
from rankscope.sink.testing import ANSWERS, Kind
from tests.victim import step_request

PB = {"Content-Type": "application/x-protobuf"}
EXPERIMENT = "capacity-test"


def post(port: int, request: mpb.ExportMetricsServiceRequest) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/metrics", body=request.SerializeToString(), headers=PB)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def export(endpoint: str, request: mpb.ExportMetricsServiceRequest) -> grpc.RpcError:
    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as refused:
        mgrpc.MetricsServiceStub(channel).Export(request, timeout=10)
    return refused.value


def assert_answered_as(kind: Kind, sink: Any, request: mpb.ExportMetricsServiceRequest) -> str:
    """HTTP: the row's status, ``Retry-After`` and body code; gRPC: its code and ``RetryInfo``.
    Returns the refusal's message."""
    answer = ANSWERS[kind]
    status, headers, body = post(sink.http_port, request)
    assert status == answer.http, body[:200]
    assert headers.get("Retry-After") == str(answer.retry_after)
    assert Status.FromString(body).code == answer.grpc.value[0]
    error = export(sink.endpoint, request)
    assert error.code() is answer.grpc, error.details()
    trailers = dict(error.trailing_metadata() or ())
    (detail,) = Status.FromString(trailers["grpc-status-details-bin"]).details  # read by Go clients
    info = RetryInfo()
    assert detail.Unpack(info) and info.retry_delay.seconds == answer.retry_after
    assert _hint(error) == answer.retry_after  # and by rankscope's own sender (the Python SDK's key)
    return str(Status.FromString(body).message)


def test_a_closing_run_of_an_experiment_named_capacity_is_answered_closing(make_sink, monkeypatch) -> None:
    """The run is closed between being found and taking the data (the upkeep's race, made certain
    here): 503 / UNAVAILABLE, both retried; the retry reopens the run."""
    sink = make_sink()
    resolve = sink.opener.resolve

    def resolve_then_close(*args: Any, **kwargs: Any) -> Any:
        tenant = resolve(*args, **kwargs)
        with sink.tenants.lock:
            assert sink.closer.retire(tenant)  # as the upkeep closes a quiet run
        return tenant

    monkeypatch.setattr(sink.opener, "resolve", resolve_then_close)
    request = step_request(EXPERIMENT, "r1", 0, 0)
    message = assert_answered_as(Kind.CLOSING, sink, request)
    assert EXPERIMENT in message and ANSWERS[Kind.CLOSING].http == 503  # not 429 for the name in it
    monkeypatch.undo()
    status, _, body = post(sink.http_port, request)  # the retry
    answer = mpb.ExportMetricsServiceResponse.FromString(body)
    assert status == 200 and answer.partial_success.rejected_data_points == 0, answer


def test_a_sink_at_capacity_throttles_on_both_transports(make_sink) -> None:
    """Past ``max_in_flight``: 429 + ``Retry-After`` / RESOURCE_EXHAUSTED + ``RetryInfo`` (which
    OTLP clients retry only with the hint), whatever the experiment is called."""
    sink = make_sink(max_in_flight=0)  # every request finds the sink full
    assert_answered_as(Kind.CAPACITY, sink, step_request(EXPERIMENT, "r1", 0, 0))
    assert_answered_as(Kind.CAPACITY, sink, step_request("plain", "r1", 0, 0))
    assert (ANSWERS[Kind.CAPACITY].http, ANSWERS[Kind.CAPACITY].grpc) == (429, grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_two_authorization_headers_are_refused_alike_on_both_transports(make_sink) -> None:
    """HTTP read the first ``Authorization``, gRPC the last: a request carrying a wrong one and a
    right one was taken by one transport and refused by the other. Now two are UNAUTHORIZED on both."""
    token = "a-token-of-sixteen-or-more"
    sink = make_sink(transport=Transport(token=token))
    body = step_request("twice", "r", 0, 0).SerializeToString()
    for first, second in ((token, "wrong"), ("wrong", token), (token, token)):
        conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=10)
        try:
            conn.putrequest("POST", "/v1/metrics")
            conn.putheader("Content-Type", "application/x-protobuf")
            conn.putheader("Content-Length", str(len(body)))
            conn.putheader("Authorization", f"Bearer {first}")
            conn.putheader("Authorization", f"Bearer {second}")
            conn.endheaders(body)
            answer = conn.getresponse()
            answer.read()
            assert answer.status == ANSWERS[Kind.UNAUTHORIZED].http, (first, second)
        finally:
            conn.close()
        with grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") as channel:
            metadata = (("authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}"))
            with pytest.raises(grpc.RpcError) as refused:
                mgrpc.MetricsServiceStub(channel).Export(
                    step_request("twice", "r", 0, 0), metadata=metadata, timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (first, second)
    conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=10)
    conn.request(
        "POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"}
    )
    assert conn.getresponse().status == 200  # one is taken
    conn.close()
