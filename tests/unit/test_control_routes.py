"""The sink's control routes and its one token check, without a socket (aiohttp's mocked requests
against a sink that was never started: no port is opened)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from rankscope.sink import Sink, SinkConfig, Transport
from rankscope.sink.testing import Control, ControlRoutes, HttpError, Keys, authorized


def test_the_token_check_takes_any_case_of_bearer_and_nothing_else() -> None:
    assert authorized(None, None)  # a sink without a token takes anyone
    assert authorized("s3cret", "Bearer s3cret") and authorized("s3cret", "bearer  s3cret ")
    assert not authorized("s3cret", None) and not authorized("s3cret", "")
    assert not authorized("s3cret", "Bearer s3cre") and not authorized("s3cret", "Basic s3cret")
    assert not authorized("s3cret", "Bearer s3cret2")


def routes(token: str | None = "t") -> ControlRoutes:
    sink = Sink(SinkConfig(grpc_port=None, http_port=None, transport=Transport(token=token)))

    async def call(fn: Any, *args: Any) -> Any:
        return fn(*args)

    async def body(request: web.BaseRequest) -> bytes:
        return bytes(request._payload_for_test)  # type: ignore[attr-defined]

    return ControlRoutes(Control(sink.queries, sink.commands), Keys(sink.config.transport.token), call, body)


def ask(
    control: ControlRoutes, method: str, path: str, token: str | None = "t", payload: bytes = b""
) -> web.StreamResponse:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = make_mocked_request(method, path, headers=headers)
    request._payload_for_test = payload  # type: ignore[attr-defined]
    return asyncio.run(control.handle(request))


def refused(control: ControlRoutes, method: str, path: str, **kwargs: Any) -> HttpError:
    with pytest.raises(HttpError) as error:
        ask(control, method, path, **kwargs)
    return error.value


def test_health_needs_no_token_every_other_route_does() -> None:
    control = routes()
    answer = ask(control, "GET", "/healthz", token=None)
    assert isinstance(answer, web.Response) and answer.status == 200 and answer.text == "ok\n"
    for method, path in control.routes:
        assert refused(control, method, path, token=None).status == 401
        assert refused(control, method, path, token="wrong").status == 401


def test_routes_answer_what_they_know_and_name_what_they_do_not() -> None:
    control = routes()
    overview = ask(control, "GET", "/rankscope/v1/status")
    assert isinstance(overview, web.Response) and json.loads(overview.text or "")["experiments"] == 0
    missing = refused(control, "GET", "/rankscope/v1/status?experiment=nope")
    assert missing.status == 404 and "no experiment 'nope'" in missing.message
    assert refused(control, "GET", "/rankscope/v1/nothing").status == 404
    assert refused(control, "DELETE", "/rankscope/v1/status").status == 405
    assert refused(control, "POST", "/rankscope/v1/config", payload=b"{not json").status == 400
    bad = refused(control, "POST", "/rankscope/v1/captures", payload=b'{"experiment": "x", "steps": true}')
    assert bad.status == 400 and "steps an int" in bad.message
    configured = ask(control, "POST", "/rankscope/v1/config", payload=b'{"experiment": "x", "backends": {}}')
    assert isinstance(configured, web.Response) and json.loads(configured.text or "") == {"result": "ok"}
