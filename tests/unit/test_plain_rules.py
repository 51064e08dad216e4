"""The rules for plain OTel points, through the sink's edge (``validate``) into an experiment:
cumulative streams into deltas (resets included), exponential histograms merged at the
coarsest scale, explicit histograms of different bounds, series names and their cap, and
what is refused with a reason."""

from __future__ import annotations

import math
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.metrics.reduce import DistributionAccumulator, Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.sink import BookConfig, ExperimentLimits, StepBook
from rankscope.sink.testing import Limits, Refusals, metrics_batches

CUMULATIVE, DELTA = pb.AGGREGATION_TEMPORALITY_CUMULATIVE, pb.AGGREGATION_TEMPORALITY_DELTA


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def send(e: StepBook, pid: str, *metrics: pb.Metric, step: int = 0) -> Refusals:
    """One request of process ``pid``; every point carries ``rankscope.step`` = ``step``."""
    request = mpb.ExportMetricsServiceRequest()
    resource = {"rankscope.experiment.id": "x", "service.instance.id": pid, "rankscope.rank": pid[-1]}
    scope = request.resource_metrics.add(resource=encode_resource(resource)).scope_metrics.add()
    for metric in metrics:
        kind = metric.WhichOneof("data")
        for point in getattr(metric, kind).data_points:
            point.attributes.append(key_value("rankscope.step", step))
        scope.metrics.append(metric)
    refused = Refusals()
    for batch in metrics_batches(request, Limits(), refused):
        e.apply(batch, refused)
    return refused


def view_of(e: StepBook) -> dict[str, float]:
    (view,) = e.ready(force=True)
    return {m.key: m.value for m in view.global_metrics if not m.key.startswith("rankscope/")}


def counter(value: int, start: int, temporality: int = CUMULATIVE, at: int = 0, **attributes: Any) -> pb.Metric:
    m = pb.Metric(name="tokens")
    m.sum.is_monotonic, m.sum.aggregation_temporality = True, temporality
    p = m.sum.data_points.add(as_int=value, start_time_unix_nano=start, time_unix_nano=at or start + 1)
    p.attributes.extend(key_value(k, v) for k, v in attributes.items())
    return m


def test_cumulative_counters_become_per_step_increases_and_a_reset_counts_whole() -> None:
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, "p0", counter(5, start=1), step=0)
    send(e, "p1", counter(7, start=1, temporality=DELTA), step=0)
    assert view_of(e) == {"tokens": 12.0}
    send(e, "p0", counter(9, start=1, at=10), step=1)  # +4
    send(e, "p1", counter(1, start=1, temporality=DELTA), step=1)
    assert view_of(e) == {"tokens": 5.0}
    send(e, "p0", counter(2, start=50), step=2)  # a restart: a new start time, counted from zero
    assert view_of(e) == {"tokens": 2.0}


def test_a_retried_or_reordered_cumulative_point_is_not_counted_twice() -> None:
    """100, 120, then 110 from before (a Collector queue reordered it), then 130: 130 in all."""
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    for value, at in ((100, 10), (120, 20), (110, 15), (120, 20), (130, 30)):
        send(e, "p0", counter(value, start=1, at=at), step=0)
    assert view_of(e) == {"tokens": 130.0} and e.streams.stale == 2


def test_series_are_named_by_attributes_and_capped_with_an_overflow_series() -> None:
    e = StepBook("x", BookConfig(grace=1, limits=ExperimentLimits(max_series=2)), clock=Clock())
    send(e, "p0", *(counter(1, start=1, temporality=DELTA, route=f"/{i}") for i in range(4)), step=0)
    assert view_of(e) == {"tokens{route=/0}": 1.0, "tokens{route=/1}": 1.0, "tokens{otel.metric.overflow=true}": 2.0}
    assert e.streams.overflowed == 2


def exponential(values: list[float], scale: int, temporality: int = DELTA) -> pb.Metric:
    """An OTel ExponentialHistogram point of ``values`` (all positive) at ``scale``."""
    m = pb.Metric(name="latency")
    m.exponential_histogram.aggregation_temporality = temporality
    p = m.exponential_histogram.data_points.add(
        count=len(values), sum=sum(values), scale=scale, min=min(values), max=max(values), time_unix_nano=1
    )
    indexes = [math.ceil(math.log2(v) * 2**scale) - 1 for v in values]
    low = min(indexes)
    counts = [0] * (max(indexes) - low + 1)
    for i in indexes:
        counts[i - low] += 1
    p.positive.offset = low
    p.positive.bucket_counts.extend(counts)
    return m


def test_exponential_histograms_merge_at_the_coarsest_scale() -> None:
    """A scale-3 and a scale-0 histogram: merged at scale 0 by folding the finer one's buckets,
    exactly as a scale-0 histogram of all the values would hold them."""
    first, second = [1.5, 3.0, 5.0, 100.0], [0.3, 7.0, 9.0]
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, "p0", exponential(first, 3), step=0)
    send(e, "p1", exponential(second, 0), step=0)
    got = view_of(e)
    assert got["latency/count"] == 7 and got["latency/sum"] == sum(first + second)
    e2 = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e2, "p0", exponential(first + second, 0), step=0)
    assert view_of(e2) == got


def test_explicit_histograms_interpolate_within_buckets_across_bound_sets() -> None:
    def histogram(bounds: list[float], counts: list[int], low: float, high: float) -> pb.Metric:
        m = pb.Metric(name="wait")
        m.histogram.aggregation_temporality = DELTA
        m.histogram.data_points.add(
            count=sum(counts), sum=0.0, explicit_bounds=bounds, bucket_counts=counts, min=low, max=high
        )
        return m

    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, "p0", histogram([10.0], [50, 0], 0.0, 10.0), step=0)  # 50 values uniform in (0, 10]
    send(e, "p1", histogram([5.0, 20.0], [0, 50, 0], 10.0, 20.0), step=0)  # 50 values in (5, 20]
    got = view_of(e)
    # The CDF: 5x below 10 from the first, 50 (x - 5) / 15 from the second: 50 at x = 8, 90 at x = 17.
    assert got["wait/count"] == 100 and got["wait/p50"] == pytest.approx(8.0, rel=1e-12)
    assert got["wait/p90"] == pytest.approx(17.0, rel=1e-12)


def test_what_holds_no_mergeable_state_is_refused_with_a_reason() -> None:
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    summary = pb.Metric(name="rpc")
    summary.summary.data_points.add(count=1, sum=1.0)
    bad = pb.Metric(name="wait")
    bad.histogram.aggregation_temporality = DELTA
    bad.histogram.data_points.add(count=1, explicit_bounds=[2.0, 1.0], bucket_counts=[1, 0, 0])
    negative = counter(-1, start=1, temporality=DELTA)
    refused = send(e, "p0", summary, bad, negative, step=0)
    assert refused.count == 3
    assert "Summary points are not taken" in refused.message and "increasing" in refused.message
    assert "cannot be negative" in refused.message


def test_a_scale_0_merge_matches_the_distribution_reducers_percentiles_at_its_scale() -> None:
    """Sanity: the percentiles use the same harmonic bucket midpoints as the DISTRIBUTION reduce."""
    values = [1.0 + i for i in range(100)]
    acc = DistributionAccumulator(Reduce.get("distribution"))
    for v in values:
        acc.append(v)
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, "p0", exponential(values, 6), step=0)
    got = view_of(e)
    expected = DistributionAccumulator.get_reduced_value_from_states([acc.get_state()])
    assert isinstance(expected, dict)
    assert {k: got[f"latency/{k}"] for k in ("p50", "p90", "p99", "mean")} == expected


def test_one_name_as_two_kinds_in_a_step_is_refused_with_both_named() -> None:
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    gauge = pb.Metric(name="tokens")
    gauge.gauge.data_points.add(as_double=1.0)
    refused = send(e, "p0", counter(1, start=1, temporality=DELTA), gauge, step=0)
    assert refused.count == 1 and "tokens: recorded as SUM and as OTel gauge" in refused.message
    assert view_of(e) == {"tokens": 1.0}


def test_open_ended_buckets_without_extremes_answer_as_prometheus_does() -> None:
    """No min/max (the Prometheus receiver sends none): the +Inf bucket is all at the last bound,
    and a quantile that falls in it is that bound, not an interpolation through the jump."""
    m = pb.Metric(name="ttft")
    m.histogram.aggregation_temporality = DELTA
    m.histogram.data_points.add(count=10, sum=0.0, explicit_bounds=[1.0, 2.0], bucket_counts=[0, 5, 5])
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, "p0", m, step=0)
    got = view_of(e)
    assert (got["ttft/p50"], got["ttft/p90"], got["ttft/p99"]) == (2.0, 2.0, 2.0)


@pytest.mark.timeout(60)
def test_percentiles_of_thousands_of_buckets_cost_a_sort_not_a_square() -> None:
    """4,096 bounds on each of 50 keys: one sweep per key. The quadratic scan this replaced took
    seconds per key, minutes here: past the test's time limit."""
    bounds = [float(i) for i in range(1, 4097)]
    metrics = []
    for k in range(50):
        m = pb.Metric(name=f"wide{k}")
        m.histogram.aggregation_temporality = DELTA
        m.histogram.data_points.add(count=4097, sum=0.0, explicit_bounds=bounds, bucket_counts=[1] * 4097)
        metrics.append(m)
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, "p0", *metrics, step=0)
    got = view_of(e)
    assert got["wide0/p50"] == pytest.approx(2048.5, abs=1e-6)
