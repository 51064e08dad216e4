"""States survive the trip through the OTel SDK's OTLP encoder and back, for every reduce type."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankscope import Reduce
from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource
from rankscope.otlp.metrics import PointAttributes, decode, encode

from .test_reduce import WordCount

VALUES = [3.0, -1.5, 0.0, 250.0, 7.25, math.inf, 1e-3]


def _roundtrip(reduce: Reduce, values: list[float], step: int | None = 4) -> list:
    acc = reduce.accumulator_class(reduce)
    for v in values:
        acc.append(v)
    metric = encode("train/loss", acc, step, 1, 2, PointAttributes())
    assert metric is not None
    sent = ExportMetricsServiceRequest()
    sent.resource_metrics.add(resource=encode_resource({attr.RANK: "3"})).scope_metrics.add().metrics.append(metric)
    request = ExportMetricsServiceRequest()
    request.ParseFromString(sent.SerializeToString())
    points = list(decode(request))
    for p in points:
        assert p.key == "train/loss" and p.reduce == reduce.value and p.step == step
        assert p.resource[attr.RANK] == "3"
    return [acc.get_state(), [p.state for p in points]]


@pytest.mark.parametrize("name", ["mean", "sum", "max", "min", "std", "count", "last", "distribution"])
def test_builtin_states_roundtrip(name: str) -> None:
    reduce = Reduce.get(name)
    sent, received = _roundtrip(reduce, VALUES)
    assert len(received) == 1
    cls = reduce.accumulator_class
    want, got = cls.get_reduced_value_from_states([sent]), cls.get_reduced_value_from_states(received)
    if not isinstance(want, dict):
        want, got = {"value": want}, {"value": got}
    assert want.keys() == got.keys()
    for k in want:  # std of values holding inf is nan on both sides
        assert got[k] == want[k] or (math.isnan(got[k]) and math.isnan(want[k])), k


def test_custom_state_roundtrip_and_step_absent() -> None:
    reduce = Reduce.register("above_ten", WordCount)
    sent, received = _roundtrip(reduce, [11, 12, 1], step=None)
    assert received == [{"reduction_type": "above_ten", "hits": 2}] == [sent]


def test_foreign_metrics_are_skipped() -> None:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "someone.elses"
    metric.gauge.data_points.add().as_double = 1.0
    assert list(decode(request)) == []
