"""A step's merged values as one OTLP metrics request: a gauge per key, the step a gauge of its own.

Names: a key ``K`` is the gauge ``rankscope.K`` (the sink's own ``rankscope/X`` keys are
``rankscope.X``); Prometheus' translation makes ``trainer/loss`` ``rankscope_trainer_loss``.
Each point carries the attributes ``experiment``, ``run``, ``key`` (the key as recorded: two keys
that one name holds after translation stay two series) and ``role`` (the roles whose processes
recorded it, when known), never the step: a label per step would make a series per step. The
step is the gauge ``rankscope.step``, and the step's time the gauge ``rankscope.step_seconds``;
every point's time is when the sink finalized the step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

from ..._version import __version__
from ...core import names as attr

PREFIX = attr.NAMESPACE
STEP = PREFIX + "step"
STEP_SECONDS = PREFIX + "step_seconds"


def gauge_name(key: str) -> str:
    """The gauge of key ``key`` (``rankscope/missing_processes`` is ``rankscope.missing_processes``)."""
    return PREFIX + (key[len(attr.META_PREFIX) :] if key.startswith(attr.META_PREFIX) else key)


def _label(name: str, value: str) -> KeyValue:
    found = KeyValue(key=name)
    found.value.string_value = value
    return found


class Gauges:
    """Encodes the steps of one run (its experiment and run id fixed). Each key's gauge, its name and
    labels set, is made once and copied into each step's request (a copy in protobuf's C code costs
    a fraction of setting the fields again), only the value and time set per step."""

    def __init__(self, experiment: str, run: str) -> None:
        self._labels = [_label("experiment", experiment), _label("run", run)]
        self._made: dict[tuple[str, str], Metric] = {}
        """(key or gauge name, role) -> the gauge with its name and labels, its value unset."""

    def request(
        self,
        step: int,
        values: Iterable[tuple[str, float]],
        roles: Mapping[str, str],
        time_unix_nano: int,
        step_seconds: float | None,
    ) -> tuple[bytes, int]:
        """The serialized request of one step (each ``(key, value)`` a gauge, with the step's own)
        and its points."""
        request = ExportMetricsServiceRequest()
        resource = request.resource_metrics.add()
        resource.resource.attributes.append(_label("service.name", "rankscope-sink"))
        scope = resource.scope_metrics.add()
        scope.scope.name = attr.INSTRUMENTATION_SCOPE
        scope.scope.version = __version__
        metrics = scope.metrics
        self._add(metrics, self._made.get((STEP, "")) or self._make(STEP, None, ""), float(step), time_unix_nano)
        if step_seconds is not None:
            made = self._made.get((STEP_SECONDS, "")) or self._make(STEP_SECONDS, None, "")
            self._add(metrics, made, step_seconds, time_unix_nano)
        for key, value in values:
            role = roles.get(key) or ""
            made = self._made.get((key, role)) or self._make(gauge_name(key), key, role)
            self._add(metrics, made, value, time_unix_nano)
        return bytes(request.SerializeToString()), len(metrics)

    def _make(self, name: str, key: str | None, role: str) -> Metric:
        metric = Metric(name=name)
        point: NumberDataPoint = metric.gauge.data_points.add()
        point.attributes.extend(self._labels)
        if key is not None:
            point.attributes.append(_label("key", key))
        if role:
            point.attributes.append(_label("role", role))
        self._made[(name if key is None else key, role)] = metric
        return metric

    @staticmethod
    def _add(metrics: Any, made: Metric, value: float, when: int) -> None:
        metric: Metric = metrics.add()
        metric.CopyFrom(made)
        point = metric.gauge.data_points[0]
        point.as_double = value
        point.time_unix_nano = when
