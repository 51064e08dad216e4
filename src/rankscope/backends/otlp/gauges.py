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

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

from ..._version import __version__
from ...core import names as attr

PREFIX = "rankscope."
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
    """Encodes the steps of one run (its experiment and run id fixed)."""

    def __init__(self, experiment: str, run: str) -> None:
        self._labels = [_label("experiment", experiment), _label("run", run)]
        self._names: dict[str, str] = {}

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
        self._add(metrics, STEP, float(step), (), time_unix_nano)
        if step_seconds is not None:
            self._add(metrics, STEP_SECONDS, step_seconds, (), time_unix_nano)
        for key, value in values:
            name = self._names.get(key)
            if name is None:
                name = self._names[key] = gauge_name(key)
            role = roles.get(key)
            extra = (_label("key", key), _label("role", role)) if role else (_label("key", key),)
            self._add(metrics, name, value, extra, time_unix_nano)
        return bytes(request.SerializeToString()), len(metrics)

    def _add(self, metrics: object, name: str, value: float, extra: tuple[KeyValue, ...], when: int) -> None:
        metric: Metric = metrics.add()  # type: ignore[attr-defined]
        metric.name = name
        point: NumberDataPoint = metric.gauge.data_points.add()
        point.as_double = value
        point.time_unix_nano = when
        point.attributes.extend(self._labels)
        point.attributes.extend(extra)
