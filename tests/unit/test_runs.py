"""Runs, as pure parts: the run book (which run a launch's data belongs to, resumes) and a
restarted attempt inside one run (what it drops, what it refuses, which step is a rewind)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb

from rankscope.core import names as attr
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource
from rankscope.report.summary import Summary
from rankscope.sink import Experiment
from rankscope.sink.book.runs import Run, RunBook
from rankscope.sink.checked import Limits, Refusals
from rankscope.sink.edge.validate import metrics_batches

from .test_sink_steps import Clock, metrics, resource, values_of


class Wall:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def of(run: str, attempt: int = 0, resume: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {attr.RUN_ID: run, attr.EXPERIMENT_ATTEMPT: attempt}
    if resume is not None:
        found[attr.RUN_RESUME] = resume
    return found


def test_each_launch_is_its_own_run_and_a_restart_within_it_keeps_it() -> None:
    book = RunBook(wall=Wall())
    a = book.resolve("exp", of("a"))
    b = book.resolve("exp", of("b"))
    again = book.resolve("exp", of("a", attempt=1))  # torchelastic restarted launch a
    assert not isinstance(a, str) and not isinstance(b, str) and not isinstance(again, str)
    assert (a.key, b.key, again.key) == (("exp", "a"), ("exp", "b"), ("exp", "a"))
    assert again.attempt == 1 and book.latest("exp") == "b"
    assert [r.run for r in book.runs("exp")] == ["a", "b"] and book.runs("other") == []


def test_a_resuming_launch_is_its_targets_next_attempt_for_every_process() -> None:
    book = RunBook(wall=Wall())
    book.resolve("exp", of("a", attempt=2))  # run a restarted twice
    book.resolve("exp", of("b"))
    first = book.resolve("exp", of("c", resume="a"))
    second = book.resolve("exp", of("c", resume="a"))  # another process of launch c
    restarted = book.resolve("exp", of("c", attempt=1, resume="a"))  # launch c restarted by torchelastic
    assert not isinstance(first, str) and not isinstance(second, str) and not isinstance(restarted, str)
    assert first.key == second.key == restarted.key == ("exp", "a")
    assert (first.attempt, second.attempt, restarted.attempt) == (3, 3, 4)
    assert first.note is not None and "resumed by launch 'c'" in first.note and second.note is None
    assert first.changed is not None and first.changed.launches == {"c": 3}
    assert book.latest("exp") == "a" and book.target("exp", "c") == "a" and book.target("exp", "b") == "b"
    latest = book.resolve("exp", of("d", resume="latest"))
    assert not isinstance(latest, str) and latest.key == ("exp", "a") and latest.attempt == 5


def test_what_a_resume_cannot_find_is_said() -> None:
    wall = Wall()
    book = RunBook(resume_window=60.0, wall=wall)
    nothing = book.resolve("exp", of("a", resume="latest"))  # nothing to continue: a new run, said so
    assert not isinstance(nothing, str) and nothing.key == ("exp", "a") and nothing.note
    assert book.resolve("exp", of("b", resume="zzz")) == "resume: experiment 'exp' has no run 'zzz'"
    wall.now += 61
    assert "resume_window" in str(book.resolve("exp", of("c", resume="a")))
    fresh = book.resolve("exp", of("d", resume="latest"))  # a is too old to continue
    assert not isinstance(fresh, str) and fresh.key == ("exp", "d")


def test_a_restored_book_maps_a_launch_as_before() -> None:
    book = RunBook(wall=Wall())
    book.resolve("exp", of("a"))
    resumed = book.resolve("exp", of("c", resume="a"))
    assert not isinstance(resumed, str) and resumed.changed is not None
    record = resumed.changed.record()
    restored = RunBook(wall=Wall())  # a restarted sink, from the run's meta.json and checkpoint
    restored.add(Run.restored(record, attempt=1, last_seen=1000.0))
    again = restored.resolve("exp", of("c", resume="a"))
    assert not isinstance(again, str) and (again.key, again.attempt) == (("exp", "a"), 1)


def test_the_book_forgets_the_oldest_runs_past_its_limit() -> None:
    book = RunBook(max_runs=3, wall=Wall())
    for name in "abcde":
        book.resolve("exp", of(name))
    assert [r.run for r in book.runs("exp")] == ["c", "d", "e"]


def send(e: Experiment, who: dict[str, Any], step: int, value: float) -> Refusals:
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(resource=encode_resource(who))
    rm.scope_metrics.add().metrics.extend(metrics({"loss": (Reduce.MEAN, [value])}, step))
    refused = Refusals()
    for batch in metrics_batches(request, Limits(), refused):
        e.apply(batch, refused)
    return refused


def test_a_restarted_attempt_drops_what_the_old_one_left_open_and_rewinds() -> None:
    e = Experiment("x", grace=5, clock=Clock())
    old = resource("p0")
    for step in range(4):
        send(e, old, step, float(step))
    assert [v.step for v in e.ready()] == [0, 1, 2, 3]
    send(e, resource("p1", rank=1, world=2), 4, 99.0)  # an open step the old attempt never closed
    new = {**resource("p2"), attr.EXPERIMENT_ATTEMPT: 1}
    assert send(e, new, 2, 20.0).count == 0  # back at the checkpoint: step 2 again, not late
    late = send(e, old, 4, 4.0)  # the old attempt, still sending
    assert late.count == 2 and "the run restarted as attempt 1" in late.reasons[0]
    send(e, new, 3, 30.0)
    views = e.ready()
    assert [(v.step, v.rewound, values_of(v)["loss"]) for v in views] == [(2, True, 20.0), (3, False, 30.0)]
    assert (e.counts.abandoned_steps, e.counts.superseded_points, e.counts.late_points) == (1, 2, 0)


def test_the_reports_summary_keeps_the_final_values_after_a_rewind() -> None:
    summary = Summary()
    for step, value in [(0, 1.0), (1, 2.0), (2, 3.0), (1, 20.0), (2, 30.0)]:
        if step == 1 and value == 20.0:
            summary.add({"kind": "rewind", "step": 1})
        summary.add({"kind": "step", "step": step, "values": {"loss": value}})
    assert [(p[0], p[1]) for p in summary.series.globals["loss"].points] == [(0, 1.0), (1, 20.0), (2, 30.0)]
    assert (summary.steps, summary.last_step, summary.rewinds) == (3, 2, [{"step": 1, "from": 2}])


def test_a_launch_reusing_the_id_of_an_ended_run_is_refused_with_a_reason() -> None:
    e = Experiment("x", run="fixed-rdzv-id", grace=5, clock=Clock())
    first = {**resource("p0"), attr.PROCESS_PID: 100}
    send(e, first, 0, 1.0)
    goodbye(e, first)
    again = send(e, {**resource("p0-again"), attr.PROCESS_PID: 100}, 1, 2.0)  # the same process, re-initialized
    assert again.count == 0
    goodbye(e, {**resource("p0-again"), attr.PROCESS_PID: 100})
    assert [values_of(v)["loss"] for v in e.ready()] == [1.0, 2.0]
    late_rank = send(e, {**resource("p1", rank=1), attr.PROCESS_PID: 300}, 1, 7.0)  # a slot nobody held: late
    assert late_rank.count == 0 and e.counts.late_points == 1
    goodbye(e, {**resource("p1", rank=1), attr.PROCESS_PID: 300})
    other = send(e, {**resource("p9"), attr.PROCESS_PID: 200}, 0, 5.0)  # a second launch, the same run id
    assert other.count == 2 and "another launch reuses its id" in other.reasons[0]
    assert e.counts.reused_points == 2 and e.ready(force=True) == []


def goodbye(e: Experiment, who: dict[str, Any]) -> None:
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(resource=encode_resource(who))
    marker = rm.scope_metrics.add().metrics.add(name=attr.GOODBYE)
    marker.sum.data_points.add(as_int=1)
    for batch in metrics_batches(request, Limits(), Refusals()):
        assert batch.goodbye
        e.apply(batch, Refusals())


def test_a_restored_run_is_past_every_launch_mapped_onto_it_and_a_refused_run_is_forgotten() -> None:
    record = {"experiment": "exp", "run": "a", "started": "bad", "launches": {"c": 3, "d": "x"}}
    run = Run.restored(record, attempt=1, last_seen=5.0)  # the crash came before launch c wrote anything
    assert (run.attempt, run.launches, run.started) == (3, {"c": 3}, 5.0)
    book = RunBook(wall=Wall())
    book.add(run)
    again = book.resolve("exp", of("e", resume="a"))
    assert not isinstance(again, str) and again.attempt == 4  # never the same attempt as launch c
    new = book.resolve("exp", of("z"))
    assert not isinstance(new, str) and new.created
    book.forget(new.key)
    assert [r.run for r in book.runs("exp")] == ["a"]
    runless = book.resolve("exp", of("", resume="a"))  # data without a run id resumes nothing
    assert not isinstance(runless, str) and runless.key == ("exp", "") and runless.attempt == 0


def test_merged_states_of_a_new_attempt_come_from_a_new_upstream_record() -> None:
    e = Experiment("x", grace=5, clock=Clock())
    merged = {**resource("collector"), attr.MERGED: True}
    send(e, merged, 0, 1.0)
    send(e, {**resource("p1"), attr.EXPERIMENT_ATTEMPT: 1}, 0, 1.0)  # the run restarted
    assert send(e, {**merged, attr.EXPERIMENT_ATTEMPT: 1}, 0, 2.0).count == 0  # the Collector, same instance


def test_hostile_run_ids_never_become_paths_and_come_back_as_sent(tmp_path: Path) -> None:
    """Run ids are the client's: each gets its own directory under the experiment's ``runs/``,
    never a path of its own, never the run-less run's files; the meta keeps the id as sent."""
    import os
    import uuid

    from rankscope.sink.durable.wal import WriteAheadLog

    from ..hostile_names import assert_contained, hostile_jobs

    before_parent = set(os.listdir(tmp_path.parent))
    runs = [e for e, _, _ in hostile_jobs(uuid.uuid4().hex) if e] + ["meta.json", "checkpoint.json", "runs"]
    wal = WriteAheadLog(tmp_path / "state")
    runless = wal.open("exp")
    runless.append(0, b"run-less record")
    for run in runs:
        log = wal.open("exp", run)
        log.save_meta(Run("exp", run, started=1.0, last_seen=1.0, launches={"l": 1}).record())
        log.close()
    runless.close()
    found = {(meta["run"], meta.get("launches") == {"l": 1}) for meta, _, _ in wal.found()}
    wal.close()
    assert found == {("", False)} | {(run, True) for run in runs}
    assert_contained(tmp_path, [tmp_path / "state"], before_parent)
