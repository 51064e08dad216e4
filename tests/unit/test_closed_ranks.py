"""Flush markers merged into rank sets (``rankscope.flush.ranks``, as the Collector's merge processor
sends them): read at the sink's edge, kept per group without a process per rank, the missing ranks
named by their group and rank, logged and replayed whole."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.core import names as attr
from rankscope.core.anomalies import Corrected
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.markers import MAX_SPANS, Marker, Ranks, decode_ranks, format_spans, parse_spans
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import Limits, Refusals, decode_record, encode_record, metrics_batches

from .test_sink_steps import Clock, ingest, metrics, resource, values_of

MERGER = {
    attr.EXPERIMENT_ID: "x",
    attr.SERVICE_INSTANCE_ID: "rankscope-merge/gateway",
    attr.SERVICE_NAME: "rankscope-merge",
    attr.EXPERIMENT_ATTEMPT: 0,
    attr.MERGED: True,
}
SETS = {**MERGER, attr.MERGE_PART: "ranks"}
"""The resource a merger's rank sets travel on, after its window's states."""


def rank_sets(step: int, *sets: tuple[str, str | None, int, str], start: int = 0) -> pb.Metric:
    """A merger's ``rankscope.flush.ranks``: one point per (role, replica, world size, ranks)."""
    m = pb.Metric(name=attr.FLUSH_RANKS)
    for role, replica, world, ranks in sets:
        attributes = [key_value(attr.STEP, step), key_value(attr.ROLE, role), key_value(attr.WORLD_SIZE, world)]
        if replica is not None:
            attributes.append(key_value(attr.REPLICA, replica))
        attributes.append(key_value(attr.RANKS, ranks))
        m.sum.data_points.add(as_int=1, attributes=attributes, time_unix_nano=5, start_time_unix_nano=start)
    return m


def send(e: StepBook, *resources: tuple[dict[str, Any], list[Any]]) -> Refusals:
    """One request of ``resources`` (in order, as a merger's window) through the edge into ``e``."""
    request = mpb.ExportMetricsServiceRequest()
    for res, ms in resources:
        request.resource_metrics.add(resource=encode_resource(res)).scope_metrics.add().metrics.extend(ms)
    refused = Refusals()
    for batch in metrics_batches(request, Limits(), refused):
        e.apply(batch, refused)
    return refused


def seen(view: Any) -> dict[str, float]:
    """The step's ``n`` and how many it counts missing."""
    got = values_of(view)
    return {"n": got["n"], attr.MISSING_PROCESSES: got[attr.MISSING_PROCESSES]}


def merged(step: int, total: float) -> list[Any]:
    """The states a merger sends for ``step`` (no marker: its ranks' markers travel as rank sets)."""
    return metrics({"n": (Reduce.SUM, [total])}, step=step, marker=False)


# -- the wire form ------------------------------------------------------------------------------


@given(st.sets(st.integers(0, 999), min_size=1))
def test_ranks_written_as_ranges_read_back_as_the_same_ranks(ranks: set[int]) -> None:
    ordered = sorted(ranks)
    spans: list[tuple[int, int]] = []
    for r in ordered:
        if spans and spans[-1][1] == r - 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    text = format_spans(tuple(spans))
    assert parse_spans(text, 1000) == tuple(spans)
    assert Ranks("t", None, 1000, tuple(spans)).count == len(ranks)


@given(st.text(max_size=40))
def test_any_text_as_ranks_is_read_or_refused_with_a_reason_never_raises(text: str) -> None:
    found = parse_spans(text, 64)
    assert isinstance(found, str) or all(0 <= a <= b < 64 for a, b in found)


def test_ranks_that_are_not_ascending_apart_and_inside_the_group_are_refused() -> None:
    for text in ("", ",", "0-3,4", "3-1", "0-16", "16", "-1", "1-", "a", "0,0", "2,1", " 1", "+1", "1" * 9, "٣"):
        assert isinstance(parse_spans(text, 16), str), text
    assert isinstance(parse_spans(",".join(str(2 * i) for i in range(MAX_SPANS + 1)), 1 << 20), str)
    good = {attr.STEP: 1, attr.ROLE: "trainer", attr.WORLD_SIZE: 8, attr.RANKS: "0-7"}
    assert decode_ranks(good) == Marker(1, 0, False, 0, Ranks("trainer", None, 8, ((0, 7),)))
    for bad in (
        {attr.STEP: None},
        {attr.STEP: -1},
        {attr.ROLE: ""},
        {attr.ROLE: "a\nb"},
        {attr.ROLE: 7},
        {attr.REPLICA: "\u202e"},
        {attr.WORLD_SIZE: 0},
        {attr.WORLD_SIZE: True},
        {attr.WORLD_SIZE: (1 << 20) + 1},
        {attr.RANKS: None},
        {attr.RANKS: "0-8"},
    ):
        assert isinstance(decode_ranks({**good, **bad}), str), bad


def test_a_marker_of_ranks_is_logged_and_replayed_whole() -> None:
    marker = Marker(3, 0, False, 9, Ranks("trainer", "1", 1000, ((0, 499), (501, 999))))
    plain = Marker(3, 2, True, 9)
    _, _, _, markers, _ = decode_record(encode_record(b"d", {}, [], [marker, plain]))
    assert [Marker.of_record(m) for m in markers] == [marker, plain]
    assert Marker.of_record((3, 0, False)) == Marker(3, 0, False)  # a record from before times


# -- the sink's book ----------------------------------------------------------------------------


def test_a_step_waits_for_every_rank_of_its_group_and_names_the_missing_one_by_rank() -> None:
    clock = Clock()
    e = StepBook("x", BookConfig(grace=2), clock=clock)
    refused = send(e, (MERGER, [*merged(0, 10.0), rank_sets(0, ("trainer", None, 1000, "0-499,501-999"))]))
    assert refused.count == 0, refused.reasons
    assert e.ready() == [] and e.readiness.missing(0) == ["trainer_r500"]
    assert len(e.roster.processes) == 1  # the merger, not a process per rank
    send(e, (MERGER, [rank_sets(0, ("trainer", None, 1000, "500"))]))
    (view,) = e.ready()
    assert seen(view) == {"n": 10.0, attr.MISSING_PROCESSES: 0.0}
    assert e.roster.ranks() == 1000


@pytest.mark.parametrize("reduce", [Reduce.SUM, Reduce.MAX])  # a merge's MAX rows are kept for no spread
def test_the_first_step_through_a_tree_waits_for_its_window_s_rank_sets(reduce: Reduce) -> None:
    """A window's rank sets come after its states, and the sink takes a request's resources one by
    one: the finalizer once made a run's first step final between them (nobody had closed a step,
    so nobody was absent), with one rank's values of six, and the rest came as a late update."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=2), clock=clock)
    own = resource("p2", rank=2, world=4)  # a per-rank key passed through the merge, no marker of its own
    states = metrics({"n": (reduce, [6.0])}, step=0, marker=False)
    send(e, (MERGER, states), (own, metrics({"n2": (Reduce.SUM, [2.0])}, step=0, marker=False)))
    assert e.ready() == []  # the window's rank sets are still to come
    send(e, (SETS, [rank_sets(0, ("trainer", None, 4, "0-3"))]))
    (view,) = e.ready()
    assert seen(view) == {"n": 6.0, attr.MISSING_PROCESSES: 0.0} and not view.late
    send(e, (MERGER, merged(1, 6.0)))
    assert e.ready() == [] and e.readiness.missing(1) == ["trainer_r0", "trainer_r1", "trainer_r2", "trainer_r3"]
    clock.now = 2.5  # the rank sets never come: final by the grace, as any step waiting for someone
    (view,) = e.ready()
    assert view.step == 1 and values_of(view)[attr.MISSING_PROCESSES] == 4.0


def test_a_runs_first_step_is_timed_from_a_processs_own_marker_only() -> None:
    """A process's first marker says when its step began (its start): the run's first step is timed
    from it. A merger's rank sets hold their ranks' earliest start, on other hosts' clocks: not used."""
    s = 10**9
    own = StepBook("x", BookConfig(grace=2), clock=Clock())
    ingest(own, resource("p0"), metrics({"n": (Reduce.SUM, [1.0])}, step=0, at=10 * s, start=4 * s))
    (view,) = own.ready()
    assert view.duration == 6.0 and view.from_start
    ingest(own, resource("p0"), metrics({"n": (Reduce.SUM, [1.0])}, step=1, at=12 * s, start=10 * s))
    (view,) = own.ready()
    assert view.duration == 2.0 and not view.from_start
    for hostile in (2**64 - 1, 10 * s + 1):  # a start past the close: taken, never believed
        book = StepBook("x", BookConfig(grace=2), clock=Clock())
        ingest(book, resource("p0"), metrics({"n": (Reduce.SUM, [1.0])}, step=0, at=10 * s, start=hostile))
        (view,) = book.ready()
        assert view.duration is None and not view.from_start and values_of(view)["n"] == 1.0
    tree = StepBook("x", BookConfig(grace=2), clock=Clock())
    send(tree, (MERGER, [*merged(0, 4.0), rank_sets(0, ("trainer", None, 4, "0-3"), start=1)]))
    (view,) = tree.ready()
    assert view.duration is None and not view.from_start


def test_a_merges_states_without_rank_sets_are_final_by_the_grace() -> None:
    clock = Clock()
    e = StepBook("x", BookConfig(grace=2), clock=clock)
    send(e, (MERGER, merged(0, 6.0)))
    assert e.ready() == []
    clock.now = 2.5
    (view,) = e.ready()
    assert seen(view) == {"n": 6.0, attr.MISSING_PROCESSES: 0.0}


def test_a_rank_named_missing_is_not_waited_for_again_until_a_rank_set_names_it() -> None:
    clock = Clock()
    e = StepBook("x", BookConfig(grace=2), clock=clock)
    send(e, (MERGER, [*merged(0, 1.0), rank_sets(0, ("trainer", "0", 4, "0-2"), ("generator", None, 1, "0"))]))
    clock.now = 2.5
    (view,) = e.ready()
    assert view.missing == ["trainer_0_r3"] and values_of(view)[attr.MISSING_PROCESSES] == 1.0
    send(e, (MERGER, [*merged(1, 1.0), rank_sets(1, ("trainer", "0", 4, "0-2"), ("generator", None, 1, "0"))]))
    (view,) = e.ready()  # the dead rank costs one grace period, not one per step
    assert view.step == 1 and view.missing == ["trainer_0_r3"]
    send(e, (MERGER, [*merged(2, 1.0), rank_sets(2, ("trainer", "0", 4, "0-3"))]))
    send(e, (MERGER, [*merged(3, 1.0), rank_sets(3, ("trainer", "0", 4, "0-2"), ("generator", None, 1, "0"))]))
    assert e.readiness.missing(3) == ["trainer_0_r3"]  # it came back: waited for again


def test_a_late_rank_set_merges_the_ranks_data_and_says_they_arrived() -> None:
    """Through a tree a late rank's states come merged, then its rank set: the late update is the
    exact total and names the rank as arrived, counting nobody missing."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=1), clock=clock)
    send(e, (MERGER, [*merged(0, 6.0), rank_sets(0, ("trainer", None, 4, "0-2"))]))
    clock.now = 1.5
    (first,) = e.ready()
    assert seen(first) == {"n": 6.0, attr.MISSING_PROCESSES: 1.0}
    send(e, (MERGER, merged(0, 4.0)), (SETS, [rank_sets(0, ("trainer", None, 4, "3"))]))  # as a window is built
    (update,) = [e.view(done) for done in e.late(force=True)]
    assert update.late and seen(update) == {"n": 10.0, attr.MISSING_PROCESSES: 0.0}
    assert update.anomalies == [Corrected(step=0, processes=("trainer_r3",), count=1, missing=0)]


def test_ranks_through_a_tree_and_a_process_of_their_own_fill_one_group() -> None:
    """A rank that sends straight to the sink (its own markers) and ranks merged by a Collector
    hold the slots of one group together; the run is finished once all said goodbye."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=5), clock=clock)
    own = resource("p3", rank=3, world=4)
    send(e, (MERGER, [*merged(0, 3.0), rank_sets(0, ("trainer", None, 4, "0-2"))]))
    assert e.readiness.missing(0) == ["trainer_r3"]
    send(e, (own, metrics({"n": (Reduce.SUM, [1.0])}, step=0)))
    (view,) = e.ready()
    assert seen(view) == {"n": 4.0, attr.MISSING_PROCESSES: 0.0}
    assert e.roster.ranks() == 4 and e.roster.counts() == (1, 1)


def test_a_run_declares_at_most_max_rank_slots_through_rank_sets_too() -> None:
    from rankscope.sink.testing import ExperimentLimits

    clock = Clock()
    e = StepBook("x", BookConfig(grace=1, limits=ExperimentLimits(max_rank_slots=100)), clock=clock)
    refused = send(e, (MERGER, [*merged(0, 1.0), rank_sets(0, ("trainer", None, 1 << 20, "0-9,1000-1048575"))]))
    assert refused.count == 0
    assert len(e.readiness.missing(0)) == 90  # ranks 10-99 of the 100 slots kept; past them not kept
    clock.now = 1.5
    (view,) = e.ready()
    assert values_of(view)[attr.MISSING_PROCESSES] == 90.0


def test_a_rank_set_that_does_not_read_is_refused_with_its_reason() -> None:
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    refused = send(e, (MERGER, [*merged(0, 1.0), rank_sets(0, ("trainer", None, 4, "0-4"))]))
    assert refused.count == 1 and "rankscope.flush.ranks: bad merged flush marker" in refused.message


def test_rank_sets_come_from_a_merge_only_and_a_request_holds_at_most_max_spans_ranges() -> None:
    """A process names itself in its own markers; and a request's text cannot become millions of
    ranges in memory (each ``0,2,4,...`` range is two bytes on the wire)."""
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    own = resource("p0", rank=0, world=4)
    refused = send(e, (own, [rank_sets(0, ("trainer", None, 4, "0-3"))]))
    assert refused.count == 1 and "only a Collector's merge sends rank sets" in refused.message
    world = 1 << 20
    scattered = ",".join(str(2 * i) for i in range(40_000))
    refused = send(e, (SETS, [rank_sets(0, ("trainer", None, world, scattered), ("trainer", "1", world, scattered))]))
    assert refused.count == 1 and f"more than {MAX_SPANS} ranges in one request" in refused.message
    assert e.roster.ranks() == 40_000  # the first set, kept


def test_a_new_group_past_the_runs_rank_slots_is_counted_not_kept() -> None:
    from rankscope.sink.testing import ExperimentLimits

    e = StepBook("x", BookConfig(grace=1, limits=ExperimentLimits(max_rank_slots=8)), clock=Clock())
    send(e, (SETS, [rank_sets(0, ("trainer", None, 8, "0-7"))]))
    send(e, (SETS, [rank_sets(0, *[(f"role{i}", None, 1, "0") for i in range(100)])]))
    assert e.roster.unplaced_rank_sets == 100 and e.roster.ranks() == 8


def test_a_restart_forgets_the_earlier_attempts_rank_sets() -> None:
    e = StepBook("x", BookConfig(grace=1), clock=Clock())
    send(e, (SETS, [rank_sets(0, ("trainer", None, 1000, "0-999"))]))
    again = {**SETS, attr.EXPERIMENT_ATTEMPT: 1}
    send(e, (again, [rank_sets(0, ("trainer", None, 4, "0-3"))]))
    assert e.roster.attempt == 1 and e.roster.ranks() == 4
    assert [size for _, size in e.roster.closed.groups(0)] == []
