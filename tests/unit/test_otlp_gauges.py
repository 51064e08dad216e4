"""The otlp view's requests: a gauge per key with its labels, the step a gauge of its own."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankscope import Reduce
from rankscope.backends.base import Metric, make_view
from rankscope.backends.otlp.gauges import Gauges, gauge_name


def _points(payload: bytes) -> dict[tuple[str, str], tuple[float, dict[str, str], int]]:
    """(gauge name, its key label or "") -> (value, labels, time)."""
    request = ExportMetricsServiceRequest.FromString(payload)
    found = {}
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        (point,) = metric.gauge.data_points
        labels = {kv.key: kv.value.string_value for kv in point.attributes}
        found[metric.name, labels.get("key", "")] = (point.as_double, labels, point.time_unix_nano)
    return found


def test_each_key_is_a_gauge_labelled_by_experiment_run_role_and_key_never_by_step() -> None:
    values = [("trainer/loss", 0.5), ("rankscope/missing_processes", 1.0), ("step", 3.0), ("a/b", 1.0), ("a.b", 2.0)]
    payload, n = Gauges("exp", "run-1").request(7, values, {"trainer/loss": "trainer"}, 123, 0.25)
    assert n == 7
    points = _points(payload)
    assert points["rankscope.step", ""] == (7.0, {"experiment": "exp", "run": "run-1"}, 123)  # the sink's: no key
    assert points["rankscope.step", "step"][0] == 3.0  # a key of the user's named step: its own series
    assert points["rankscope.step_seconds", ""][0] == 0.25
    assert points["rankscope.a/b", "a/b"][0] == 1.0 and points["rankscope.a.b", "a.b"][0] == 2.0
    value, labels, when = points["rankscope.trainer/loss", "trainer/loss"]
    assert (value, labels, when) == (
        0.5,
        {"experiment": "exp", "run": "run-1", "key": "trainer/loss", "role": "trainer"},
        123,
    )
    assert points["rankscope.missing_processes", "rankscope/missing_processes"][1] == {
        "experiment": "exp",
        "run": "run-1",
        "key": "rankscope/missing_processes",
    }  # the sink's own key: its prefix once, no role


def test_names() -> None:
    assert gauge_name("loss") == "rankscope.loss"
    assert gauge_name("rankscope/late_points") == "rankscope.late_points"


class _Process:
    def __init__(self, role: str) -> None:
        self.role = role


def test_roles_are_learned_once_from_the_processes_that_record_a_key() -> None:
    view: Any = make_view("otlp", {"endpoint": "http://127.0.0.1:9"})
    trainer, generator = _Process("trainer"), _Process("generator")
    metrics = [
        Metric("loss", 1.0, Reduce.MEAN, 0.0),
        Metric("reward", 2.0, Reduce.MEAN, 0.0),
        Metric("shared", 3.0, Reduce.MEAN, 0.0),
    ]
    per_process = {
        trainer: [metrics[0], metrics[2]],
        generator: [metrics[1], metrics[2]],
    }
    view._learn_roles(metrics, per_process)
    assert view._roles == {"loss": "trainer", "reward": "generator", "shared": "generator,trainer"}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({}, 'needs "endpoint"'),
        ({"endpoint": "127.0.0.1:4327"}, 'needs "endpoint"'),
        ({"endpoint": "http://h:1", "protocol": "udp"}, "grpc or http/protobuf"),
        ({"endpoint": "http://h:1", "logging_mode": "per_rank_reduce"}, "global view only"),
        ({"endpoint": "http://h:1", "max_buffered": 1}, "max_buffered >= 2"),
    ],
)
def test_a_bad_option_is_said_where_the_views_are_configured(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match="view 'otlp'") as caught:
        make_view("otlp", options)
    assert says in str(caught.value)
