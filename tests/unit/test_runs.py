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
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import Limits, Refusals, Refused, Resolved, Run, RunBook, metrics_batches

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
    wall = Wall()
    book = RunBook(wall=wall)
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
    wall.now += 61  # a quiet for a minute (live_window): it may be continued without its id
    latest = book.resolve("exp", of("d", resume="latest"))
    assert isinstance(latest, Resolved) and latest.key == ("exp", "a") and latest.attempt == 5


def test_what_a_resume_cannot_find_is_said() -> None:
    wall = Wall()
    book = RunBook(resume_window=60.0, wall=wall)
    nothing = book.resolve("exp", of("a", resume="latest"))  # nothing to continue: a new run, said so
    assert not isinstance(nothing, str) and nothing.key == ("exp", "a") and nothing.note
    assert book.resolve("exp", of("b", resume="zzz")) == Refused("resume: experiment 'exp' has no run 'zzz'", "resume")
    wall.now += 61
    too_old = book.resolve("exp", of("c", resume="a"))
    assert isinstance(too_old, Refused) and "resume_window" in too_old.reason
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


def send(e: StepBook, who: dict[str, Any], step: int, value: float) -> Refusals:
    request = mpb.ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(resource=encode_resource(who))
    rm.scope_metrics.add().metrics.extend(metrics({"loss": (Reduce.MEAN, [value])}, step))
    refused = Refusals()
    for batch in metrics_batches(request, Limits(), refused):
        e.apply(batch, refused)
    return refused


def test_a_restarted_attempt_drops_what_the_old_one_left_open_and_rewinds() -> None:
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
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
    e = StepBook("x", BookConfig(grace=5), run="fixed-rdzv-id", clock=Clock())
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


def goodbye(e: StepBook, who: dict[str, Any]) -> None:
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
    e = StepBook("x", BookConfig(grace=5), clock=Clock())
    merged = {**resource("collector"), attr.MERGED: True}
    send(e, merged, 0, 1.0)
    send(e, {**resource("p1"), attr.EXPERIMENT_ATTEMPT: 1}, 0, 1.0)  # the run restarted
    assert send(e, {**merged, attr.EXPERIMENT_ATTEMPT: 1}, 0, 2.0).count == 0  # the Collector, same instance


def test_hostile_run_ids_never_become_paths_and_come_back_as_sent(tmp_path: Path) -> None:
    """Run ids are the client's: each gets its own directory under the experiment's ``runs/``,
    never a path of its own, never the run-less run's files; the meta keeps the id as sent."""
    import os
    import uuid

    from rankscope.sink.testing import WriteAheadLog

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


# -- whose runs: scopes, still sending, finished, bounded attempts (issue 40) --------------------


def test_only_the_scope_that_created_a_run_may_send_to_it_resume_it_restart_it_or_end_it() -> None:
    wall = Wall()
    book = RunBook(wall=wall)
    mine = book.resolve("shared", of("slurm-12345"), scope="team-a")
    assert isinstance(mine, Resolved) and mine.changed is not None and mine.changed.owner == "team-a"
    wall.now += 3600  # quiet for an hour: not sending any more
    for hijack in (of("slurm-12345", attempt=99), of("slurm-12345"), of("x", resume="slurm-12345")):
        refused = book.resolve("shared", hijack, scope="team-b")
        assert isinstance(refused, Refused) and refused.kind == "scope", refused
        assert "belongs to another token scope" in refused.reason and refused.key == ("shared", "slurm-12345")
    latest = book.resolve("shared", of("y", resume="latest"), scope="team-b")
    assert isinstance(latest, Refused) and latest.kind == "scope" and latest.key is None
    run = book.get(("shared", "slurm-12345"))
    assert run is not None and (run.attempt, run.launches, run.last_seen) == (0, {}, 1000.0)  # untouched
    own = book.resolve("shared", of("slurm-12345", attempt=1), scope="team-a")  # its own requeue
    assert isinstance(own, Resolved) and own.attempt == 1


def test_resume_latest_never_takes_a_run_that_is_still_sending() -> None:
    wall = Wall()
    book = RunBook(live_window=60.0, wall=wall)
    book.resolve("exp", of("a"))
    wall.now += 30
    fresh = book.resolve("exp", of("b", resume="latest"))  # a sent 30 s ago and has not said goodbye
    assert isinstance(fresh, Resolved) and fresh.key == ("exp", "b") and fresh.attempt == 0
    assert fresh.note is not None and "'a' of experiment 'exp' is still sending" in fresh.note
    named = book.resolve("exp", of("c", resume="a"))  # named: a live run may be continued on purpose
    assert isinstance(named, Resolved) and named.key == ("exp", "a") and named.attempt == 1
    book.settle(("exp", "a"), 1, all_ended=True)  # a's processes all said goodbye: it is not sending
    ended = book.resolve("exp", of("d", resume="latest"))
    assert isinstance(ended, Resolved) and ended.key == ("exp", "a") and ended.attempt == 2


def test_a_finished_run_refuses_every_later_point_of_its_attempt_alike() -> None:
    wall = Wall()
    book = RunBook(linger=10.0, wall=wall)
    book.resolve("exp", of("job"))
    changed = book.settle(("exp", "job"), 0, all_ended=True)
    assert changed is not None and changed.record()["ended"] == [0, 1000.0]
    assert book.settle(("exp", "job"), 0, all_ended=True) is None  # known: nothing to persist again
    wall.now += 5  # within the sink's grace: a late process may still join (the step book decides)
    assert isinstance(book.resolve("exp", {**of("job"), attr.RANK: 3}), Resolved)
    wall.now += 5
    for late in (of("job"), {**of("job"), attr.RANK: 7}, {**of("job"), attr.SERVICE_INSTANCE_ID: "new"}):
        refused = book.resolve("exp", late)
        assert (
            isinstance(refused, Refused)
            and refused.kind == "ended"
            and "ended (every process said goodbye)" in (refused.reason)
        )
    requeued = book.resolve("exp", of("job", attempt=10_000))  # a Slurm requeue of its own scope opens it again
    assert isinstance(requeued, Resolved) and requeued.changed is not None and requeued.changed.ended is None
    restored = Run.restored({**changed.record(), "ended": [10_000, 1010.0]}, attempt=10_000, last_seen=1010.0)
    assert restored.ended == (10_000, 1010.0) and restored.owner == ""  # persisted with the run's meta


def test_a_resume_whose_attempt_would_pass_2_31_minus_1_is_refused_with_a_reason() -> None:
    book = RunBook(wall=Wall())
    book.resolve("exp", of("a", attempt=2**31 - 2))
    first = book.resolve("exp", of("b", resume="a"))
    assert isinstance(first, Resolved) and first.attempt == 2**31 - 1
    for launch in ("c", "d", "e"):
        refused = book.resolve("exp", of(launch, resume="a"))
        assert isinstance(refused, Refused) and "would pass 2147483647" in refused.reason
    restarted = book.resolve("exp", of("b", attempt=1, resume="a"))  # launch b restarted: past it too
    assert isinstance(restarted, Refused) and "past 2147483647" in restarted.reason
    run = book.get(("exp", "a"))
    assert run is not None and run.attempt == 2**31 - 1


def test_a_runs_record_is_a_snapshot_that_later_changes_do_not_touch() -> None:
    book = RunBook(wall=Wall())
    book.resolve("exp", of("a"))
    resumed = book.resolve("exp", of("c", resume="a"))
    assert isinstance(resumed, Resolved) and resumed.changed is not None
    record = resumed.changed.record()
    book.resolve("exp", of("d", resume="a"))  # another launch maps onto it while the first record is written
    assert record["launches"] == {"c": 1} and resumed.changed.record()["version"] > record["version"]


def test_a_runs_first_step_is_held_to_the_step_window() -> None:
    e = StepBook("x", BookConfig(grace=5, step_window=1000), clock=Clock())
    far = send(e, resource("p0"), 10**18, 1.0)
    assert far.count == 2 and "more than 1000 ahead of 0" in far.reasons[0]
    assert send(e, resource("p0"), 0, 1.0).count == 0 and [v.step for v in e.ready()] == [0]
    e.restore(5000, attempt=1)  # an earlier attempt finalized step 5000: a resume starts within reach of it
    assert send(e, {**resource("p1"), attr.EXPERIMENT_ATTEMPT: 2}, 5900, 1.0).count == 0


def test_a_scope_inventing_run_ids_pushes_out_its_own_runs_only() -> None:
    book = RunBook(max_runs=3, wall=Wall())
    book.resolve("exp", of("theirs"), scope="team-a")
    for name in "abcde":
        book.resolve("exp", of(name), scope="team-b")
    assert [r.run for r in book.runs("exp")] == ["theirs", "c", "d", "e"]
    again = book.resolve("exp", of("theirs", attempt=1), scope="team-b")  # its id was never free to take
    assert isinstance(again, Refused) and again.kind == "scope"


def test_a_retried_goodbye_of_a_finished_run_is_taken_and_nothing_else_of_it() -> None:
    """The run-ended check came before the retry's: a byte-identical retry of the request that ended
    the run was refused as "another launch reuses its id" once the grace was over. The run keeps
    the digests of the goodbyes it took (in its record too: a restarted sink knows them)."""
    from rankscope.sink.testing import Retried

    wall = Wall()
    book = RunBook(linger=10.0, wall=wall)
    book.resolve("exp", of("job"))
    bye, other = b"\x01" * 16, b"\x02" * 16
    changed = book.settle(("exp", "job"), 0, all_ended=True, goodbye=bye)
    assert changed is not None and changed.record()["goodbyes"] == [bye.hex()]
    assert book.settle(("exp", "job"), 0, all_ended=True, goodbye=bye) is None  # known
    wall.now += 10
    assert book.resolve("exp", of("job"), digest=bye) == Retried(("exp", "job"))
    for digest in (other, b""):
        refused = book.resolve("exp", of("job"), digest=digest)
        assert isinstance(refused, Refused) and "another launch reuses its id" in refused.reason
    assert isinstance(book.resolve("exp", of("job"), "another-scope", digest=bye), Refused)  # its scope's only

    restored = RunBook(linger=10.0, wall=wall)
    restored.add(Run.restored(changed.record(), attempt=0, last_seen=1000.0))
    assert restored.resolve("exp", of("job"), digest=bye) == Retried(("exp", "job"))
    said = [f"{i:032x}" for i in range(40)] + ["not hex", 7]
    assert Run.restored({**changed.record(), "goodbyes": said}, 0, 0.0).goodbyes == said[24:40]  # the newest 16
