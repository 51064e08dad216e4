"""The sink's one table of refusals (``sink.edge.errors``): every kind has a row, each row keeps the
OTel Collector's pairing of HTTP status and gRPC code, and both transports answer a kind from its
row alone, whatever the message says (a client's experiment id may be in it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status

from rankscope.sink.testing import (
    ANSWERS,
    Control,
    ControlRoutes,
    HttpError,
    Keys,
    Kind,
    OverloadedError,
    Refusal,
    abort,
    error_response,
)

MESSAGE = "capacity-test was closing; retry"
"""Every kind is answered with this message: it names "capacity", and no answer may care."""

RETRYABLE = {(503, grpc.StatusCode.UNAVAILABLE), (429, grpc.StatusCode.RESOURCE_EXHAUSTED)}
"""The Collector's (and OTLP's) pairs for a refusal worth retrying: overloaded, or throttled."""


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_has_one_answer_in_the_collectors_pairing(kind: Kind) -> None:
    answer = ANSWERS[kind]  # a new kind without a row fails here
    assert 400 <= answer.http < 600 and answer.grpc is not grpc.StatusCode.OK
    if answer.retry_after is not None:  # retrying helps: a pair OTLP clients retry, with a hint
        assert (answer.http, answer.grpc) in RETRYABLE and answer.retry_after > 0
    if answer.grpc is grpc.StatusCode.UNAVAILABLE or answer.http == 503:
        assert (answer.http, answer.grpc) == (503, grpc.StatusCode.UNAVAILABLE) and answer.retry_after is not None
    if answer.http == 429:
        assert answer.grpc is grpc.StatusCode.RESOURCE_EXHAUSTED
    if answer.http in (400, 401):
        assert answer.grpc is {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED}[answer.http]


def test_the_table_has_no_row_for_a_kind_that_is_gone() -> None:
    assert set(ANSWERS) == set(Kind)


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("content_type", ["application/x-protobuf", "application/json"])
def test_the_http_transport_answers_a_kind_from_its_row(kind: Kind, content_type: str) -> None:
    answer = ANSWERS[kind]
    request = make_mocked_request("POST", "/v1/metrics", headers={"Content-Type": content_type})
    response = error_response(request, HttpError(kind, MESSAGE))
    assert response.status == answer.http == HttpError(kind, MESSAGE).status
    assert isinstance(response.body, bytes)
    if content_type == "application/json":
        status = json.loads(response.body)
        assert status.get("code", 0) == answer.grpc.value[0] and status["message"] == MESSAGE
    else:
        status = Status.FromString(response.body)  # OTLP/HTTP's error body: google.rpc.Status
        assert (status.code, status.message) == (answer.grpc.value[0], MESSAGE)
    retry_after = response.headers.get("Retry-After")
    assert retry_after == (None if answer.retry_after is None else str(answer.retry_after))
    assert response.keep_alive is (False if answer.close else None)


class _Context:
    """What ``abort`` uses of a gRPC servicer context."""

    def __init__(self) -> None:
        self.trailers: dict[str, bytes] = {}
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailers = dict(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.RpcError(details)


@pytest.mark.parametrize("kind", list(Kind))
def test_the_grpc_transport_answers_a_kind_from_its_row(kind: Kind) -> None:
    answer, context = ANSWERS[kind], _Context()
    with pytest.raises(grpc.RpcError):
        asyncio.run(abort(context, kind, MESSAGE))  # grpcio's asyncio context awaits its abort
    assert context.aborted == (answer.grpc, MESSAGE)
    if answer.retry_after is None:
        assert context.trailers == {}
        return
    status = Status.FromString(context.trailers["grpc-status-details-bin"])  # where Go clients look
    assert (status.code, status.message) == (answer.grpc.value[0], MESSAGE)
    (detail,) = status.details
    info = RetryInfo()
    assert detail.Unpack(info) and info.retry_delay.seconds == answer.retry_after
    info = RetryInfo.FromString(context.trailers["google.rpc.retryinfo-bin"])  # where Python's look
    assert info.retry_delay.seconds == answer.retry_after


def test_a_refusal_is_answered_by_its_kind_never_its_words() -> None:
    closing = OverloadedError(Kind.CLOSING, MESSAGE)
    assert str(closing) == MESSAGE and closing.retry_after == 1
    assert HttpError(closing.kind, str(closing)).status == 503  # was 429: "capacity" was in the text
    assert OverloadedError(Kind.CAPACITY, "the sink is at capacity").retry_after == 1
    refusal = Refusal(Kind.CONFLICT, "no experiment in this answer is found")
    assert isinstance(refusal, str) and refusal.startswith("no experiment") and refusal.kind is Kind.CONFLICT


class _Port:
    """A ``Control`` port whose report and capture say no with a chosen kind and misleading words."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def report(self, experiment_id: str, timeout: float = 60.0, run: str | None = None) -> Refusal:
        return Refusal(self.kind, "no experiment capacity; closing")

    def capture(self, experiment_id: str, *args: Any) -> Refusal:
        return Refusal(self.kind, "no experiment capacity; closing")


@pytest.mark.parametrize("kind", [Kind.NOT_FOUND, Kind.CONFLICT, Kind.RATE_LIMITED])
@pytest.mark.parametrize("path", ["/rankscope/v1/report", "/rankscope/v1/captures"])
def test_control_routes_answer_a_querys_refusal_by_its_kind(kind: Kind, path: str) -> None:
    async def call(fn: Any, *args: Any) -> Any:
        return fn(*args)

    async def body(request: web.BaseRequest) -> bytes:
        return b'{"experiment": "capacity-test"}'

    port = _Port(kind)
    control = ControlRoutes(Control(port, port), Keys(), call, body)  # type: ignore[arg-type]
    with pytest.raises(HttpError) as refused:
        asyncio.run(control.handle(make_mocked_request("POST", path)))
    assert refused.value.kind is kind and refused.value.status == ANSWERS[kind].http
