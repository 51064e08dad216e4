"""The step book's parts, each alone: its rules, the roster, step windows, admission, the step
table and its late updates, and finalize."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from rankscope.core import names as attr
from rankscope.core.anomalies import Corrected, NonFinite, Partial
from rankscope.otlp.markers import Marker, Ranks
from rankscope.sink import BookConfig
from rankscope.sink.testing import (
    HOT,
    MAX_CLOCK_SKEW_NS,
    Admission,
    Counts,
    ExperimentLimits,
    Finished,
    KeptFile,
    LateSteps,
    Refusals,
    ResourceBatch,
    Retained,
    Retention,
    Roster,
    StateRows,
    Step,
    StepTable,
    StepWindows,
    Thresholds,
    TraceStore,
    Watch,
    merge_rows,
    view_of,
)


def resource(pid: str, rank: int = 0, world: int = 1, attempt: int = 0, role: str = "trainer") -> dict[str, Any]:
    return {
        attr.SERVICE_INSTANCE_ID: pid,
        attr.ROLE: role,
        attr.RANK: str(rank),
        attr.WORLD_SIZE: str(world),
        attr.EXPERIMENT_ATTEMPT: attempt,
    }


# -- the book's rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("grace", -1.0),
        ("grace", math.nan),
        ("start_hold", math.inf),
        ("late_interval", "1"),
        ("time_bucket", 0),
        ("time_bucket_lag", True),
        ("retain_seconds", math.nan),
        ("retain_bytes", -1),
        ("step_window", 1.5),
        ("limits", None),
        ("detectors", {}),
    ],
)
def test_a_book_config_refuses_a_bad_value_and_names_its_field(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"book config: {name} must be"):
        BookConfig(**{name: value})


def test_a_book_config_is_frozen_and_keyword_only() -> None:
    config = BookConfig(grace=2.0, step_window=0, retain_seconds=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.grace = 3.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        BookConfig(2.0)  # type: ignore[misc]


# -- roster ---------------------------------------------------------------------------------


def test_the_roster_waits_for_live_laggards_and_empty_rank_slots_then_gives_up_on_them_once() -> None:
    roster = Roster()
    r0 = roster.process_for(resource("a", rank=0, world=3))
    r1 = roster.process_for(resource("b", rank=1, world=3))
    assert r0 is not None and r1 is not None
    assert roster.absent(0) == []  # nobody steps yet: nothing to wait for
    roster.marked(r0, 0)
    assert [label for label, _ in roster.absent(0)] == ["trainer_r1", "trainer_r2"]  # a laggard, an empty slot
    roster.marked(r1, 0)
    assert [label for label, _ in roster.absent(0)] == ["trainer_r2"]
    version = roster.version
    roster.give_up(roster.absent(0))
    assert roster.version > version
    assert roster.absent(1) == [("trainer_r0", r0), ("trainer_r1", r1)]  # rank 2's slot is not waited for again
    assert roster.away(1) == ["trainer_r2"]  # but a step without it still counts it missing
    roster.give_up(roster.absent(1))
    assert roster.absent(2) == [] and not r0.live
    assert roster.away(2) == ["trainer_r0", "trainer_r1", "trainer_r2"]
    roster.marked(r1, 2)  # it came back: waited for again
    assert roster.absent(3) == [("trainer_r1", r1)]
    assert roster.away(2) == ["trainer_r0", "trainer_r2"] and roster.away(3) == ["trainer_r0", "trainer_r2"]


def test_a_higher_attempt_retires_the_earlier_attempts_processes_and_a_full_roster_refuses() -> None:
    roster = Roster(max_processes=2)
    old = roster.process_for(resource("a", attempt=0))
    assert old is not None
    roster.marked(old, 5)
    new = roster.process_for(resource("b", attempt=1))
    assert new is not None and roster.attempt == 1 and not old.live
    assert roster.absent(6) == []  # the old attempt's process is not waited for
    assert roster.process_for(resource("c")) is None  # max_processes
    assert roster.counts() == (2, 0)


def test_two_live_processes_claiming_one_slot_get_distinct_labels() -> None:
    roster = Roster()
    first = roster.process_for({**resource("a"), attr.PROCESS_PID: 11})
    second = roster.process_for({**resource("b"), attr.PROCESS_PID: 22})
    assert first is not None and second is not None
    assert (first.label, second.label) == ("trainer_r0", "trainer_r0_22")


def test_a_new_attempts_process_takes_its_rank_label_from_the_attempt_it_retires() -> None:
    """Attempt 1's rank 0 arriving first of its attempt, while attempt 0's rank 0 is still live: the
    per-rank views name it ``trainer_r0`` (not ``trainer_r0_<pid>``); a late process of attempt 0
    arriving after gets the suffix instead."""
    roster = Roster()
    old = roster.process_for({**resource("a", world=2), attr.PROCESS_PID: 11})
    assert old is not None and old.live
    new = roster.process_for({**resource("b", world=2, attempt=1), attr.PROCESS_PID: 33})
    assert new is not None and (new.label, roster.attempt, old.live) == ("trainer_r0", 1, False)
    late = roster.process_for({**resource("c", world=2), attr.PROCESS_PID: 44})
    assert late is not None and late.label == "trainer_r0_44"


# -- step windows ---------------------------------------------------------------------------


class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_step_windows_place_stepless_data_by_time_and_never_go_back() -> None:
    wall = Wall(1000.0)
    windows = StepWindows(wall=wall)
    s = 10**9
    windows.close(0, 100 * s)
    windows.close(1, 200 * s)
    windows.close(2, 150 * s)  # a clock that went back: the window still ends at 200 s
    windows.close(1, 300 * s)  # a second close of a step changes nothing
    at = {"stepping": True, "open_step": None, "last_finalized": -1}
    assert windows.step_at(50 * s, **at) == 0
    assert windows.step_at(100 * s, **at) == 0
    assert windows.step_at(150 * s, **at) == 1
    assert windows.step_at(200 * s, **at) == 1
    assert windows.step_at(201 * s, **at) == 3  # newer than every window: the step after the newest
    assert windows.duration(1) == 100.0 and windows.duration(0) is None
    far = int(wall.now * 1e9) + MAX_CLOCK_SKEW_NS + s
    assert windows.clamped(far) == int(wall.now * 1e9)  # a clock far ahead counts as now


def test_a_runs_first_window_starts_when_its_closer_began() -> None:
    """The first step's time: from when the step began for the process that closed it first (its
    marker's start), kept through the write-ahead log's record."""
    windows = StepWindows(wall=Wall(1000.0))
    s = 10**9
    windows.close(3, 100 * s, 40 * s)  # a run resumed at step 3, whose closer began at 40 s
    windows.close(4, 130 * s, 100 * s)
    assert windows.duration(3) == 60.0 and windows.duration(4) == 30.0
    assert windows.from_start(3) and not windows.from_start(4)
    windows.clear()  # a restarted run: its first window again
    windows.close(0, 200 * s, 250 * s)  # a start after its end is not believed
    assert windows.duration(0) is None
    windows.clear()
    windows.close(0, 200 * s)
    assert windows.duration(0) is None  # a closer that did not say when it began (an older client)
    for marker in (
        Marker(0, 0, False, 5, None, 3),
        Marker(0, 0, False, 5, Ranks("trainer", None, 4, ((0, 3),)), 3),
        Marker(0, 0, False, 5, Ranks("trainer", None, 4, ((0, 3),))),
        Marker(0, 2, True, 5),
    ):
        assert Marker.of_record(marker.record()) == marker
    assert Marker.of_record((7, 0, False)) == Marker(7, 0, False)  # a record from before times


def test_time_buckets_count_from_the_first_and_give_way_to_steps() -> None:
    wall = Wall(1000.0)
    windows = StepWindows(time_bucket=2.0, time_bucket_lag=1.0, wall=wall)
    at = {"stepping": False, "open_step": None, "last_finalized": -1}
    s = 10**9
    assert windows.step_at(1000 * s, **at) == 0 and windows.bucketed
    assert windows.step_at(1003 * s, **at) == 1
    assert windows.bucket_start(1) == 1002.0
    assert windows.bucket_due(0, now=50.0) == 50.0 + (1002.0 + 1.0 - 1000.0)  # on the caller's clock
    assert windows.stop_bucketing() and not windows.bucketed and not windows.stop_bucketing()


# -- admission ------------------------------------------------------------------------------


def rows(reduce: str, step: int, *keys: str) -> StateRows:
    return StateRows(reduce, step, list(keys), [(1.0,) for _ in keys])


def test_admission_holds_keys_per_step_one_reduce_per_key_and_late_points() -> None:
    admission = Admission(ExperimentLimits(max_keys_per_step=3, max_late_points_per_step=2))
    refused = Refusals()
    merged: dict[str, Any] = {}
    merge_rows(merged, "sum", ["a"], [(1.0,)], 0, "r0")
    kept = admission.states(5, [rows("sum", 5, "a", "b", "c", "d"), rows("count", 5, "a")], merged, None, refused)
    assert [r.keys for r in kept] == [["a", "b", "c"]]
    assert refused.count == 2
    assert "step 5 has 3 keys (limit)" in refused.reasons[0] and "recorded as SUM and as COUNT" in refused.reasons[1]
    late = Refusals()
    kept = admission.states(5, [rows("sum", 5, "a", "b", "c")], merged, 1, late)  # one late point held already
    assert [r.keys for r in kept] == [["a"]] and late.count == 2 and "late points (limit)" in late.reasons[0]
    assert admission.late_rows(5, 4, 1, late) == 1 and late.count == 5


def test_admission_counts_log_records_per_step_and_forgets_the_lowest_steps_first() -> None:
    admission = Admission(ExperimentLimits(max_logs_per_step=2))
    refused = Refusals()
    assert [admission.log_record(7, refused) for _ in range(3)] == [True, True, False]
    assert refused.count == 1 and "step 7 has 2 (limit)" in refused.reasons[0]
    for step in range(10_000):
        admission.log_record(step + 100, refused)
    assert admission.log_record(10_099, refused) is True  # a recent step keeps its count
    assert admission.log_record(10_099, refused) is False


# -- the step table and its late updates -------------------------------------------------------


def test_late_updates_are_taken_in_order_at_most_once_per_interval() -> None:
    late = LateSteps(interval=1.0, now=0.0)
    assert late.deadline() is None and late.take(5.0) == []
    late.bucket(7, kept_nothing, now=0.5)
    retained = late.bucket(3, kept_nothing, now=0.5)
    assert late.bucket(3, kept_nothing, now=0.6) is retained  # one pending update per step
    assert late.take(0.9) == [] and late.deadline() == 1.0
    assert [bucket.step for bucket in late.take(1.0)] == [3, 7] and late.deadline() is None
    late.bucket(3, kept_nothing, now=1.2)
    assert late.take(1.5) == [] and [bucket.step for bucket in late.take(1.5, force=True)] == [3]


def kept_nothing(step: int, now: float) -> None:
    return None


def test_the_step_table_keeps_finalized_steps_merges_late_data_into_them_and_drops_all_on_restart() -> None:
    counts = Counts()
    admission = Admission(ExperimentLimits())
    retained = Retained(max_bytes=1 << 20, max_seconds=60.0)
    steps = StepTable(retained=retained, step_window=40, late_interval=1.0, admission=admission, counts=counts, now=0.0)
    p0 = Roster().process_for(resource("a"))
    assert p0 is not None
    refused = Refusals()
    last = HOT + 1

    def part(step: int) -> ResourceBatch:
        return ResourceBatch("x", {}, states=[rows("sum", step, "n")])

    for step in range(last + 1):
        parts, settled = steps.place(part(step), part(step).states, refused, lambda t: 0)
        assert list(parts) == [step] and settled == []
        assert steps.merge(p0, step, parts[step], seq=step + 1, now=0.0, refused=refused) == 1
    assert steps.place(part(41), part(41).states, refused, lambda t: 0) == ({}, [])
    assert "more than 40 ahead of 0" in refused.reasons[0]
    assert not any(steps.close(step, [p0.label] * (step == 1), now=float(step))[1] for step in range(last + 1))
    assert list(retained.hot) == list(range(2, last + 1)) and list(retained.packed) == [0, 1]  # the oldest packed
    steps.merge(p0, 1, part(1), seq=30, now=20.0, refused=refused)
    steps.merge(p0, last, part(last), seq=31, now=20.0, refused=refused)
    one, newest = steps.late.pending[1], steps.late.pending[last]
    assert one.whole and one.merged["n"][1] == 2.0  # a packed step read back: what came in time and late
    assert newest.whole and newest.merged["n"][1] == 2.0 and last not in retained  # out while pending
    assert one.missing == [] and one.arrived == [p0.label]  # finalized without it, it came late
    assert counts.late_points == 2 and steps.room(1) == (one.merged, 1) and not steps.settled
    retained.expire(now=61.0)  # step 0, finalized at 0, is past the window
    steps.merge(p0, 0, part(0), seq=32, now=61.0, refused=refused)
    assert not steps.late.pending[0].whole and steps.late.pending[0].opened == 61.0  # partial: late data alone
    steps.merge(p0, last + 1, part(last + 1), seq=33, now=61.0, refused=refused)
    assert steps.restart() == 1 and steps.settled and steps.last_finalized == -1 and steps.frontier == last
    assert retained.bytes == 0 and not retained.hot
    steps.merge(p0, 1, part(1), seq=34, now=62.0, refused=refused)
    assert steps.close(1, [], now=62.0) == (retained.hot[1], True)  # at or below a step finalized before: a rewind


def test_the_window_lets_go_of_the_oldest_packed_steps_past_its_bytes_and_the_sinks() -> None:
    """Past its bytes a run lets go of its oldest packed steps; past the bytes all runs share, of
    its own oldest, and a step that still finds no room is not kept: each counted in ``unkept``."""
    sink_wide = Retention(max_bytes=1 << 20)

    def step(n: int, keys: int = 50) -> Step:
        merged = {f"key/{k}": ["sum", float(n * 1000 + k) / 7.0] for k in range(keys)}
        return Step(n, 0.0, merged=merged)

    one = Retained(max_bytes=4000, max_seconds=600.0, retention=sink_wide)
    for n in range(HOT + 10):
        one.keep(step(n), now=float(n))
    sizes = [len(blob) for _, blob in one.packed.values()]  # about alike: compressed floats differ a little
    size = sizes[0]
    assert one.bytes == sum(sizes) <= 4000 < one.bytes + 2 * max(sizes) and one.unkept == 10 - len(one.packed)
    assert sink_wide.held == one.bytes
    assert list(one.packed) == list(range(10 - len(one.packed), 10))  # the newest packed ones kept
    other = Retained(max_bytes=1 << 20, max_seconds=600.0, retention=Retention(max_bytes=size * 2 + 64))
    for n in range(HOT + 3):
        other.keep(step(n), now=float(n))
    assert list(other.packed) == [1, 2] and other.unkept == 1  # the sink's bytes: two steps
    thawed = one.take(9, now=30.0)
    assert thawed is not None and thawed.merged == step(9).merged and 9 not in one
    assert sink_wide.held == one.bytes
    one.clear()
    assert sink_wide.held == 0 and one.bytes == 0
    none = Retained(max_bytes=1 << 20, max_seconds=0.0)
    none.keep(step(1), now=0.0)
    assert 1 not in none  # a window of 0 s keeps nothing: every late update is partial


# -- finalize -------------------------------------------------------------------------------


def test_view_of_reduces_names_the_extremes_holder_and_flags_nonfinite_values_without_acting() -> None:
    roster = Roster()
    p0, p1 = roster.process_for(resource("a", 0, 2)), roster.process_for(resource("b", 1, 2))
    assert p0 is not None and p1 is not None
    merged: dict[str, Any] = {}
    parts = []
    for process, loss, peak in ((p0, 1.0, 3.0), (p1, math.nan, 5.0)):
        mean, peak_rows = (
            StateRows("mean", 4, ["loss"], [(1, loss)]),
            StateRows("max", 4, ["peak"], [(peak, None, None)]),
        )
        for r in (mean, peak_rows):
            merge_rows(merged, r.reduce, r.keys, r.rows, process.rank, process.label)
            parts.append((process, r))
    watch = Watch(Thresholds())
    done = Finished(experiment="x", step=4, seq=9, merged=merged, parts=parts, samples={}, missing=["trainer_r2"])
    view = view_of(done, traces=TraceStore(), watch=watch)
    values = {m.key: m.value for m in view.global_metrics}
    assert math.isnan(values["loss"]) and values["peak"] == 5.0
    assert values["peak/argmax_rank"] == 1.0 and view.labels["peak/argmax_rank"] == "trainer_r1"
    assert values[attr.NONFINITE_VALUES] == 1.0 and values[attr.MISSING_PROCESSES] == 1.0
    nonfinite = [a for a in view.anomalies if isinstance(a, NonFinite)]
    assert nonfinite and nonfinite[0].process == "trainer_r1" and nonfinite[0].key == "loss"
    assert view.stragglers == [] and view.seq == 9
    assert {p.label: [m.value for m in ms if m.key == "peak"] for p, ms in view.per_process.items()} == {
        "trainer_r0": [3.0],
        "trainer_r1": [5.0],
    }
    late = view_of(Finished(**{**_fields(done), "late": True}), traces=TraceStore(), watch=watch)
    values = {m.key: m.value for m in late.global_metrics}  # still lacking trainer_r2: counted, no record
    assert values[attr.MISSING_PROCESSES] == 1.0 and values["peak"] == 5.0 and late.anomalies == []
    arrived = {**_fields(done), "late": True, "arrived": ["trainer_r2"], "missing": []}
    corrected = view_of(Finished(**arrived), traces=TraceStore(), watch=watch)
    assert {m.key: m.value for m in corrected.global_metrics}[attr.MISSING_PROCESSES] == 0.0
    assert corrected.anomalies == [Corrected(step=4, processes=("trainer_r2",), count=1, missing=0)]
    partial = view_of(Finished(**{**arrived, "partial": True}), traces=TraceStore(), watch=watch)
    assert partial.global_metrics == [] and len(partial.per_process) == 2  # each process's own values still
    assert partial.anomalies == [Partial(step=4, processes=("trainer_r2",), count=1, points=4)]


def _fields(done: Finished) -> dict[str, Any]:
    return {name: getattr(done, name) for name in Finished.__slots__}  # type: ignore[attr-defined]


def test_kept_steps_on_disk_are_read_back_whole_by_a_restarted_sink(tmp_path) -> None:
    """Each step kept goes to the run's ``kept.log``; a new ``Retained`` (a restarted sink) reads
    back those within the window, the last record of a step winning, and stops at a torn record."""
    file = KeptFile(tmp_path / "kept.log")
    wall = Wall(1000.0)
    first = Retained(max_bytes=1 << 20, max_seconds=100.0)
    first.attach(file, now=0.0, wall=wall)

    def step(n: int, value: float, now: float) -> Step:
        made = Step(n, now, merged={"n": ["sum", value]}, seq=n + 1)
        made.finalized, made.missing = now, ["trainer_r1"]
        return made

    for n in range(HOT + 4):
        wall.now = 1000.0 + n
        first.keep(step(n, float(n), now=float(n)), now=float(n))
    wall.now = 1030.0
    first.keep(step(2, 102.0, now=2.0), now=30.0)  # step 2 again, after a late update: the later record wins
    wall.now = 1000.0 + 50.0
    again = Retained(max_bytes=1 << 20, max_seconds=100.0)
    again.attach(KeptFile(tmp_path / "kept.log"), now=7.0, wall=wall)  # another process's monotonic clock
    assert sorted(again.packed) == list(range(HOT + 4)) and not again.hot
    two = again.take(2, now=7.0)
    assert two is not None and two.merged == {"n": ["sum", 102.0]} and two.seq == 3 and two.missing == ["trainer_r1"]
    assert not two.tables  # its sample tables were not kept
    wall.now = 1000.0 + 104.5  # steps 0 to 4, finalized at 0 to 4 (Unix 1000 to 1004), are past the window
    later = Retained(max_bytes=1 << 20, max_seconds=100.0)
    later.attach(KeptFile(tmp_path / "kept.log"), now=0.0, wall=wall)
    assert min(later.packed) == 5
    with open(tmp_path / "kept.log", "ab") as out:  # a SIGKILL mid-append
        out.write(b"\x40\x00\x00\x00torn")
    assert sorted(KeptFile(tmp_path / "kept.log").read()) == list(range(HOT + 4))
    later.clear()
    assert not (tmp_path / "kept.log").exists()


def test_a_kept_file_is_rewritten_once_it_holds_twice_what_is_kept(tmp_path) -> None:
    file = KeptFile(tmp_path / "kept.log")
    kept = Retained(max_bytes=1 << 30, max_seconds=1e9)
    kept.attach(file, now=0.0)
    big = {f"k{k}": ["sum", float(k) * 1.37] for k in range(5000)}
    for n in range(40):  # the same step kept again and again: the file grows, what is kept does not
        made = Step(0, 0.0, merged=dict(big), seq=n + 1)
        kept.keep(made, now=float(n))
        assert kept.take(0, now=float(n)) is made
    kept.keep(made, now=40.0)
    assert file.size <= 2 * len(kept._blobs[0]) + (1 << 20) + file.size // 40 and len(file.read()) == 1
