"""Running merges (``sink.book.merge``) against the reduce types' own list reduction, and the raw wire view.

The sink keeps one running state per (step, key) instead of every process's state. For every
built-in reduce type, merging any split of the values, row by row in any order of processes,
must give exactly what ``get_reduced_value_from_states`` gives over the list of states (the
values the sink used to compute), NaN and infinities included. MAX/MIN also name the holder:
NaN first, then the lowest rank.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb

from rankscope.core import names as attr
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import attributes, encode_resource
from rankscope.otlp.metrics import PointAttributes, decode, encode, row_of
from rankscope.otlp.raw import RawExportMetricsServiceRequest, decode_attributes
from rankscope.sink.testing import holder, merge_rows, merge_state, reduced

BUILTIN = ["mean", "sum", "max", "min", "std", "count", "last", "distribution"]

EXACT = sys.version_info < (3, 12)
"""Python 3.12's ``sum()`` of floats is compensated; a running ``+=`` (and 3.11's sum) is not: there
the two agree to rounding, and cancelling huge values are left out."""

values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan] + ([1e300, -1e300] if EXACT else [])),
)

dyadic = st.one_of(
    st.integers(-(2**20), 2**20).map(lambda n: n / 4),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan]),
)
"""Values whose sums are exact in any grouping: two groups' states merged add in another order
than one group's rows (1.0, 1e300, -1e300: 0 one way, 1 the other, as any float sum would)."""


def state_of(kind: Reduce, numbers: list[float]) -> Any:
    """One process's state of ``numbers`` under ``kind``."""
    acc = kind.accumulator_class(kind)
    for v in numbers:
        acc.append(v)
    return acc.get_state()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b or (a != a and b != b) or (not EXACT and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6))


@settings(max_examples=300, deadline=None)
@given(
    reduce=st.sampled_from(BUILTIN),
    processes=st.lists(st.lists(values, min_size=1, max_size=6), min_size=1, max_size=6),
)
def test_running_merge_equals_the_list_reduction(reduce: str, processes: list[list[float]]) -> None:
    kind = Reduce.get(reduce)
    states = [state_of(kind, numbers) for numbers in processes]
    into: dict[str, Any] = {}
    for rank, state in enumerate(states):
        merge_rows(into, reduce, ["k"], [row_of(reduce, state)], rank, f"r{rank}")
    expected = kind.accumulator_class.get_reduced_value_from_states(states)
    assert same(reduced(reduce, into["k"]), expected), (reduced(reduce, into["k"]), expected)


@settings(max_examples=300, deadline=None)
@given(
    reduce=st.sampled_from(BUILTIN),
    processes=st.lists(st.lists(dyadic, min_size=1, max_size=6), min_size=2, max_size=6),
    cut=st.integers(1, 5),
)
def test_two_steps_running_states_merged_equal_their_rows_merged_in_one(
    reduce: str, processes: list[list[float]], cut: int
) -> None:
    """``merge_state`` (time buckets carried into a run's first step): the states of two groups of
    processes merged equal every process's rows merged into one state."""
    kind = Reduce.get(reduce)
    rows = [row_of(reduce, state_of(kind, numbers)) for numbers in processes]
    cut = min(cut, len(rows) - 1)
    whole: dict[str, Any] = {}
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    for rank, row in enumerate(rows):
        merge_rows(whole, reduce, ["k"], [row], rank, f"r{rank}")
        merge_rows(first if rank < cut else second, reduce, ["k"], [row], rank, f"r{rank}")
    merge_state(first, "k", second["k"])
    got, want = reduced(reduce, first["k"]), reduced(reduce, whole["k"])
    assert same(got, want) or (reduce == "std" and math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12))
    if reduce in ("max", "min"):
        assert holder(first["k"]) == holder(whole["k"])


def test_otel_and_custom_states_merged_equal_their_rows_merged_in_one() -> None:
    """The plain-OTel derived states (gauge and up-down per stream, explicit and exponential
    histograms) and a custom type's list merge by ``merge_state`` as their rows would."""
    exponential = [
        {"scale": 3, "count": 2, "sum": 3.0, "zero_count": 0, "min": 1.0, "max": 2.0}
        | {"positive": {8: 1, 0: 1}, "negative": {}},
        {"scale": 1, "count": 1, "sum": -4.0, "zero_count": 1, "min": -4.0, "max": 0.0}
        | {"positive": {}, "negative": {4: 1}},
    ]
    cases = {
        "otel.gauge": [(1.0, 10), (2.0, 20), (3.0, 15)],
        "otel.updown": [(5.0, 10), (-1.0, 30)],
        "otel.histogram": [
            ((1.0, 2.0), (1, 0, 2), 3, 7.5, 0.5, 3.0),
            ((1.0, 2.0, 5.0), (0, 1, 1, 0), 2, 5.0, 1.5, 4.0),
        ],
        "otel.exponential": [(state,) for state in exponential],
        "my_reduce": [({"a": 1},), ({"a": 2},), ({"a": 3},)],
    }
    for reduce, rows in cases.items():
        whole: dict[str, Any] = {}
        first: dict[str, Any] = {}
        second: dict[str, Any] = {}
        for i, row in enumerate(rows):
            label = f"r{i % 2}"
            merge_rows(whole, reduce, ["k"], [row], i, label)
            merge_rows(first if i == 0 else second, reduce, ["k"], [row], i, label)
        merge_state(first, "k", second["k"])
        assert first["k"] == whole["k"], (reduce, first["k"], whole["k"])


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=12), st.sampled_from(["max", "min"]))
def test_extreme_holder_is_nan_first_then_lowest_rank(per_rank: list[float], reduce: str) -> None:
    into: dict[str, Any] = {}
    order = list(range(len(per_rank)))[::-1]  # arrival order must not matter
    for rank in order:
        merge_rows(into, reduce, ["k"], [(per_rank[rank], None, None)], rank, f"r{rank}")
    nans = [r for r, v in enumerate(per_rank) if v != v]
    if nans:
        want = nans[0]
    else:
        best = max(per_rank) if reduce == "max" else min(per_rank)
        want = per_rank.index(best)
    assert holder(into["k"]) == (want, f"r{want}")


def test_a_collectors_holder_is_kept_and_unlabelled_holders_get_a_rank_label() -> None:
    into: dict[str, Any] = {}
    merge_rows(into, "max", ["k", "j"], [(5.0, 7, "trainer_r7"), (1.0, 3, None)], 0, "rankscope-merge-a")
    merge_rows(into, "max", ["k", "j"], [(5.0, 9, "trainer_r9"), (0.5, 1, None)], 0, "rankscope-merge-b")
    assert holder(into["k"]) == (7, "trainer_r7") and holder(into["j"]) == (3, "rank 3")


def test_distribution_states_at_finer_scales_merge_as_the_list_does() -> None:
    kind = Reduce.DISTRIBUTION
    acc = kind.accumulator_class(kind)
    for v in (0.5, 1.5, 2.5, -3.0, 0.0, 1e-9):
        acc.append(v)
    coarse = acc.get_state()
    fine = {**coarse, "scale": 8, "positive": {i * 4 + 1: n for i, n in coarse["positive"].items()}}
    fine["negative"] = {i * 4 + 3: n for i, n in coarse["negative"].items()}
    into: dict[str, Any] = {}
    for rank, state in enumerate([fine, coarse, fine]):
        merge_rows(into, "distribution", ["d"], [row_of("distribution", state)], rank, "x")
    expected = kind.accumulator_class.get_reduced_value_from_states([fine, coarse, fine])
    assert same(reduced("distribution", into["d"]), expected)


def test_the_raw_view_is_wire_identical_and_decodes_as_the_real_message() -> None:
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(resource=encode_resource({attr.EXPERIMENT_ID: "x", attr.RANK: "3"}))
    scope = rm.scope_metrics.add()
    cache = PointAttributes()
    for i, reduce in enumerate(BUILTIN):
        kind = Reduce.get(reduce)
        acc = kind.accumulator_class(kind)
        acc.append(float(i) + 0.5)
        metric = encode(f"k{i}", acc, 4, 1, 2, cache)
        assert metric is not None
        scope.metrics.append(metric)
    body = request.SerializeToString()
    raw = RawExportMetricsServiceRequest.FromString(body)
    assert raw.SerializeToString() == body
    for real_metric, raw_metric in zip(scope.metrics, raw.resource_metrics[0].scope_metrics[0].metrics, strict=True):
        kind = real_metric.WhichOneof("data")
        real_point = getattr(real_metric, kind).data_points[0]
        raw_point = getattr(raw_metric, kind).data_points[0]
        assert decode_attributes(raw_point.attributes) == attributes(real_point.attributes)
    decoded = {p.key: (p.reduce, p.step) for p in decode(request)}
    assert decoded == {f"k{i}": (reduce, 4) for i, reduce in enumerate(BUILTIN)}


def test_the_smallest_double_s_bucket_reduces_without_error() -> None:
    """The edge admits bucket indices down to the smallest double's; its percentile underflows to 0."""
    kind = Reduce.DISTRIBUTION
    acc = kind.accumulator_class(kind)
    acc.append(5e-324)  # 2**-1074
    state = acc.get_state()
    assert min(state["positive"]) == -1074 * 64 - 1
    into: dict[str, Any] = {}
    merge_rows(into, "distribution", ["d"], [row_of("distribution", state)], 0, "x")
    value = reduced("distribution", into["d"])
    assert isinstance(value, dict) and value["p50"] == 5e-324
    far = {**state, "positive": {-1075 * 64: 1}, "min": 0.0, "max": 1.0}  # past it: refused at the edge
    assert kind.accumulator_class.get_reduced_value_from_states([far])["p50"] == 0.0
