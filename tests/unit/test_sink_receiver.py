"""The sink's OTLP body rules (paths, content types, encodings, sizes, OTLP/JSON's hex ids) as pure
functions, without sockets.

The receiver's answers over real sockets are ``tests/integration/test_sink_receiver.py``."""

from __future__ import annotations

import gzip

import pytest

from rankscope.sink import Limits
from rankscope.sink.testing import (
    ANSWERS,
    HttpError,
    Kind,
    Refusals,
    RefusedError,
    decode_body,
    hex_ids_to_base64,
    logs_batches,
    metrics_batches,
    traces_parts,
)


def test_body_rules_without_sockets() -> None:
    with pytest.raises(HttpError) as e:
        decode_body("/v1/metrics", "text/plain", None, b"x", 100)
    assert e.value.status == 415
    # a protobuf body is decoded by the sink's edge, under its bounds: undecodable, it is answered 400 there
    for path, check in (("/v1/metrics", metrics_batches), ("/v1/traces", traces_parts), ("/v1/logs", logs_batches)):
        request = decode_body(path, "application/x-protobuf", None, b"\xff\xff\xff", 100).request
        with pytest.raises(RefusedError) as refused:
            check(request, Limits(), Refusals())
        assert refused.value.kind == Kind.BAD_REQUEST and ANSWERS[refused.value.kind].http == 400
    with pytest.raises(HttpError) as e:
        decode_body("/v1/metrics", "application/x-protobuf", "gzip", gzip.compress(b"\0" * 1000), 100)
    assert e.value.status == 413
    with pytest.raises(HttpError) as e:
        decode_body("/v1/nope", "application/x-protobuf", None, b"", 100)
    assert e.value.status == 404
    assert hex_ids_to_base64({"spans": [{"traceId": "00ff", "name": "x"}]}) == {
        "spans": [{"traceId": "AP8=", "name": "x"}]
    }
