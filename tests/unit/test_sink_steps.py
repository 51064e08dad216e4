"""Step alignment and exact reduction across processes, as pure functions with an injected clock."""

from __future__ import annotations

import statistics
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.core import names as attr
from rankscope.core.anomalies import Corrected, Interrupted, Partial
from rankscope.metrics.recorder import Recorder
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.metrics import PointAttributes, encode
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import Limits, Refusals, metrics_batches


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def resource(pid: str, rank: int = 0, world: int = 1, role: str = "trainer", **extra: Any) -> dict[str, Any]:
    return {
        attr.EXPERIMENT_ID: "x",
        attr.SERVICE_INSTANCE_ID: pid,
        attr.ROLE: role,
        attr.RANK: str(rank),
        attr.WORLD_SIZE: str(world),
        attr.EXPERIMENT_ATTEMPT: 0,
        **extra,
    }


def metrics(
    values: dict[str, tuple[Reduce, list[float]]], step: int | None, marker: bool = True, at: int = 1, start: int = 0
) -> list[Any]:
    """The points (and flush marker) one process sends; ``at``: their time (ns since 1970); ``start``:
    the marker's (when the step began for the process)."""
    c = Recorder(streams=[])
    for key, (reduce, numbers) in values.items():
        for n in numbers:
            c.record(key, n, reduce)
    out = [encode(k, acc, step, 0, at, PointAttributes()) for k, acc in c.accs.items()]
    if marker and step is not None:
        m = pb.Metric(name=attr.FLUSH_MARKER)
        point = m.sum.data_points.add(as_int=len(values), attributes=[key_value(attr.STEP, step)], time_unix_nano=at)
        point.start_time_unix_nano = start
        out.append(m)
    return out


def ingest(e: StepBook, resource: dict[str, Any], metrics: list[Any]) -> list[Any]:
    """Through the sink's edge (``validate``) into ``e``; returns the late updates now due."""
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(resource=encode_resource(resource))
    rm.scope_metrics.add().metrics.extend(metrics)
    refused = Refusals()
    for batch in metrics_batches(request, Limits(), refused):
        e.apply(batch, refused)
    assert refused.count == 0, refused.reasons
    return [e.view(done) for done in e.late(force=True)]


def values_of(view: Any) -> dict[str, float]:
    return {m.key: m.value for m in view.global_metrics}


def test_exact_merge_across_ranks_and_per_process_values() -> None:
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    data = {0: [1.0, 2.0], 1: [3.0], 2: [4.0, 5.0, 6.0], 3: [7.0]}
    for rank, numbers in data.items():
        ms = metrics(
            {
                "loss": (Reduce.MEAN, numbers),
                "spread": (Reduce.STD, numbers),
                "peak": (Reduce.MAX, numbers),
                "n": (Reduce.SUM, numbers),
            },
            step=0,
        )
        ingest(e, resource(f"p{rank}", rank, 4), ms)
        assert (e.ready() == []) == (rank < 3)  # final exactly when the 4th rank reports
    everything = [v for numbers in data.values() for v in numbers]
    e2 = StepBook("x", BookConfig(grace=5), clock=Clock())
    for rank, numbers in data.items():
        ingest(e2, resource(f"p{rank}", rank, 4), metrics({"loss": (Reduce.MEAN, numbers)}, step=0))
    view = e2.ready()[0]
    assert values_of(view)["loss"] == statistics.fmean(everything)  # weighted by count, not mean of means
    assert [p.label for p in view.per_process] == ["trainer_r0", "trainer_r1", "trainer_r2", "trainer_r3"]
    assert [m.value for ms in view.per_process.values() for m in ms] == [1.5, 3.0, 5.0, 7.0]


def test_pooled_std_max_sum() -> None:
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    data = {0: [1.0, 2.0], 1: [3.0, 10.0]}
    for rank, numbers in data.items():
        ms = metrics({"s": (Reduce.STD, numbers), "m": (Reduce.MAX, numbers), "n": (Reduce.SUM, numbers)}, step=3)
        ingest(e, resource(f"p{rank}", rank, 2), ms)
    (view,) = e.ready()
    got = values_of(view)
    assert view.step == 3
    assert abs(got["s"] - statistics.pstdev([1.0, 2.0, 3.0, 10.0])) < 1e-12
    assert got["m"] == 10.0 and got["n"] == 16.0 and got[attr.MISSING_PROCESSES] == 0.0


def test_missing_process_named_after_grace_then_not_waited_for() -> None:
    clock = Clock()
    e = StepBook("x", BookConfig(grace=2), clock=clock)
    ingest(e, resource("p0", 0, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, step=0))
    assert e.ready() == [] and e.readiness.missing(0) == ["trainer_r1"]
    clock.now = 2.5
    (view,) = e.ready()
    assert view.missing == ["trainer_r1"] and values_of(view)[attr.MISSING_PROCESSES] == 1.0
    ingest(e, resource("p0", 0, 2), metrics({"loss": (Reduce.MEAN, [2.0])}, step=1))
    assert [v.step for v in e.ready()] == [1]  # the dead rank costs one grace period, not one per step


def test_late_point_is_counted_merged_and_written_as_late_update() -> None:
    clock = Clock()
    e = StepBook("x", BookConfig(grace=1), clock=clock)
    ingest(e, resource("p0", 0, 2), metrics({"n": (Reduce.SUM, [1.0])}, step=0))
    clock.now = 1.5
    (first,) = e.ready()
    assert values_of(first)["n"] == 1.0
    late = ingest(e, resource("p1", 1, 2), metrics({"n": (Reduce.SUM, [2.0])}, step=0))
    assert e.counts.late_points == 1
    (update,) = late
    assert update.late and update.step == 0 and values_of(update)["n"] == 3.0  # corrected, nothing lost


def test_a_step_corrected_far_past_16_steps_is_its_exact_total_and_past_the_window_said_partial() -> None:
    """A rank cut off for 40 steps while its peer goes on: each of its late steps is corrected to
    the exact total (its states kept packed past the 16 live), names it arrived, counts nobody
    missing. Past ``retain_seconds`` its late data is a ``partial`` record, no value, counted."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=1, retain_seconds=100), clock=clock)
    for step in range(40):
        clock.now = float(step)
        ingest(e, resource("p0", 0, 2), metrics({"n": (Reduce.SUM, [1.0])}, step=step))
        clock.now += 0.5 if step else 1.5
        (view,) = e.ready()
        assert view.step == step and values_of(view)[attr.MISSING_PROCESSES] == 1.0
    assert e.steps.retained.status() == {
        "live": 16,
        "packed": 24,
        "bytes": e.steps.retained.bytes,
        "unkept_steps": 0,
        "file_failures": 0,
    }
    updates = ingest(e, resource("p1", 1, 2), metrics({"n": (Reduce.SUM, [2.0])}, step=3))
    (update,) = updates
    assert values_of(update) == {"n": 3.0, attr.MISSING_PROCESSES: 0.0}  # a packed step, read back whole
    assert update.anomalies == [Corrected(step=3, processes=("trainer_r1",), count=1, missing=0)]
    (more,) = ingest(e, resource("p0", 0, 2), metrics({"n": (Reduce.SUM, [2.0])}, step=5))  # in time, and late
    assert values_of(more)["n"] == 3.0 and more.anomalies == []  # nobody arrived: it was there
    assert list(more.per_process) == []  # its in-time value stands in its own view: no partial one
    clock.now = 103.5  # step 2 was finalized at 2.5: past the window
    (partial,) = ingest(e, resource("p1", 1, 2), metrics({"n": (Reduce.SUM, [2.0])}, step=2))
    assert partial.global_metrics == [] and [m.value for ms in partial.per_process.values() for m in ms] == [2.0]
    assert partial.anomalies == [Partial(step=2, processes=("trainer_r1",), count=1, points=1)]
    assert e.counts.partial_points == 1 and e.counts.late_points == 3


def test_a_point_without_a_step_joins_the_step_whose_window_holds_its_time() -> None:
    """Windows end at each step's first flush marker; step-less points go by their timestamp."""
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    s = 1_000_000_000
    ingest(e, resource("t0"), metrics({"loss": (Reduce.MEAN, [1.0])}, step=0, at=10 * s))
    (step0,) = e.ready()
    buffer = resource("buf", role="replay_buffer")
    ingest(e, buffer, metrics({"in_step_1": (Reduce.MAX, [7.0])}, step=None, at=11 * s))  # newer than every window
    ingest(e, resource("t0"), metrics({"loss": (Reduce.MEAN, [2.0])}, step=1, at=12 * s))
    ingest(
        e, buffer, metrics({"also_step_1": (Reduce.SUM, [3.0])}, step=None, at=11 * s + 5)
    )  # arrived after step 1 closed
    (view,) = e.ready()
    assert view.step == 1 and values_of(view)["in_step_1"] == 7.0 and values_of(view)["also_step_1"] == 3.0
    assert "in_step_1" not in values_of(step0)
    late = ingest(e, buffer, metrics({"old": (Reduce.SUM, [1.0])}, step=None, at=9 * s))
    e.clock.now = 10.0  # type: ignore[attr-defined]
    (update,) = late or [e.view(done) for done in e.late(force=True)]
    assert update.late and update.step == 0 and values_of(update)["old"] == 1.0  # its window is step 0's


def test_one_export_s_values_without_a_step_go_to_one_step_whatever_their_reduce() -> None:
    """A replay buffer that never flushes exports its size (LAST: the point carries the value's own
    time) and its writes (SUM: the export's time) together; by their own times they would split
    over two steps, and the step with the size would lack the writes that made it."""
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    s = 1_000_000_000
    for step, at in ((0, 10), (1, 12)):
        ingest(e, resource("t0"), metrics({"loss": (Reduce.MEAN, [1.0])}, step=step, at=at * s))
    assert [view.step for view in e.ready()] == [0, 1]
    c = Recorder(streams=[])
    c.record("buffer/size", 20.0, Reduce.LAST)
    c.accs["buffer/size"].time_unix_nano = int(11.5 * s)  # set in step 1's window
    size = encode("buffer/size", c.accs["buffer/size"], None, 0, int(12.5 * s), PointAttributes())
    writes = metrics({"buffer/writes": (Reduce.SUM, [5.0])}, step=None, at=int(12.5 * s))  # exported after it
    late = ingest(e, resource("buf", role="replay_buffer"), [size, *writes])
    assert late == [] and list(e.steps.open) == [2]  # not a late update of step 1: both wait in step 2
    e.clock.now = 10.0  # type: ignore[attr-defined]
    (view,) = e.ready()
    values = values_of(view)
    assert view.step == 2 and (values["buffer/size"], values["buffer/writes"]) == (20.0, 5.0)


def test_what_a_process_recorded_after_its_last_flush_never_joins_a_step_it_closed() -> None:
    """A crashed rank's last request: the markers of steps it closed since its previous export and
    the values it recorded after them (sent at exit, without a step). The windows learn those steps'
    ends only when the request merges, so by time alone the values would join step 1, whose mean
    they would change; they are the next step's."""
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    s = 1_000_000_000
    for rank in range(2):
        ingest(e, resource(f"t{rank}", rank, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, step=0, at=10 * s))
    assert [view.step for view in e.ready()] == [0]
    last = [
        *metrics({"loss": (Reduce.MEAN, [0.5])}, step=1, at=11 * s),
        *metrics({"loss": (Reduce.MEAN, [0.3])}, step=2, at=12 * s),
        *metrics({"loss": (Reduce.MEAN, [0.25])}, step=None, at=13 * s),
    ]
    ingest(e, resource("t1", 1, 2), last)
    ingest(e, resource("t0", 0, 2), metrics({"loss": (Reduce.MEAN, [0.5])}, step=1, at=11 * s))
    ingest(e, resource("t0", 0, 2), metrics({"loss": (Reduce.MEAN, [0.3])}, step=2, at=12 * s))
    one, two = e.ready()
    assert (one.step, values_of(one)["loss"]) == (1, 0.5) and (two.step, values_of(two)["loss"]) == (2, 0.3)
    assert list(e.steps.open) == [3]  # t1's values after its last flush wait for step 3
    e.clock.now = 10.0  # type: ignore[attr-defined]
    (three,) = e.ready()
    assert three.step == 3 and values_of(three)["loss"] == 0.25


def test_what_a_process_sent_before_its_first_flush_joins_its_first_step_however_late_it_arrives() -> None:
    """Rank 0's first steps take long (it starts a generator), so it exports once without a step
    before its first flush, while its sink is still starting: that request is held back and goes
    out with the markers of the steps it closed since. Its step-less values came before those
    closes: they are step 0's, not the step after the last close (the main example's report read
    a step 6 holding rank 0's step-0 phases, its step 0 three ranks' only)."""
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    s = 1_000_000_000
    ingest(e, resource("t1", 1, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, step=0, at=10 * s))
    ingest(e, resource("t1", 1, 2), metrics({"loss": (Reduce.MEAN, [0.5])}, step=1, at=12 * s))
    held = [  # exported after rank 1 closed step 0 (step 1's window), before its own first flush
        *metrics({"loss": (Reduce.MEAN, [3.0])}, step=None, at=int(10.5 * s)),
        *metrics({"loss": (Reduce.MEAN, [])}, step=0, at=11 * s),
        *metrics({"loss": (Reduce.MEAN, [0.5])}, step=1, at=12 * s),
    ]
    ingest(e, resource("t0", 0, 2), held)
    zero, one = e.ready()
    assert (zero.step, values_of(zero)["loss"]) == (0, 2.0)  # both ranks' values: (1.0 + 3.0) / 2
    assert (one.step, values_of(one)["loss"]) == (1, 0.5)
    assert list(e.steps.open) == []


def test_ranks_that_said_goodbye_are_not_missing_from_the_steps_that_other_roles_go_on_with() -> None:
    """An RL job's trainer finishes first: both ranks close step 1 and say goodbye while the replay
    buffer still records. Its values open step 2, which is final without naming the trainer
    missing; a rank whose goodbye said an exception ended it is still missing from the step it died in,
    and so is one that sent part of the step before its goodbye (Ctrl-C cut it short)."""
    for error in (None, "ZeroDivisionError: division by zero"):
        e = StepBook("x", BookConfig(grace=5), clock=Clock())
        s = 1_000_000_000
        for step in range(2):
            for rank in range(2):
                ingest(
                    e, resource(f"t{rank}", rank, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, step, at=(10 + step) * s)
                )
        for rank in range(2):
            bye = pb.Metric(name=attr.GOODBYE)
            point = bye.sum.data_points.add(as_int=1)
            if error and rank == 1:
                point.attributes.append(key_value(attr.EXIT_ERROR, error))
            ingest(e, resource(f"t{rank}", rank, 2), [bye])
        assert [view.step for view in e.ready()] == [0, 1]
        ingest(e, resource("buf", role="replay_buffer"), metrics({"size": (Reduce.MAX, [7.0])}, None, at=12 * s))
        e.clock.now = 10.0  # type: ignore[attr-defined]
        (view,) = e.ready()
        assert view.step == 2 and values_of(view)["size"] == 7.0
        assert view.missing == ([] if error is None else ["trainer_r1"]), view.missing

    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    ingest(e, resource("t0", 0, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, 0, at=10 * s))
    ingest(e, resource("t1", 1, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, 0, at=10 * s))
    for rank in range(2):  # each records some of step 1, then Ctrl-C: its values go out with its goodbye
        bye = pb.Metric(name=attr.GOODBYE)
        bye.sum.data_points.add(as_int=1)
        ingest(e, resource(f"t{rank}", rank, 2), [*metrics({"loss": (Reduce.MEAN, [0.5])}, None, at=11 * s), bye])
    # Both said goodbye, neither failed: step 1 waits (a role yet to report may still send to it),
    # until the grace or the job's end.
    assert [view.step for view in e.ready()] == [0]
    (cut,) = e.ready(force=True)  # the job ended
    assert cut.step == 1 and [a.processes for a in cut.anomalies if isinstance(a, Interrupted)] == [
        ("trainer_r0", "trainer_r1")
    ]

    # Rank 1 leaves early (uneven inputs) while rank 0 goes on: missing from rank 0's steps.
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    for rank in range(2):
        ingest(e, resource(f"t{rank}", rank, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, 0, at=10 * s))
    bye = pb.Metric(name=attr.GOODBYE)
    bye.sum.data_points.add(as_int=1)
    ingest(e, resource("t1", 1, 2), [bye])
    ingest(e, resource("t0", 0, 2), metrics({"loss": (Reduce.MEAN, [2.0])}, 1, at=11 * s))
    assert [view.step for view in e.ready()] == [0]  # step 1 waits for rank 1
    e.clock.now = 10.0  # type: ignore[attr-defined]
    (alone,) = e.ready()
    assert alone.step == 1 and alone.missing == ["trainer_r1"], alone.missing


def test_a_step_a_rank_raised_in_is_final_once_the_last_rank_said_goodbye_and_names_the_failure() -> None:
    """torchrun: rank 1 raises in step 3, rank 0 (stopped in its all-reduce) says goodbye after it.
    Step 3 is final at rank 0's goodbye, naming the failure, not only when the job's sink stops:
    its launcher's terminal reads the failed step before ``report:``."""
    e = StepBook("x", BookConfig(grace=30), clock=Clock())
    s = 1_000_000_000
    for step in range(3):
        for rank in range(2):
            ingest(e, resource(f"t{rank}", rank, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, step, at=(10 + step) * s))
    bye = pb.Metric(name=attr.GOODBYE)
    bye.sum.data_points.add(as_int=1, attributes=[key_value(attr.EXIT_ERROR, "ZeroDivisionError: division by zero")])
    ingest(e, resource("t1", 1, 2), [*metrics({"loss": (Reduce.MEAN, [0.5])}, None, at=13 * s), bye])
    assert [view.step for view in e.ready()] == [0, 1, 2]  # step 3 waits for rank 0
    bye = pb.Metric(name=attr.GOODBYE)
    bye.sum.data_points.add(as_int=1)
    ingest(e, resource("t0", 0, 2), [*metrics({"loss": (Reduce.MEAN, [0.25])}, None, at=13 * s), bye])
    (failed,) = e.ready()  # no grace, no force: nobody is left to send to it
    (cut,) = [a for a in failed.anomalies if isinstance(a, Interrupted)]
    assert failed.step == 3 and values_of(failed)["loss"] == 0.375
    assert (cut.failed, cut.errors) == (("trainer_r1",), ("ZeroDivisionError: division by zero",)), cut
    assert e.ready(force=True) == []


def test_processes_that_never_step_get_time_buckets_not_a_step_per_request() -> None:
    """No stepping process: 1 s buckets, final once the bucket is over plus the lag; many
    requests in one bucket are one step."""
    clock, wall = Clock(), Clock()
    wall.now = 1000.0
    e = StepBook("x", BookConfig(grace=5, time_bucket=1.0, time_bucket_lag=2.0), clock=clock, wall=wall)
    s = 1_000_000_000
    for i in range(20):  # 20 requests within bucket 1000 s .. 1001 s
        ingest(e, resource("gen", role="generator"), metrics({"tokens": (Reduce.SUM, [1.0])}, None, at=1000 * s + i))
    ingest(e, resource("gen", role="generator"), metrics({"tokens": (Reduce.SUM, [5.0])}, None, at=1001 * s + 1))
    assert e.ready() == []  # bucket 0 ends at 1001 s, final at 1003 s
    wall.now = clock.now = 1003.0
    (first,) = e.ready()
    assert first.step == 0 and values_of(first)["tokens"] == 20.0 and values_of(first)[attr.BUCKET_TIME] == 1000.0
    wall.now = clock.now = 1004.0
    (second,) = e.ready()
    assert second.step == 1 and values_of(second)["tokens"] == 5.0


def test_a_first_step_longer_than_the_buckets_keeps_what_its_processes_exported_before_they_stepped() -> None:
    """Two ranks export step 0's first values without a step (no flush yet, so they may never
    flush): time buckets. Bucket 0 is viewed; bucket 1 is still open when rank 0's first marker
    comes. Step 0 takes both buckets whole, rewinds over bucket 0's view, and gives a per-process
    value only to the rank whose whole step it holds (rank 1's bucket-0 part was viewed there)."""
    clock, wall = Clock(), Clock()
    wall.now = clock.now = 1000.0
    e = StepBook("x", BookConfig(grace=5, time_bucket=1.0, time_bucket_lag=2.0), clock=clock, wall=wall)
    s = 1_000_000_000
    r0, r1 = resource("p0", 0, 2), resource("p1", 1, 2)
    ingest(e, r1, metrics({"n": (Reduce.SUM, [1.0]), "t": (Reduce.MAX, [7.0])}, None, at=1000 * s))
    wall.now = clock.now = 1003.0
    (bucket,) = e.ready()
    assert bucket.step == 0 and values_of(bucket)["n"] == 1.0
    ingest(e, r0, metrics({"n": (Reduce.SUM, [2.0]), "t": (Reduce.MAX, [3.0])}, None, at=1003 * s))
    ingest(e, r0, metrics({"n": (Reduce.SUM, [4.0])}, step=0, at=1003 * s + 5))
    ingest(e, r1, metrics({"n": (Reduce.SUM, [8.0])}, step=0, at=1003 * s + 6))
    (step,) = e.ready()
    values = values_of(step)
    assert step.step == 0 and step.rewound and not step.late
    assert values["n"] == 15.0 and values["t"] == 7.0  # every value of the step, bucketed or not
    assert {p.label: {m.key: m.value for m in ms} for p, ms in step.per_process.items()} == {
        "trainer_r0": {"n": 6.0, "t": 3.0}  # rank 1's bucket-0 part went to that view: whole or absent
    }
    assert e.counts.abandoned_steps == 0


def test_buckets_below_a_first_step_far_ahead_stand_and_the_carried_keys_are_bounded() -> None:
    """A first marker above every bucket's view (a job numbering from 100) does not rewind them:
    they stand as written, and only the open bucket is carried (carried too, the viewed ones would
    count twice). The carried union of many buckets holds at most ``max_keys_per_step`` keys; the
    rest is refused, counted."""
    from rankscope.sink.testing import ExperimentLimits

    clock, wall = Clock(), Clock()
    wall.now = clock.now = 1000.0
    config = BookConfig(grace=5, time_bucket=1.0, time_bucket_lag=2.0, limits=ExperimentLimits(max_keys_per_step=2))
    e = StepBook("x", config, clock=clock, wall=wall)
    s = 1_000_000_000
    r0 = resource("p0", 0, 1)
    ingest(e, r0, metrics({"a": (Reduce.SUM, [1.0])}, None, at=1000 * s))
    wall.now = clock.now = 1003.0
    (bucket,) = e.ready()
    assert bucket.step == 0 and values_of(bucket)["a"] == 1.0
    ingest(e, r0, metrics({"a": (Reduce.SUM, [2.0]), "b": (Reduce.SUM, [3.0])}, None, at=1003 * s))
    ingest(e, r0, metrics({"c": (Reduce.SUM, [5.0])}, None, at=1004 * s + 1))
    ingest(e, r0, metrics({"a": (Reduce.SUM, [4.0])}, step=100, at=1004 * s + 5))
    (step,) = e.ready()
    values = values_of(step)
    assert step.step == 100 and not step.rewound
    assert values["a"] == 6.0 and values["b"] == 3.0 and "c" not in values  # bucket 0's 1.0 stands in its view
    assert e.counts.refused == 1 and e.counts.abandoned_steps == 0


def test_buckets_carried_from_the_first_steps_number_packed_ones_too_and_a_reduce_type_conflict_refused() -> None:
    """20 buckets viewed (the oldest packed: past ``retained.HOT``), then ``flush(3)``: the rewind
    replaces the views from step 3, so buckets 3-19 go into step 3 and buckets 0-2 keep their
    views (carried too, they would count twice). A key recorded as SUM in one bucket and MAX in
    another (admission holds one reduce type per key within a step only) is refused, counted, and
    the run goes on stepping."""
    clock, wall = Clock(), Clock()
    wall.now = clock.now = 1000.0
    e = StepBook("x", BookConfig(grace=5, time_bucket=1.0, time_bucket_lag=2.0), clock=clock, wall=wall)
    s = 1_000_000_000
    r0 = resource("p0", 0, 1)
    viewed = []
    for second in range(20):
        k = (Reduce.MAX, [9.0]) if second == 19 else (Reduce.SUM, [1.0])
        ingest(e, r0, metrics({"n": (Reduce.SUM, [1.0]), "k": k}, None, at=(1000 + second) * s))
        wall.now = clock.now = 1000.0 + second + 3
        viewed += e.ready()
    assert [v.step for v in viewed] == list(range(20))
    ingest(e, r0, metrics({"n": (Reduce.SUM, [100.0])}, step=3, at=1023 * s))
    (step,) = e.ready()
    values = values_of(step)
    assert step.step == 3 and step.rewound and values["n"] == 117.0  # buckets 3-19 and its own
    assert values["k"] == 16.0 and e.counts.refused == 1  # bucket 19's MAX of k: refused
    assert len(step.per_process) == 0  # its part was viewed: whole or absent
    ingest(e, r0, metrics({"n": (Reduce.SUM, [1.0])}, step=4, at=1024 * s))
    (after,) = e.ready()
    assert after.step == 4 and values_of(after)["n"] == 1.0 and e.counts.abandoned_steps == 0


def test_sample_rows_of_open_buckets_join_the_first_steps_table_whatever_their_seq() -> None:
    """Rollout rows recorded before the first flush went out without a step, in two exports (two
    time buckets still open when the marker came): they are in step 0's table beside the step's
    own row. A row's seq counts within one export, so all three share seq 0: none is taken for
    another's retry."""
    from rankscope.otlp.samples import SampleRow
    from rankscope.sink.testing import ResourceBatch

    clock, wall = Clock(), Clock()
    wall.now = clock.now = 1000.0
    e = StepBook("x", BookConfig(grace=5, time_bucket=1.0, time_bucket_lag=2.0), clock=clock, wall=wall)
    s = 1_000_000_000

    def row(reward: float, step: int | None, at: int) -> SampleRow:
        return SampleRow("rollouts", "reward", 3, "top", reward, 0, {"reward": reward}, step, at, "", "", None)

    def send(rows: list[SampleRow]) -> None:
        refused = Refusals()
        e.apply(ResourceBatch("x", resource("p0", 0, 1), samples=rows), refused)
        assert refused.count == 0, refused.reasons

    send([row(0.5, None, 1000 * s)])
    send([row(0.7, None, 1001 * s + 1)])
    ingest(e, resource("p0", 0, 1), metrics({"n": (Reduce.SUM, [1.0])}, step=0, at=1001 * s + 5))
    send([row(0.9, 0, 1001 * s + 6)])
    clock.now = 1010.0
    (step,) = e.ready()
    assert step.step == 0 and sorted(r["row"]["reward"] for r in step.samples["rollouts"]) == [0.5, 0.7, 0.9]


def test_actor_markers_wait_for_their_controller() -> None:
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    for rank in range(2):
        ms = metrics({"r": (Reduce.SUM, [float(rank)])}, step=0)
        ms[-1].sum.data_points[0].attributes.append(key_value(attr.DRIVEN, True))
        ingest(e, resource(f"a{rank}", rank, 2, role="MyActor", **{attr.REPLICA: "m1"}), ms)
    assert e.ready() == [] and e.readiness.missing(0) == ["controller"]
    ms = metrics({}, step=0)
    ms[-1].sum.data_points[0].attributes.append(key_value(attr.EXPECTED_PROCESSES, 5))
    ingest(e, resource("c", role="controller"), ms)
    assert e.readiness.missing(0) == ["+2 unnamed"]  # the controller flushed 4 actor processes, 2 reported


def test_late_per_process_values_are_whole_or_absent() -> None:
    """A late update's global value is the whole step's; per process, a process whose data all came
    late has its value, and one that sent part in time is not given a partial value."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=1), clock=clock)
    ingest(e, resource("p0", 0, 2), metrics({"n": (Reduce.SUM, [1.0])}, step=0))
    clock.now = 1.5
    (view,) = e.ready()
    assert values_of(view)["n"] == 1.0 and [p.label for p in view.per_process] == ["trainer_r0"]
    ingest(e, resource("p0", 0, 2), metrics({"n": (Reduce.SUM, [2.0])}, step=0, marker=False))
    (late,) = ingest(e, resource("p1", 1, 2), metrics({"n": (Reduce.SUM, [4.0])}, step=0))
    assert late.late and values_of(late)["n"] == 7.0
    assert {p.label: [m.value for m in ms] for p, ms in late.per_process.items()} == {"trainer_r1": [4.0]}


def test_a_timestamp_from_the_future_never_stalls_an_experiment() -> None:
    """A bad clock (or a hostile one) far ahead is taken as now: the bucket epoch and the step
    windows stay where the sink's clock says."""
    clock, wall = Clock(), Clock()
    wall.now = clock.now = 1000.0
    e = StepBook("x", BookConfig(grace=5, time_bucket=1.0, time_bucket_lag=1.0), clock=clock, wall=wall)
    s = 1_000_000_000
    gen = resource("gen", role="generator")
    ingest(e, gen, metrics({"tokens": (Reduce.SUM, [1.0])}, None, at=2**63))  # the year 2262
    ingest(e, gen, metrics({"tokens": (Reduce.SUM, [2.0])}, None, at=1000 * s + 5))
    wall.now = clock.now = 1002.0
    (view,) = e.ready()
    assert view.step == 0 and values_of(view)["tokens"] == 3.0
    e2 = StepBook("x", BookConfig(grace=5), clock=clock, wall=wall)
    ingest(e2, resource("t0"), metrics({"loss": (Reduce.MEAN, [1.0])}, step=0, at=2**63))  # its window: now
    ingest(e2, resource("buf", role="replay_buffer"), metrics({"later": (Reduce.SUM, [1.0])}, None, at=1003 * s))
    assert [v.step for v in e2.ready()] == [0] and e2.step_at(1003 * s) == 1


def test_a_replayed_record_opens_its_step_whatever_max_open_steps_says() -> None:
    """``max_open_steps`` refuses new data that would open one step too many; a record replayed
    from the write-ahead log was acknowledged once, so it is never refused for it (a sink that
    crashed with more steps open than the limit, or restarted with a lower one, loses nothing)."""
    from rankscope.sink.testing import ExperimentLimits

    def batches() -> list[Any]:
        request = mpb.ExportMetricsServiceRequest()
        rm = request.resource_metrics.add(resource=encode_resource(resource("p0", world=2)))
        for step in range(6):
            rm.scope_metrics.add().metrics.extend(metrics({"loss": (Reduce.MEAN, [1.0])}, step))
        return metrics_batches(request, Limits(), Refusals())

    live = StepBook("x", BookConfig(grace=5, limits=ExperimentLimits(max_open_steps=3)), clock=Clock())
    refused = Refusals()
    for batch in batches():
        live.apply(batch, refused)
    assert (
        refused.count == 6 and "step 3 would open more than 3 steps (limit)" in refused.message
    )  # 3 points, 3 markers

    replayed = StepBook("x", BookConfig(grace=5, limits=ExperimentLimits(max_open_steps=3)), clock=Clock())
    refused = Refusals()
    for batch in batches():
        replayed.apply(batch, refused, replayed=True)
    assert refused.count == 0
    assert [values_of(view)["loss"] for view in replayed.ready(force=True)] == [1.0] * 6


def test_a_runs_groups_declare_at_most_max_slots_rank_slots() -> None:
    """``absent`` lists every empty rank slot on the finalizer all runs share: a made-up world size,
    or many groups each declaring a large one, would have it list millions."""
    from rankscope.sink.testing import Roster

    roster = Roster(max_processes=100, max_slots=100)
    first = roster.process_for(resource("a", world=10_000_000, **{attr.REPLICA: "0"}))
    second = roster.process_for(resource("b", world=10_000_000, **{attr.REPLICA: "1"}))
    same_group = roster.process_for(resource("c", rank=5, world=50, **{attr.REPLICA: "0"}))
    assert first is not None and second is not None and same_group is not None
    assert (first.world_size, second.world_size, same_group.world_size) == (100, 1, 50)
    honest = Roster(max_processes=100, max_slots=100)
    sizes = [
        honest.process_for(resource(f"r{i}", rank=i % 8, world=8, **{attr.REPLICA: str(i // 8)})) for i in range(32)
    ]
    assert {p.world_size for p in sizes if p is not None} == {8}  # 4 groups of 8: 32 slots, all kept


def test_a_step_the_job_ended_in_is_interrupted_and_not_judged() -> None:
    """Ctrl-C: the sink finalizes the open step when the job ends (``force``); it is named
    ``interrupted``, with who had not closed it, and no detector runs on its cut-short phases."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=10), clock=clock)
    ingest(e, resource("p0", 0, 2), metrics({"loss": (Reduce.MEAN, [float("nan")])}, step=0))
    clock.now = 1.0  # well inside the grace period: the job ended, nobody is late
    (view,) = e.ready(force=True)
    assert [a.KIND for a in view.anomalies] == ["interrupted"]  # not "missing", not "nonfinite"
    assert view.anomalies[0].to_json()["processes"] == ["trainer_r1"] and view.missing == []
    got = values_of(view)
    assert got[attr.MISSING_PROCESSES] == 0.0 and attr.NONFINITE_VALUES not in got
    assert not any(key.startswith(attr.STRAGGLER_PREFIX) for key in got)
    e2 = StepBook("x", BookConfig(grace=2), clock=(later := Clock()))  # past its grace, a process is missing as before
    ingest(e2, resource("p0", 0, 2), metrics({"loss": (Reduce.MEAN, [1.0])}, step=0))
    later.now = 2.5
    (view,) = e2.ready()
    assert [a.KIND for a in view.anomalies] == ["missing"] and view.missing == ["trainer_r1"]


def test_a_process_that_starts_after_the_others_is_in_the_runs_first_step() -> None:
    """The trainers close step 0 before the generator rank 0 spawned has sent anything: in the run's
    first ``start_hold`` seconds the step waits (it went final without the generator, whose data
    came late), and after them a complete step is final at once."""
    clock = Clock()
    e = StepBook("x", BookConfig(grace=10, start_hold=2.0), clock=clock)
    for rank in range(2):
        ingest(e, resource(f"t{rank}", rank, 2), metrics({"trainer/loss": (Reduce.MEAN, [1.0])}, step=0))
    assert e.ready() == [] and e.next_deadline() == 2.0  # complete, but held
    clock.now = 1.5
    ingest(e, resource("g", role="generator"), metrics({"generator/reward": (Reduce.MEAN, [0.5])}, step=0))
    clock.now = 2.0
    (first,) = e.ready()
    assert {"trainer/loss", "generator/reward"} <= set(values_of(first)) and not first.missing
    assert e.counts.late_points == 0
    for rank in range(2):
        ingest(e, resource(f"t{rank}", rank, 2), metrics({"trainer/loss": (Reduce.MEAN, [1.0])}, step=1))
    ingest(e, resource("g", role="generator"), metrics({"generator/reward": (Reduce.MEAN, [0.5])}, step=1))
    assert [v.step for v in e.ready()] == [1]  # past the hold: final once nothing is missing
    held = StepBook("x", BookConfig(grace=1.0, start_hold=2.0), clock=(short := Clock()))  # never past the grace
    ingest(held, resource("t0"), metrics({"trainer/loss": (Reduce.MEAN, [1.0])}, step=0))
    short.now = 1.0
    assert [v.step for v in held.ready()] == [0]


def test_a_steps_keys_are_in_the_same_order_whichever_process_came_first() -> None:
    """Keys by the role that first sent them (roles by name), each role's in the order its process
    recorded them: the trainers' data first or the generator's, the views list the same order."""
    trainer = {"trainer/loss": (Reduce.MEAN, [1.0]), "trainer/grad_norm": (Reduce.MAX, [2.0])}
    generator = {"generator/reward": (Reduce.MEAN, [0.5]), "generator/tokens": (Reduce.SUM, [8.0])}
    orders = []
    for trainers_first in (True, False):
        e = StepBook("x", BookConfig(grace=10), clock=Clock())
        sends = [(resource("t0"), trainer), (resource("g", role="generator"), generator)]
        for who, values in sends if trainers_first else sends[::-1]:
            ingest(e, who, metrics(values, step=0))
        (view,) = e.ready()
        orders.append([k for k in values_of(view) if "/" in k and not k.startswith("rankscope/")])
    assert orders[0] == orders[1]
    assert orders[0][:4] == ["generator/reward", "generator/tokens", "trainer/loss", "trainer/grad_norm"], orders
